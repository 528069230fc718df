"""Reference zoo: build time and held-out perplexity of each preset, and two domains told apart.

    python benchmarks/bench_zoo.py presets --preset small --arch llama qwen2 gpt2 mamba2   # -> zoo_small.json
    python benchmarks/bench_zoo.py presets --preset long --arch llama                      # -> zoo_long.json
    python benchmarks/bench_zoo.py domains                                                 # -> zoo_domains.json
    python benchmarks/bench_zoo.py domains --preset medium --domains stdlib   # -> zoo_domains_medium.json
    python benchmarks/bench_zoo.py                     # both for the small preset, sharing one cache (make bench)

``presets`` builds each model in a fresh cache (or ``--cache DIR``), so the time includes reading the corpus, training
the BPE tokenizer, training and the final held-out evaluation, all on one thread. ``domains`` builds the small llama
on ``stdlib`` (code) and on ``pydoc`` (prose) and scores each model on both held-out sets. Perplexity per token
depends on the tokenizer (each model has its own), so the cross-domain figures are bits per UTF-8 byte of the scored
text, which any two models share.

Script only: build time and the quality of the reference models themselves, no method judged against a baseline.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, data_label, machine, markdown, write  # noqa: E402

FIGURES = ("name", "arch", "preset", "params", "vocab", "seq_len", "steps_run", "best_step", "tokens_seen",
           "train_seconds", "build_wall_seconds", "val_perplexity", "unigram_perplexity", "val_bits_per_byte",
           "val_tokens_scored")


def build(req, cache: str) -> dict:
    os.environ["LLMX_CACHE_DIR"] = cache
    from llmx.core import zoo

    t0 = time.perf_counter()
    path, built = zoo.provide(req, show_progress=False)
    info = zoo.info(path)
    info["build_wall_seconds"] = round(time.perf_counter() - t0, 1) if built else None
    info["seq_len"] = info["preset_spec"]["seq_len"]
    info["path"] = str(path)
    return info


def presets(args) -> None:
    from llmx.core.zoo.request import RefRequest

    rows = []
    for arch in args.arch:
        with tempfile.TemporaryDirectory() as fresh:
            info = build(RefRequest(arch, args.preset, data=args.data), args.cache or fresh)
        rows.append({k: info.get(k) for k in FIGURES})
        print(rows[-1], flush=True)
    name = f"zoo_{args.preset}" + ("" if args.data == "stdlib" else f"_on_{data_label(args.data)}")
    write(name, {"benchmark": "zoo", "preset": args.preset, "corpus": f"{args.data} (its validation split)",
                 "machine": machine(), "rows": rows})
    (RESULTS / f"{name}.md").write_text(markdown(list(FIGURES), rows) + "\n")


def bits_per_byte(model, tok, docs: list[str], seq_len: int) -> dict:
    """Sliding-window NLL of ``docs`` in bits per byte of the text they encode (an end-of-document token counted
    as one byte)."""
    import torch

    from llmx.core.data import join_documents
    from llmx.core.eval.lm import scored_bytes, sequence_nll

    ids = join_documents(tok, docs)
    with torch.inference_mode():
        total, count = sequence_nll(model, ids, seq_len, seq_len // 2, batch_size=16)
    text_bytes = scored_bytes(tok, ids)
    return {"bits_per_byte": total / math.log(2) / text_bytes, "perplexity": math.exp(total / count),
            "tokens": count, "bytes": text_bytes}


def domains(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmx.core.data import documents
    from llmx.core.zoo.corpus import cap
    from llmx.core.zoo.request import RefRequest

    torch.set_num_threads(1)
    held = {d: cap(documents(d, "validation"), args.max_chars) for d in args.domains}  # the same text for each model
    rows = []
    with tempfile.TemporaryDirectory() as fresh:
        for data in args.domains:
            info = build(RefRequest(args.arch, args.preset, data=data), args.cache or fresh)
            model = AutoModelForCausalLM.from_pretrained(info["path"]).eval()
            tok = AutoTokenizer.from_pretrained(info["path"])
            row = {"trained_on": data, **{k: info.get(k) for k in ("params", "train_seconds", "build_wall_seconds",
                                                                   "steps_run", "best_step", "val_perplexity",
                                                                   "unigram_perplexity")},
                   "train_tokens": info["corpus"]["train_tokens"]}
            for other in args.domains:
                scored = bits_per_byte(model, tok, held[other], info["seq_len"])
                row[f"bpb_on_{other}"] = scored["bits_per_byte"]
                row[f"ppl_on_{other}"] = scored["perplexity"]
            rows.append(row)
            print(row, flush=True)
    name = "zoo_domains" if args.preset == "small" else f"zoo_domains_{args.preset}"
    write(name, {"benchmark": "zoo domains", "arch": args.arch, "preset": args.preset,
                          "held_out_chars": {d: sum(map(len, v)) for d, v in held.items()}, "machine": machine(), "rows": rows,
                          "note": "bpb: bits per UTF-8 byte of the held-out text (tokenizer-independent); ppl: per "
                                  "token of the model's own tokenizer"})
    cols = ["trained_on", "params", "train_seconds", "val_perplexity", "unigram_perplexity",
            *[f"bpb_on_{d}" for d in args.domains]]
    (RESULTS / f"{name}.md").write_text(markdown(cols, rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what")
    p = sub.add_parser("presets")
    p.add_argument("--arch", nargs="+", default=["llama", "qwen2", "gpt2", "mamba2"])
    p.add_argument("--preset", default="small")
    p.add_argument("--data", default="stdlib", help="The corpus every preset trains on (a .txt/.jsonl file, pydoc, ...).")
    p.add_argument("--cache", help="Build into this cache (reused by a later `domains`) instead of a fresh one.")
    d = sub.add_parser("domains")
    d.add_argument("--arch", default="llama")
    d.add_argument("--preset", default="small")
    d.add_argument("--domains", nargs="+", default=["stdlib", "pydoc"])
    d.add_argument("--max-chars", type=int, default=60_000, help="Held-out text scored per domain (whole documents).")
    d.add_argument("--cache")
    args = ap.parse_args()
    if args.what is None:
        with tempfile.TemporaryDirectory() as cache:
            presets(p.parse_args(["--cache", cache]))
            domains(d.parse_args(["--cache", cache]))
    else:
        (presets if args.what == "presets" else domains)(args)


if __name__ == "__main__":
    main()
