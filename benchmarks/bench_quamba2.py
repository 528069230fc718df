"""Quamba2 against its baselines on trained reference Mamba2 and Mamba models, plus a Mamba2 with injected outliers.

    python benchmarks/bench_quamba2.py [--models ref:mamba2-bench ref:mamba-bench] [--data stdlib] [--seeds 0 1 2]
    python benchmarks/bench_quamba2.py --data notes.txt     # both presets trained on notes.txt, evaluated on it

Rows per model: FP; W8A8 and W4A8 with the naive recipe (per-tensor static scales everywhere, RTN weights), the
quamba1 recipe (Hadamard, percentile x, per-tensor B/C, GPTQ) and the quamba2 recipe (sort-and-cluster x,
per-SSD-group B/C; Mamba2 only); W4A16 as Quamba2 (Hadamard + GPTQ g128), RTN g128 and bitsandbytes NF4. Figures:
held-out perplexity (the CLI's defaults: 16k tokens, windows of 128 with stride 64; the models' trained context),
stored weight bytes against the FP model's (fp32) files, the quantized
layers against their fp16 size, CPU decode tokens/s (one thread, batch 1). The quantized mixers run the exact sequential scan with
fake-quant points on the CPU, so their decode rate is not a speed claim; the int8 linears are timed separately
(``linear_timing``: FP32 matmul vs the W8A8 int8 matmul vs the W4A8 integer reference, in_proj shape).
Every calibrated row (the ``quamba2`` method, all recipes) runs once per seed (its calibration windows); RTN and NF4
have no randomness and run once; decode speed is measured on the first seed.

The outlier rows: the same Mamba2 with ``--outlier-channels`` x channels per layer whose conv weights and bias are
multiplied by ``--outlier-factor`` (persistent per-channel outliers, as in large SSMs), then fine-tuned
``--outlier-steps`` steps so the model works with them (its own FP perplexity is their reference).
Writes benchmarks/results/quamba2_<model>.json and .md.

``--recipes-only`` is a thin call of ``llmx compare quamba2`` and ``llmx compare quamba2-w8a8`` (the naive /
quamba1 / quamba2 recipes at W4A8 and W8A8, paired per held-out window over ``--seeds``) on each Mamba2 of
``--models`` and on its outlier-injected copy. Run folders go to runs/compare/ (a rerun reuses the finished arms of
the given model; the outlier copy is rebuilt in a temporary folder each time), the results to
benchmarks/results/compare_<comparison>_<model>[_outliers].json, .md and .png. Mamba1 models are skipped there (no
SSD groups: its quamba2 recipe is quamba1). What stays a script, and why: the outlier injection and fine-tune (a
model the comparison then runs on), the int8 linear microbenchmark, decode tokens/s, the stored bytes on disk and the
W4A16 / RTN / NF4 / int4-embedding rows beside the recipes (other formats and a speed stage, not one paired metric).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    EVAL,
    RESULTS,
    add_target_args,
    data_config,
    file_label,
    machine,
    markdown,
    model_folder,
    perplexity,
    result_name,
    run_pipeline,
    splitting,
    spread,
    targets,
    timed,
    verdict,
    write,
)


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


def inject_outliers(model_name: str, preset_of: str, args, out_dir: Path) -> tuple[str, dict]:
    """A copy of a Mamba2 whose ``--outlier-channels`` x channels per layer come out of the conv ``--outlier-factor``
    times larger, then fine-tuned ``--outlier-steps`` steps on ``--data`` (with the training settings of the
    built-in ``preset_of``, or of ``ref:mamba2-bench`` for any other model) so that the rest of the model adapts to
    them. Returns the saved folder and the outlier strength (max / median channel mean |x|) before and after the
    fine-tune."""
    from dataclasses import replace

    import torch

    from llmx.core import models, zoo
    from llmx.core.data import join_documents
    from llmx.core.zoo.request import parse_builtin
    from llmx.core.zoo.train import pretrain

    model, tok = models.load(model_name)
    channels, factor, steps = args.outlier_channels, args.outlier_factor, args.outlier_steps
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.backbone.layers:
            m = layer.mixer
            idx = torch.randperm(m.intermediate_size, generator=gen)[:channels]
            m.conv1d.weight[idx] *= factor
            m.conv1d.bias[idx] *= factor
    strength = {"injected": outlier_strength(model, tok, args)}
    req = replace(parse_builtin(preset_of.removeprefix("ref:")) or parse_builtin("mamba2-bench"), data=args.data,
                  text_split=args.text_split, validation_percent=args.validation_percent)
    spec, corp = req.spec, zoo.corpus(req)
    torch.set_num_threads(1)
    pretrain(model, join_documents(tok, corp.train), join_documents(tok, corp.validation),
             replace(spec, lr=spec.lr / 4, warmup=10), seed=1, steps=steps)
    strength["after_finetune"] = outlier_strength(model, tok, args)
    meta = {"source": model_name, "method": f"outliers x{factor:g} on {channels} ch, fine-tuned {steps} steps"}
    return str(models.save(model, tok, out_dir, meta)), strength


def outlier_strength(model, tok, args) -> float:
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
        probe(input_ids=random_windows(tok, args.data, 4, 256, seed=3, splitting=splitting(args)))
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
    """Bytes of the FP model's weight files (a ``ref:`` model's cache folder, a saved folder or a cached hub id)."""
    from llmx.core.models.storage import weight_file_bytes

    return weight_file_bytes(model_folder(model))


def bench(model: str, label: str, arch: str, args) -> list[dict]:
    speed = {"method": "speed", "params": {"prompt_len": 64, "new_tokens": 16, "repeats": 2}}
    calib = {"calib_samples": args.calib_samples, "calib_seq_len": 256}
    rows, fp_bytes = [], fp_file_bytes(model)
    for method, fmt, params in configs(arch, args.quick):
        if method == "quamba2":
            params = {**params, **calib}
        for seed in args.seeds if method == "quamba2" else args.seeds[:1]:
            quant = [] if method == "fp" else [{"method": method, "params": params}]
            evals = [perplexity(max_tokens=args.max_tokens)] + ([speed] if seed == args.seeds[0] else [])
            metrics = run_pipeline(model, quant + evals, threads=1, seed=seed, data=data_config(args))
            q = metrics[0] if quant else {}
            ppl = metrics[len(quant)]
            rows.append({"model": label, "method": method, "format": fmt,
                         "seed": seed if method == "quamba2" else None, "perplexity": ppl["perplexity"],
                         "stored_weight_bytes": q.get("stored_weight_bytes", fp_bytes),
                         "vs_fp32_files": q.get("stored_weight_bytes", fp_bytes) / fp_bytes,
                         "quantized_vs_fp16": q.get("quantized_bytes_vs_fp16"),
                         "decode_tok_s": metrics[-1]["decode_tokens_per_s"] if len(metrics) > len(quant) + 1
                         else None})
            print(rows[-1], flush=True)
    for r in rows:
        r["ppl_increase_pct"] = 100 * (r["perplexity"] / rows[0]["perplexity"] - 1)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per model and format: the increase over seeds, and each recipe against the next weaker one judged against the
    seed ranges (quamba2 vs quamba1, quamba1 vs naive)."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["method"], r["format"]), []).append(r["ppl_increase_pct"])
    out = []
    for (model, method, fmt), values in groups.items():
        s = spread(values)
        row = {"model": model, "method": method, "format": fmt, "runs": s["n"], "increase_mean_pct": s["mean"],
               "increase_min_pct": s["min"], "increase_max_pct": s["max"], "vs_weaker_recipe": None}
        for strong, weak in (("quamba2", "quamba1"), ("quamba1", "naive")):
            if fmt.endswith(f" {strong}") and (model, method, fmt[: -len(strong)] + weak) in groups:
                other = groups[(model, method, fmt[: -len(strong)] + weak)]
                row["vs_weaker_recipe"] = f"vs {weak}: " + verdict(values, other, (strong, weak))
        out.append(row)
    return out


def compare(model: str, label: str, args) -> None:
    """``--recipes-only``: the two recipe comparisons through the comparison runner on ``model``."""
    import shutil
    from dataclasses import replace

    from llmx.core.compare import runner
    from llmx.core.plugins import host

    root = Path(__file__).resolve().parents[1] / "runs" / "compare"
    # --quick: the comparisons' own quick sizes
    sets = [] if args.quick else [f"*.calib_samples={args.calib_samples}", f"eval.max_tokens={args.max_tokens}"]
    for name in ("quamba2", "quamba2-w8a8"):
        stem = result_name(f"compare_{name}_{file_label(label)}", args, names_model=True)
        spec = host().comparison(name)
        spec = replace(spec, data={**spec.data, **data_config(args)})  # --data with its split
        p = runner.plan(spec, out=root / stem, model=model, seeds=args.seeds, quick=args.quick, sets=sets)
        runner.run(p, progress=False, say=print)
        RESULTS.mkdir(parents=True, exist_ok=True)
        for ext in ("json", "md", "png"):
            if (p.out / f"{runner.RESULT}.{ext}").is_file():
                shutil.copyfile(p.out / f"{runner.RESULT}.{ext}", RESULTS / f"{stem}.{ext}")
        print((RESULTS / f"{stem}.md").read_text())


def recipes_only(args) -> None:
    from llmx.core.models import load

    for (label, model), given in zip(targets(args), args.models, strict=True):
        if load(model)[0].config.model_type != "mamba2":
            print(f"{label}: skipped (the recipe comparisons run on Mamba2 models)")
            continue
        compare(model, label, args)
        with tempfile.TemporaryDirectory() as tmp:
            injected, _ = inject_outliers(model, given, args, Path(tmp) / "m")
            compare(injected, f"{label}_outliers", args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:mamba2-bench", "ref:mamba-bench"], seeds=[0, 1, 2])
    ap.add_argument("--max-tokens", type=int, default=EVAL["max_tokens"])
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--outlier-channels", type=int, default=6)
    ap.add_argument("--outlier-factor", type=float, default=25.0)
    ap.add_argument("--outlier-steps", type=int, default=150, help="Fine-tune steps after the injection.")
    ap.add_argument("--quick", action="store_true", help="A few rows only (a smoke run of this script).")
    ap.add_argument("--recipes-only", action="store_true", help="The naive / quamba1 / quamba2 recipes at W8A8 and "
                    "W4A8 only, as `llmx compare quamba2` and `quamba2-w8a8` (on each Mamba2 and its outlier copy).")
    args = ap.parse_args()
    from llmx.core.models import load

    if args.recipes_only:
        recipes_only(args)
        return

    for (label, model), given in zip(targets(args), args.models, strict=True):
        arch = load(model)[0].config.model_type
        rows, extra = bench(model, label, arch, args), {}
        if arch == "mamba2":
            with tempfile.TemporaryDirectory() as tmp:
                injected, strength = inject_outliers(model, given, args, Path(tmp) / "m")
                tag = f"{label} + outliers ({args.outlier_channels} ch x{args.outlier_factor:g}, {args.outlier_steps} steps)"
                rows += bench(injected, tag, arch, args)
            extra["outlier_strength"] = {"reference": outlier_strength(*load(model), args), **strength}
        name = result_name(f"quamba2_{file_label(label)}", args, names_model=True)
        columns = ["model", "method", "format", "seed", "perplexity", "ppl_increase_pct", "stored_weight_bytes",
                   "vs_fp32_files", "quantized_vs_fp16", "decode_tok_s"]
        summary = summarise(rows)
        timing = linear_timing(model)
        write(name, {"benchmark": "quamba2", "model": label, "model_path": model, "data": args.data,
                     "eval": {**EVAL, "max_tokens": args.max_tokens}, "seeds": args.seeds,
                     "calib_tokens": args.calib_samples * 256, "machine": machine(), "rows": rows, "summary": summary,
                     "linear_timing": timing, **extra})
        (RESULTS / f"{name}.md").write_text(
            f"{label} on {args.data}; calibration seeds {args.seeds}\n\n"
            + markdown(["model", "method", "format", "runs", "increase_mean_pct", "increase_min_pct",
                        "increase_max_pct", "vs_weaker_recipe"], summary)
            + "\n\nEvery run:\n\n" + markdown(columns, rows) + "\n\nlinear timing (us/call): "
            + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in timing.items()) + "\n")
        print((RESULTS / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
