"""Reference zoo: build time and validation perplexity against the unigram floor, from a clean cache.

    python benchmarks/bench_zoo.py [--arch llama mamba2] [--preset small]

Writes benchmarks/results/zoo.json. Each model is built in a fresh temporary cache, so the time includes reading the
corpus, training the BPE tokenizer, training and the final held-out evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["llama", "mamba2"])
    ap.add_argument("--preset", default="small")
    args = ap.parse_args()
    rows = []
    for arch in args.arch:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["LLMX_CACHE_DIR"] = cache
            from llmx.core import zoo

            t0 = time.perf_counter()
            path = zoo.build(zoo.RefRequest(arch, args.preset), show_progress=False)
            info = zoo.info(path)
            info["build_wall_seconds"] = round(time.perf_counter() - t0, 1)
        rows.append({k: info[k] for k in ("name", "preset", "params", "vocab", "steps_run", "best_step", "train_seconds",
                                          "build_wall_seconds", "val_perplexity", "unigram_perplexity", "val_tokens_scored")})
        print(json.dumps(rows[-1]))
    RESULTS.mkdir(exist_ok=True)
    out = {"benchmark": "zoo", "corpus": "stdlib (held-out files)", "machine": {"cpus": os.cpu_count(),
           "platform": platform.platform()}, "rows": rows}
    (RESULTS / f"zoo_{args.preset}.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
