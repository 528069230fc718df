"""BlockDialect against MXFP4, NVFP4, INT4 blocks and bitsandbytes on trained reference models, in one run.

Kept as a script: KL to FP and top-1 agreement, every tensor's relative MSE, the W4A16 and W4A4-linears settings, the
exhaustive-selection oracle and the bitsandbytes rows (a comparison pairs one metric per item under one setting); the
full-path W4A4 perplexity comparison is ``llmx compare blockdialect``.

    python benchmarks/bench_blockdialect.py [--models ref:llama-bench ref:opt-bench] [--data stdlib] [--quick]

For each model and format, at W4A16 (linears, weights only), W4A4 (linears, weights and inputs) and the full path
(W4A4 linears plus the attention QK^T and PV matmuls): perplexity increase over FP on 16k held-out tokens of
``--data`` (non-overlapping windows of the models' trained context, 128), KL(FP || quantized) per token, top-1
agreement with FP, the format's bits per element and the weight bits measured from the stored buffers, and relative
MSE of every linear's weight and of its input on the model's own activations (mean over layers). Formats: MXFP4
(b32, 4.25 bits; b16, 4.5 bits: matched to NVFP4), NVFP4 (b16, 4.5), INT4 absmax (b32, fp16 scale, 4.5),
BlockDialect (b32, 4.375) with two-stage activation selection (the lower error within the pair of the rounded max)
and with exhaustive selection (the selector's oracle); bitsandbytes FP4/NF4 (blocks of 32 and 64) weight-only rows,
their stored bits measured. Every format runs the same emulation (dequantize, float matmul) on the CPU.
Quantization here has no calibration and no randomness: one run is the whole distribution. Writes
benchmarks/results/blockdialect.json and .md.
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
    heldout_scores,
    heldout_windows,
    publish,
    result_name,
    splitting,
    targets,
)

SEQ = 128
SETTINGS = {"W4A16": ("linear",), "W4A4": ("linear",), "full path": ("linear", "attn_qk", "attn_pv")}


def formats():
    from llmx.core.quant import blockfp as bf
    from llmx.plugins.blockdialect import formatbook

    bd = bf.BlockFormat("blockdialect", formatbook.load("dialectfp4"), 32)
    return {  # name -> (weight format, activation format)
        "MXFP4 b32": (bf.mxfp4(), bf.mxfp4()),
        "MXFP4 b16": (bf.mxfp4(16), bf.mxfp4(16)),
        "NVFP4 b16": (bf.nvfp4(), bf.nvfp4()),
        "INT4 b32": (bf.int4(), bf.int4()),
        "BD two-stage (in-pair MSE)": (bd, bd.with_(select="two_stage")),
        "BD exhaustive": (bd, bd),
    }


@torch.no_grad()
def layer_inputs(model, windows: torch.Tensor) -> dict[str, torch.Tensor]:
    from llmx.core.models.linear import linear_layers

    layers, seen = linear_layers(model, ["lm_head"]), {}

    def keep(name):
        def hook(mod, args, out):
            seen[name] = args[0].reshape(-1, args[0].shape[-1])
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    model(windows[:4])
    for h in hooks:
        h.remove()
    return seen


def tensor_mse(model, inputs: dict[str, torch.Tensor], weight_fmt, act_fmt) -> dict[str, float]:
    from llmx.core.models.linear import linear_layers
    from llmx.core.quant import blockfp as bf

    def rel(x, fmt):
        return float(((x - bf.fake_quantize(x, fmt)) ** 2).sum() / (x**2).sum())

    layers = linear_layers(model, ["lm_head"])
    w = [rel(m.weight.detach(), weight_fmt) for m in layers.values()]
    a = [rel(inputs[n], act_fmt) for n in layers]
    return {"weight_rel_mse": sum(w) / len(w), "act_rel_mse": sum(a) / len(a)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:llama-bench", "ref:opt-bench"])
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--quick", action="store_true", help="MXFP4 and BD two-stage on 2k tokens (a smoke run).")
    args = ap.parse_args()
    import llmx
    from llmx.core.quant import blockapply

    torch.set_num_threads(1)
    fmts = formats()
    if args.quick:
        fmts = {k: fmts[k] for k in ("MXFP4 b32", "BD two-stage (in-pair MSE)")}
        args.max_tokens = 2048
    rows = []
    for name, path in targets(args):
        base, tok = llmx.load(path)
        base.eval()
        windows = heldout_windows(tok, args.max_tokens, SEQ, args.data, splitting(args))
        fp, fp_logp = heldout_scores(base, windows, None)
        inputs = layer_inputs(base, windows)
        rows.append({"model": name, "format": "FP", "setting": "-", "ppl_increase": 0.0, "kl": 0.0,
                     "top1_agreement": 1.0, "perplexity": fp["perplexity"], "format_bits": 32,
                     "stored_weight_bits": 32, "weight_rel_mse": 0.0, "act_rel_mse": 0.0, "seconds": None})
        for fmt_name, (wf, af) in fmts.items():
            mse = tensor_mse(base, inputs, wf, af)
            for setting, points in SETTINGS.items():
                if setting == "W4A16" and fmt_name == "BD exhaustive":
                    continue  # weights are exhaustive in both BD rows: W4A16 is the two-stage row
                model = copy.deepcopy(base)
                t0 = time.perf_counter()
                stats = blockapply.quantize_blocks_(model, wf, None if setting == "W4A16" else af, points)
                s, _ = heldout_scores(model, windows, fp_logp)
                rows.append({"model": name, "format": fmt_name, "setting": setting,
                             "ppl_increase": s["perplexity"] - fp["perplexity"], "kl": s["kl"],
                             "top1_agreement": s["top1_agreement"], "perplexity": s["perplexity"],
                             "format_bits": wf.bits, "stored_weight_bits": stats["weight_bits_per_element"],
                             **mse, "seconds": round(time.perf_counter() - t0, 1)})
                if setting == "W4A16":
                    rows[-1]["act_rel_mse"] = None  # activations stay in float there
                print(rows[-1], flush=True)
        for qt, block in (("fp4", 32), ("fp4", 64), ("nf4", 32), ("nf4", 64)):
            model, m = llmx.quantize(copy.deepcopy(base), tokenizer=tok, method="bnb", bits="w4a16", quant_type=qt,
                                     blocksize=block, save=False, data=data_config(args))
            s, _ = heldout_scores(model.eval(), windows, fp_logp)
            rows.append({"model": name, "format": f"bnb {qt} b{block}", "setting": "W4A16",
                         "ppl_increase": s["perplexity"] - fp["perplexity"], "kl": s["kl"],
                         "top1_agreement": s["top1_agreement"], "perplexity": s["perplexity"],
                         "stored_weight_bits": 8 * m["quantized_bytes"] / m["quantized_params"]})
            print(rows[-1], flush=True)
    publish(result_name("blockdialect" + ("_quick" if args.quick else ""), args), rows, data=args.data,
            tokens=args.max_tokens, seq_len=SEQ, split="validation")


if __name__ == "__main__":
    main()
