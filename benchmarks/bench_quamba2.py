"""Quamba2 against its baselines on trained reference Mamba2 and Mamba models, plus a Mamba2 with injected outliers.

    python benchmarks/bench_quamba2.py [--models ref:mamba2-bench ref:mamba-bench] [--max-tokens 16384] [--quick]

Rows per model: FP; W8A8 and W4A8 with the naive recipe (per-tensor static scales everywhere, RTN weights), the
quamba1 recipe (Hadamard, percentile x, per-tensor B/C, GPTQ) and the quamba2 recipe (sort-and-cluster x,
per-SSD-group B/C; Mamba2 only); W4A16 as Quamba2 (Hadamard + GPTQ g128), RTN g128 and bitsandbytes NF4. Figures:
held-out perplexity (standard-library code), stored weight bytes against the FP model's (fp32) files, the quantized
layers against their fp16 size, CPU decode tokens/s (one thread, batch 1). The quantized mixers run the exact sequential scan with
fake-quant points on the CPU, so their decode rate is not a speed claim; the int8 linears are timed separately
(``linear_timing``: FP32 matmul vs the W8A8 int8 matmul vs the W4A8 integer reference, in_proj shape).

The outlier rows: the same Mamba2 with ``--outlier-channels`` x channels per layer whose conv weights and bias are
multiplied by ``--outlier-factor`` (persistent per-channel outliers, as in large SSMs), then fine-tuned
``--outlier-steps`` steps so the model works with them (its own FP perplexity is their reference).
Writes benchmarks/results/quamba2_<model>.json and .md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, markdown, run_pipeline, timed, write  # noqa: E402


def configs(arch: str, quick: bool) -> list[tuple[str, str, dict]]:
    skip = ["lm_head", "dt_proj"]  # transformers' Mamba1 reads dt_proj.weight directly
    rows = [("fp", "-", {})]
    recipes = ["naive", "quamba1"] + (["quamba2"] if arch == "mamba2" else [])
    for bits in (["w4a8"] if quick else ["w8a8", "w4a8"]):
        rows += [("quamba2", f"{bits} {r}", {"bits": bits, "recipe": r}) for r in recipes]
    rows.append(("quamba2", f"w4a8 {recipes[-1]} + int4 embedding", {"bits": "w4a8", "recipe": recipes[-1],
                                                                     "quantize_embedding": True}))
    rows.append(("quamba2", "w4a16 hadamard+gptq", {"bits": "w4a16"}))
    if not quick:
        rows.append(("quamba2", "w4a16 hadamard+gptq, lm_head fp", {"bits": "w4a16", "quantize_lm_head": False}))
        rows.append(("rtn", "w4a16 g128", {"bits": "w4a16", "group_size": 128, "skip": skip}))
        rows.append(("bnb", "w4a16 nf4", {"bits": "w4a16", "quant_type": "nf4", "skip": skip}))
    return rows


def inject_outliers(model_name: str, channels: int, factor: float, steps: int, out_dir: Path) -> tuple[str, dict]:
    """A copy of a Mamba2 whose x channels ``channels`` per layer come out of the conv ``factor`` times larger, then
    fine-tuned ``steps`` steps on the reference corpus so that the rest of the model adapts to them. Returns the
    saved folder and the outlier strength (max / median channel mean |x|) before and after the fine-tune."""
    from dataclasses import replace

    import torch

    from llmx.core import models, zoo
    from llmx.core.data import join_documents
    from llmx.core.zoo.request import parse_builtin
    from llmx.core.zoo.train import pretrain

    model, tok = models.load(model_name)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.backbone.layers:
            m = layer.mixer
            idx = torch.randperm(m.intermediate_size, generator=gen)[:channels]
            m.conv1d.weight[idx] *= factor
            m.conv1d.bias[idx] *= factor
    strength = {"injected": outlier_strength(model, tok)}
    req = parse_builtin(model_name.removeprefix("ref:"))
    spec, corp = req.spec, zoo.corpus(req)
    torch.set_num_threads(1)
    pretrain(model, join_documents(tok, corp.train), join_documents(tok, corp.validation),
             replace(spec, lr=spec.lr / 4, warmup=10), seed=1, steps=steps)
    strength["after_finetune"] = outlier_strength(model, tok)
    meta = {"source": model_name, "method": f"outliers x{factor:g} on {channels} ch, fine-tuned {steps} steps"}
    return str(models.save(model, tok, out_dir, meta)), strength


def outlier_strength(model, tok) -> float:
    """Max over layers of (max / median) of the per-channel mean |x| (x after the conv) on a few windows."""
    import copy

    import torch

    from llmx.core.data import random_windows
    from llmx.plugins.quamba2.mixers import convert
    from llmx.plugins.quamba2.points import Observer

    probe = copy.deepcopy(model)
    observers = []
    for m in convert(probe):
        m.points["x"] = Observer()
        observers.append(m.points["x"])
    with torch.no_grad():
        probe(input_ids=random_windows(tok, "stdlib", 4, 256, seed=3))
    return max(float(o.meanabs.max() / o.meanabs.median()) for o in observers)


def linear_timing(model_name: str) -> dict:
    """Microseconds per call (median) of one in_proj-shaped layer: FP32, W8A8 (int8 matmul) and W4A8 (integer
    reference)."""
    import torch

    from llmx.core import models
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    torch.set_num_threads(1)
    lin = models.load(model_name)[0].backbone.layers[0].mixer.in_proj
    layers = {"fp32": lin}
    for label, fmt in (("w8a8", IntFormat(8, 0)), ("w4a8", IntFormat(4, 128))):
        layers[label] = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act_bits=8, act_scale=0.05)
    out = {"shape": list(lin.weight.shape)}
    for m in (1, 256):
        x = torch.randn(m, lin.in_features)
        for label, layer in layers.items():
            with torch.no_grad():
                out[f"{label}_tokens{m}_us"] = 1e6 * timed(layer, x, repeats=50)
    return out


def fp_file_bytes(model: str) -> int:
    """Bytes of the FP model's weight files (a ``ref:`` model's cache folder, or a saved folder)."""
    from llmx.core import zoo
    from llmx.core.models.storage import weight_file_bytes

    folder = zoo.locate(model) if model.startswith("ref:") else Path(model)
    return weight_file_bytes(folder)


def bench(model: str, label: str, arch: str, args) -> list[dict]:
    evals = [{"method": "perplexity", "params": {"max_tokens": args.max_tokens, "seq_len": 256, "stride": 128}},
             {"method": "speed", "params": {"prompt_len": 64, "new_tokens": 16, "repeats": 2}}]
    calib = {"calib_samples": args.calib_samples, "calib_seq_len": 256}
    rows, fp_bytes = [], fp_file_bytes(model)
    for method, fmt, params in configs(arch, args.quick):
        if method == "quamba2":
            params = {**params, **calib}
        quant = [] if method == "fp" else [{"method": method, "params": params}]
        metrics = run_pipeline(model, quant + evals, threads=1)
        q = metrics[0] if quant else {}
        ppl, speed = metrics[-2], metrics[-1]
        rows.append({"model": label, "method": method, "format": fmt, "perplexity": ppl["perplexity"],
                     "stored_weight_bytes": q.get("stored_weight_bytes", fp_bytes),
                     "vs_fp32_files": q.get("stored_weight_bytes", fp_bytes) / fp_bytes,
                     "quantized_vs_fp16": q.get("quantized_bytes_vs_fp16"),
                     "decode_tok_s": speed["decode_tokens_per_s"]})
        print(rows[-1], flush=True)
    for r in rows:
        r["ppl_increase_pct"] = 100 * (r["perplexity"] / rows[0]["perplexity"] - 1)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ref:mamba2-bench", "ref:mamba-bench"])
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--outlier-channels", type=int, default=6)
    ap.add_argument("--outlier-factor", type=float, default=25.0)
    ap.add_argument("--outlier-steps", type=int, default=150, help="Fine-tune steps after the injection.")
    ap.add_argument("--quick", action="store_true", help="A few rows only (a smoke run of this script).")
    args = ap.parse_args()
    from llmx.core.models import load

    for model in args.models:
        arch = load(model)[0].config.model_type
        rows, extra = bench(model, model, arch, args), {}
        if arch == "mamba2":
            with tempfile.TemporaryDirectory() as tmp:
                injected, strength = inject_outliers(model, args.outlier_channels, args.outlier_factor,
                                                     args.outlier_steps, Path(tmp) / "m")
                label = f"{model} + outliers ({args.outlier_channels} ch x{args.outlier_factor:g}, {args.outlier_steps} steps)"
                rows += bench(injected, label, arch, args)
            extra["outlier_strength"] = {"reference": outlier_strength(*load(model)), **strength}
        name = f"quamba2_{model.replace(':', '_')}"
        columns = ["model", "method", "format", "perplexity", "ppl_increase_pct", "stored_weight_bytes",
                   "vs_fp32_files", "quantized_vs_fp16", "decode_tok_s"]
        timing = linear_timing(model)
        write(name, {"benchmark": "quamba2", "model": model, "eval_tokens": args.max_tokens,
                     "calib_tokens": args.calib_samples * 256, "machine": machine(), "rows": rows, "linear_timing": timing,
                     **extra})
        (RESULTS / f"{name}.md").write_text(markdown(columns, rows) + "\n\nlinear timing (us/call): "
                                            + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                                        for k, v in timing.items()) + "\n")
        print((RESULTS / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
