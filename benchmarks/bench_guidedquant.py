"""GuidedQuant and LNQ against RTN, GPTQ, SqueezeLLM and NF4 on trained reference models, at 2, 3 and 4 bits.

Kept as a script: the 11-method ablation at three widths, KL to FP and the layer objectives each method minimised (a
comparison pairs one metric per item); the seeded, judged comparison is ``llmx compare guidedquant --seeds 1 2 3``
(2 bits; 3 bits: ``--set '*.bits=w3a16'``).

    python benchmarks/bench_guidedquant.py [--models ref:llama-bench ref:opt-bench] [--data stdlib] [--calib 128] [--quick]
    python benchmarks/bench_guidedquant.py --bits w2a16 --seeds 1 2 3 --only LNQ "LNQ + GQ g=4" "GPTQ g64" "GPTQ g64 + GQ g=4"

Per model and bit width: perplexity increase over FP and KL(FP || quantized) on 16k held-out tokens of ``--data``
(non-overlapping windows of 128, the models' trained context), bits per weight as stored (scales, zero points and codebooks
included), the summed layer objectives each method minimised (its own Hessian: X X^T or the guided H_g), and
minutes. Calibration: ``--calib`` windows of 128 training tokens, the same for every method. RTN and GPTQ use
groups of 128 (their bits count the fp16 scales), and GPTQ also groups that match LNQ's bits per weight (64, 32, 16
at 2, 3, 4 bits); LNQ and SqueezeLLM one fp16 codebook per row. GPTQ + GQ propagates through the quantized blocks
and LNQ's Hessians come from FP inputs, as in the official code. Writes
benchmarks/results/guidedquant.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    add_target_args,
    data_config,
    file_label,
    heldout_scores,
    heldout_windows,
    publish,
    result_name,
    splitting,
    targets,
)

SEQ = 128


MATCHED = {"w2a16": 64, "w3a16": 32, "w4a16": 16}  # GPTQ groups whose bits per weight meet LNQ's fp16 codebooks


def methods(bits: str) -> list[tuple[str, str, dict]]:
    g = MATCHED[bits]
    return [
        ("RTN g128", "rtn", {"group_size": 128}),
        ("GPTQ g128", "gptq", {"group_size": 128}),
        ("GPTQ g128 asym", "gptq", {"group_size": 128, "symmetric": False}),
        ("GPTQ g128 (propagate fp)", "gptq", {"group_size": 128, "propagate": "fp"}),
        ("GPTQ g128 + GQ g=1", "guidedquant", {"backend": "gptq", "num_groups": 1, "group_size": 128}),
        ("GPTQ g128 + GQ g=4", "guidedquant", {"backend": "gptq", "num_groups": 4, "group_size": 128}),
        (f"GPTQ g{g}", "gptq", {"group_size": g}),
        (f"GPTQ g{g} + GQ g=4", "guidedquant", {"backend": "gptq", "num_groups": 4, "group_size": g}),
        ("SqueezeLLM", "guidedquant", {"backend": "squeezellm", "guided": False}),
        ("LNQ", "guidedquant", {"backend": "lnq", "guided": False}),
        ("LNQ + GQ g=4", "guidedquant", {"backend": "lnq", "num_groups": 4}),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:llama-bench", "ref:opt-bench"], seeds=[0])
    ap.add_argument("--calib", type=int, default=128, help="Calibration windows of 128 tokens.")
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--bits", nargs="+", default=["w2a16", "w3a16", "w4a16"])
    ap.add_argument("--only", nargs="+", help="Method labels to run (default: all).")
    ap.add_argument("--quick", action="store_true", help="2 bits, 8 windows, 2k tokens (a smoke run).")
    args = ap.parse_args()
    import llmx

    torch.set_num_threads(1)
    if args.quick:
        args.calib, args.max_tokens, args.bits = 8, 2048, ["w2a16"]
    rows = []
    for name, path in targets(args):
        base, tok = llmx.load(path)
        base.eval()
        windows = heldout_windows(tok, args.max_tokens, SEQ, args.data, splitting(args))
        fp, fp_logp = heldout_scores(base, windows)
        rows.append({"model": name, "bits": "-", "method": "FP", "seed": None, "ppl_increase": 0.0, "kl": 0.0,
                     "perplexity": fp["perplexity"], "bits_per_weight": 32, "objective": None, "objective_kind": None,
                     "minutes": None})
        todo = [(b, *m) for b in args.bits for m in methods(b)] + [("w4a16", "bnb NF4 b64", "bnb", {"quant_type": "nf4"})]
        todo = [(seed, *t) for seed in args.seeds for t in todo if not args.only or t[1] in args.only]
        for seed, bits, label, method, params in todo:
            t0 = time.perf_counter()
            calib = {} if method == "bnb" else {"calib_samples": args.calib, "calib_seq_len": SEQ}
            model, m = llmx.quantize(copy.deepcopy(base), tokenizer=tok, method=method, bits=bits, save=False,
                                     seed=seed, data=data_config(args), **calib, **params)
            minutes = (time.perf_counter() - t0) / 60
            s, _ = heldout_scores(model.eval(), windows, fp_logp)
            stored = m.get("bits_per_weight") or 8 * m["quantized_bytes"] / m["quantized_params"]
            rows.append({"model": name, "bits": bits, "method": label, "seed": seed,
                         "ppl_increase": s["perplexity"] - fp["perplexity"],
                         "kl": s["kl"], "perplexity": s["perplexity"], "bits_per_weight": stored,
                         "objective": m.get("objective_stored"), "objective_kind": m.get("objective_kind"),
                         "minutes": round(minutes, 2)})
            print(rows[-1], flush=True)
    suffix = "_quick" if args.quick else "_seeds" if len(args.seeds) > 1 else ""
    if len(args.models) == 1 and suffix == "_seeds":
        suffix += "_" + file_label(args.models[0]).removeprefix("ref_")
    name = result_name("guidedquant" + suffix, args, names_model="_seeds_" in suffix)
    publish(name, rows, data=args.data, calib_windows=args.calib, seq_len=SEQ,
            tokens=args.max_tokens, seeds=args.seeds, split="validation")


if __name__ == "__main__":
    main()
