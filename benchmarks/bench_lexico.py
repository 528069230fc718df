"""Lexico against KIVI and the full cache at 1k and 2k contexts, same exact-token buffer for every method, on a
reference Llama trained on 2048-token windows: KV memory (stored, with the dictionaries per sequence and amortised,
measured peak), quality (next-token accuracy on the text, recall of an early passage, KL, perplexity) and
milliseconds per decode step; the
dictionaries' error on held-out and foreign text (OMP throughput: bench_lexico_omp.py).

    python benchmarks/bench_lexico.py [--contexts 1024 1984] [--buffers 128 32] [--sparsities 4 8 16]

The model (``ref:llama-2k``: the long preset at 2048 tokens, 300 steps) is built on first use. It runs in bfloat16,
so the full cache is a 16-bit cache, measured like the others. Lexico's dictionaries (1024 atoms, one per sparsity
as in the official code) are learned on the train split at 2048 tokens; the decode rows attend over the codes
(``attention=codes``) and compress 32 tokens at a time (the official approximation_length). KIVI uses 32-token key
groups and 32-channel value groups. Writes benchmarks/results/lexico.json and .md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown, run_pipeline, write  # noqa: E402

MODEL = "ref:llama-2k"
BUILD = ["zoo", "build", "llama", "--preset", "long", "--seq-len", "2048", "--steps", "300", "--name", "llama-2k"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", nargs="+", type=int, default=[1024, 1984])
    ap.add_argument("--buffers", nargs="+", type=int, default=[128, 32])
    ap.add_argument("--sparsities", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--atoms", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000, help="dictionary training steps")
    ap.add_argument("--lr", type=float, default=5e-3, help="dictionary learning rate (cosine-annealed)")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "llmx", *BUILD], check=True, stdout=subprocess.DEVNULL)
    run = {"threads": 1, "dtype": "bfloat16"}
    rows, dictionaries, errors = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in args.sparsities:
            m = run_pipeline(MODEL, [{"method": "lexico", "stage": "train",
                                      "params": {"atoms": args.atoms, "sparsity": s, "steps": args.steps, "lr": args.lr,
                                                 "windows": 16, "seq_len": 2048, "held_out_windows": 4,
                                                 "transfer_data": "pydoc"}}], output_dir=tmp, **run)[0]
            dictionaries[s] = m["dictionary"]
            errors[s] = {k: round(v, 4) for k, v in m.items() if k.endswith("rel_error")}
            print(s, errors[s], flush=True)
        for context in args.contexts:
            for buffer in args.buffers:
                evalp = {"windows": args.windows, "context_len": context, "continuation_len": 64,
                         "generate_tokens": 16, "recall_tokens": 16, "recall_cue": 32, "buffer_length": buffer,
                         "chunk": 32}
                configs = [("kivi", {"bits": 2}), ("kivi", {"bits": 4})]
                configs += [("lexico", {"dictionary": dictionaries[s], "sparsity": s}) for s in args.sparsities]
                for method, params in configs:
                    m = run_pipeline(MODEL, [{"method": method, "stage": "decode", "params": {**evalp, **params}}],
                                     **run)[0]
                    m["buffer"] = buffer
                    rows.append(m)
                    print({k: m[k] for k in ("method", "context_len", "buffer", "kv_memory_fraction",
                                             "kv_peak_fraction", "kl_to_full", "recall_accuracy", "ms_per_step",
                                             "ms_per_step_full_cache")}, flush=True)
    full = [{"method": "full cache", "context_len": r["context_len"], "buffer": r["buffer"], "kv_memory_fraction": 1.0,
             "kv_memory_fraction_with_dictionaries": 1.0, "kv_memory_fraction_amortised": 1.0,
             "kv_peak_fraction": r["kv_peak_fraction_full_cache"],
             "kv_peak_fraction_amortised": r["kv_peak_fraction_full_cache"], "kl_to_full": 0.0,
             "next_token_accuracy": r["next_token_accuracy_full_cache"],
             "recall_accuracy": r["recall_accuracy_full_cache"], "perplexity": r["perplexity_full_cache"],
             "ms_per_step": r["ms_per_step_full_cache"]} for r in rows if r["method"] == "kivi 2-bit"]
    columns = ["context_len", "buffer", "method", "kv_memory_fraction", "kv_memory_fraction_with_dictionaries",
               "kv_memory_fraction_amortised", "kv_peak_fraction", "kv_peak_fraction_amortised", "kl_to_full",
               "next_token_accuracy",
               "recall_accuracy", "perplexity", "ms_per_step"]
    table = markdown(columns, sorted(full + rows, key=lambda r: (r["context_len"], -r["buffer"],
                                                                 -r["kv_memory_fraction"])))
    write("lexico", {"benchmark": "lexico", "model": MODEL, "atoms": args.atoms, "dictionary_errors": errors,
                     "machine": machine(), "rows": rows})
    err_rows = [{"sparsity": s, **{k.replace("_rel_error", ""): v for k, v in e.items()
                                   if k.startswith(("layer0", "transfer_layer0"))}} for s, e in errors.items()]
    (Path(__file__).resolve().parent / "results" / "lexico.md").write_text(
        table + "\n\nDictionary relative error on held-out vectors (layer 0; transfer_: pydoc text, dictionaries "
        "learned on stdlib code):\n\n" + markdown(list(err_rows[0]), err_rows) + "\n")
    print(table)


if __name__ == "__main__":
    main()
