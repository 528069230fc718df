"""CLOVER against its baselines on trained reference models: pruning without training, and fine-tuning at equal
trainable parameters.

    python benchmarks/bench_clover.py [--models ref:gpt2 ref:qwen2] [--data stdlib] [--steps 100] [--seeds 1 2 3]
    python benchmarks/bench_clover.py --only sweep        # recovery at every ratio -> clover_sweep_<model>.json/.md

Per model (NLL in nats on 16k held-out tokens of ``--data``, windows of 128 with stride 64):
- ``prune``: every pair the architecture allows (Q-K and V-O without RoPE, V-O with RoPE) at each ratio, by
  vanilla norm products, activation norms (16 windows of 128 tokens, one row per seed), CLOVER uniform and CLOVER
  global (no randomness: one row).
- ``qk`` (models without RoPE): Q-K pruning alone, the paper's GPT-2 curve; the vanilla ratio that costs what CLOVER
  costs at 45/64 (70%) is read off by linear interpolation.
- ``finetune``: two settings, (a) recovery after pruning 70% of the pairs (vanilla-pruned + raw cores, and on the
  CLOVER-pruned model raw cores, CLOVER cores, LoRA, PiSSA), (b) the unpruned model adapted to another corpus (pydoc),
  the same four tuners. Every tuner trains the same projections (the official scope: q or qk, vo, MLP up) for the same
  steps on the same windows, LoRA / PiSSA at the largest rank within the cores' parameter budget (alpha = 2r and the
  cores' dropout 0.05, as the official PiSSA script); each tuner's learning rate is picked from ``--lrs`` on
  the stage's 32 random held-out windows (seed 0; they may overlap the first 16k tokens the NLL is reported on; a
  best rate at the grid's edge extends the grid that way by sqrt(10), twice at most), then ``--seeds`` (fresh
  windows and order) give the mean and range.
- ``sweep``: recovery at every ratio, vanilla-pruned + raw cores against CLOVER-pruned + CLOVER cores, as above;
  "ahead" only where the seed ranges do not overlap.
Writes benchmarks/results/clover_<model>.json and .md (``--only``: clover_<sections>_<model>).

Not a comparison: ``llmx compare clover-prune`` (70% of the pairs, CLOVER against vanilla and activation-norm
pruning) and ``llmx compare clover-finetune`` (the transfer setting at the rates picked here, CLOVER cores against
LoRA and PiSSA) pair their perplexity windows; this script adds the ratio sweeps and the Q-K curve (a figure over
many ratios), the per-tuner learning-rate search and the recovery setting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS,
    add_target_args,
    data_config,
    file_label,
    machine,
    markdown,
    perplexity,
    result_name,
    run_pipeline,
    spread,
    targets,
    verdict,
    write,
)

TUNERS = {"raw cores": {"basis": "raw"}, "CLOVER cores": {}, "LoRA": {"tuner": "lora"}, "PiSSA": {"tuner": "pissa"}}
RECOVERY = [("vanilla", "raw cores"), ("clover", "raw cores"), ("clover", "CLOVER cores"), ("clover", "LoRA"),
            ("clover", "PiSSA")]  # (pruning criterion, tuner)
SWEEP = [("vanilla", "raw cores"), ("clover", "CLOVER cores")]


def ppl(tokens: int, source: str) -> dict:
    """Held-out NLL at the reference models' training context (128): longer windows reach learned positions that
    never trained, and flattening attention there would pass for a gain."""
    return perplexity(source, max_tokens=tokens)


def prune_stage(ratio: float, criterion: str = "clover", **params) -> dict:
    return {"method": "clover", "stage": "prune", "params": {"ratio": ratio, "criterion": criterion, "save": False,
                                                              **params}}


def interpolate(xs: list[float], ys: list[float], y: float) -> float | None:
    """The x where the piecewise-linear curve (xs ascending, ys rising) first reaches y."""
    points = list(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if y0 <= y <= y1:
            return x0 + (x1 - x0) * (y - y0) / (y1 - y0) if y1 > y0 else x0
    return None


def pruning(model: str, base: float, args) -> list[dict]:
    ratios, tokens, data, seeds = args.ratios, args.max_tokens, args.data, args.seeds
    rows = []
    for ratio in ratios:
        for label, criterion, mode in (("vanilla", "vanilla", "uniform"), ("activation", "activation", "uniform"),
                                       ("CLOVER", "clover", "uniform"), ("CLOVER global", "clover", "global")):
            for seed in seeds if criterion == "activation" else seeds[:1]:  # only activation norms calibrate
                prune, pruned = run_pipeline(model, [prune_stage(ratio, criterion, mode=mode), ppl(tokens, data)],
                                             threads=1, seed=seed, data=data_config(args))
                rows.append({"ratio": ratio, "criterion": label, "seed": seed if criterion == "activation" else None,
                             "targets": prune["targets"], "nll_increase": pruned["nll"] - base,
                             "params": prune["params_after"], "kv_bytes_per_token": prune["kv_bytes_per_token_after"]})
                print(rows[-1], flush=True)
    return rows


def qk_curve(model: str, base: float, args) -> tuple[list[dict], dict]:
    tokens, data = args.max_tokens, args.data
    ratios = [i / 64 for i in (5, 16, 32, 45, 56)]
    rows = []
    for criterion in ("vanilla", "clover"):
        for ratio in ratios:
            _, pruned = run_pipeline(model, [prune_stage(ratio, criterion, targets=["qk"]), ppl(tokens, data)],
                                     threads=1, data=data_config(args))
            rows.append({"qk_pruned": f"{round(ratio * 64)}/64", "criterion": criterion,
                         "nll_increase": pruned["nll"] - base})
            print(rows[-1], flush=True)
    vanilla = [r["nll_increase"] for r in rows if r["criterion"] == "vanilla"]
    clover_70 = next(r["nll_increase"] for r in rows if r["criterion"] == "clover" and r["qk_pruned"] == "45/64")
    match = interpolate([0.0] + ratios, [0.0] + vanilla, clover_70)
    return rows, {"clover_45_of_64": clover_70, "vanilla_ratio_at_same_cost": match}


def tune_run(model: str, stages: list[dict], params: dict, lr: float, seed: int, args,
             source: str) -> tuple[dict, float]:
    """The train stage's metrics and the NLL after it."""
    tune = {"method": "clover", "stage": "train", "params": {"steps": args.steps, "lr": lr, "save": False, **params}}
    out = run_pipeline(model, [*stages, tune, ppl(args.max_tokens, source)], threads=1, seed=seed,
                       data={**data_config(args), "source": source})
    return out[-2], out[-1]["nll"]


def finetune(model: str, setting: str, args, ratio: float = 0.7) -> list[dict]:
    """Tuner rows for one setting: ``recovery`` (every tuner after pruning ``ratio``), ``sweep`` (vanilla + raw cores
    and CLOVER + CLOVER cores after pruning ``ratio``) or ``transfer`` (unpruned, on ``--transfer-data``)."""
    source = args.transfer_data if setting == "transfer" else args.data
    plan = {"recovery": RECOVERY, "sweep": SWEEP, "transfer": [(None, t) for t in TUNERS]}[setting]
    rows = []
    for criterion, label in plan:
        stages, params = ([prune_stage(ratio, criterion)] if criterion else []), TUNERS[label]

        def trial(lr: float, seed: int = 0, stages=stages, params=params) -> tuple[dict, float]:
            return tune_run(model, stages, params, lr, seed, args, source)

        trials = {lr: trial(lr) for lr in args.lrs}
        lr = min(trials, key=lambda k: trials[k][0]["val_nll_after"])
        for _ in range(2):  # a best rate at the grid's edge: extend the grid that way (a factor sqrt(10)), twice at most
            edge = min(trials) if lr == min(trials) else max(trials) if lr == max(trials) else None
            if edge is None:
                break
            nxt = edge / 10 ** 0.5 if edge == min(trials) else edge * 10 ** 0.5
            trials[nxt] = trial(nxt)
            lr = min(trials, key=lambda k: trials[k][0]["val_nll_after"])
        runs = [trial(lr, seed) for seed in args.seeds]
        nlls = [nll for _, nll in runs]
        tune = runs[0][0]
        rows.append({"setting": setting, "pruned": f"{criterion} {ratio:.0%}" if criterion else "-", "ratio": ratio,
                     "tuner": label, "lr": lr, "lr_at_grid_edge": lr in (min(trials), max(trials)),
                     "trainable_params": tune["trainable_params"], "rank": tune.get("rank"),
                     "nll": statistics.mean(nlls), "nll_min": min(nlls), "nll_max": max(nlls), "nlls": nlls,
                     "seeds": args.seeds, "nll_before": runs[0][0]["val_nll_before"],
                     "lr_sweep": {str(k): v[0]["val_nll_after"] for k, v in trials.items()}})
        print(rows[-1], flush=True)
    return rows


def prune_summary(rows: list[dict]) -> list[dict]:
    """One row per ratio and criterion: the seeded activation-norm rows as their mean and range."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["ratio"], r["criterion"])
        out.setdefault(key, {**r, "values": []})["values"].append(r["nll_increase"])
    for r in out.values():
        s = spread(r.pop("values"))
        r.update(runs=s["n"], nll_increase=s["mean"], range=f"[{s['min']:+.4f}, {s['max']:+.4f}]" if s["n"] > 1 else None)
        r.pop("seed")
    return list(out.values())


def sweep_verdicts(rows: list[dict]) -> list[dict]:
    """Per ratio: CLOVER + CLOVER cores against vanilla + raw cores after the same fine-tune, over the seeds."""
    out = []
    for ratio in sorted({r["ratio"] for r in rows}):
        v = next(r for r in rows if r["ratio"] == ratio and r["pruned"].startswith("vanilla"))
        c = next(r for r in rows if r["ratio"] == ratio and r["pruned"].startswith("clover")
                 and r["tuner"] == "CLOVER cores")
        out.append({"ratio": ratio, "vanilla_nll": v["nll"], "vanilla_range": f"[{v['nll_min']:.4f}, {v['nll_max']:.4f}]",
                    "clover_nll": c["nll"], "clover_range": f"[{c['nll_min']:.4f}, {c['nll_max']:.4f}]",
                    "difference": c["nll"] - v["nll"],
                    "verdict": verdict(c["nlls"], v["nlls"], ("CLOVER", "vanilla"))})
    return out


SECTIONS = ("prune", "recovery", "sweep", "transfer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_target_args(ap, ["ref:gpt2", "ref:qwen2"], seeds=[1, 2, 3])
    ap.add_argument("--transfer-data", help="The other corpus of the transfer setting (default: pydoc; stdlib when "
                    "--data is pydoc).")
    ap.add_argument("--ratios", nargs="+", type=float, default=[0.25, 0.5, 0.7, 0.875])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lrs", nargs="+", type=float, default=[3e-4, 1e-3, 3e-3])
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--only", nargs="+", choices=SECTIONS, help="Sections to run (default: all).")
    args = ap.parse_args()
    only = args.only or list(SECTIONS)
    args.transfer_data = args.transfer_data or ("stdlib" if args.data == "pydoc" else "pydoc")
    for label, model in targets(args):
        base = run_pipeline(model, [ppl(args.max_tokens, args.data)], threads=1, data=data_config(args))[0]["nll"]
        base_other = run_pipeline(model, [ppl(args.max_tokens, args.transfer_data)], threads=1)[0]["nll"]
        prune_rows = pruning(model, base, args) if "prune" in only else []
        rope = prune_rows and "qk" not in prune_rows[0]["targets"]
        qk_rows, claim = ([], {}) if rope or not prune_rows else qk_curve(model, base, args)
        tune_rows = [r for s in ("recovery", "transfer") if s in only for r in finetune(model, s, args)]
        done = [{**r, "setting": "sweep"} for r in tune_rows if r["setting"] == "recovery" and (r["pruned"], r["tuner"])
                in (("vanilla 70%", "raw cores"), ("clover 70%", "CLOVER cores"))]  # the sweep's 70% pair, already run
        sweep_rows = [] if "sweep" not in only else sorted(
            [r for ratio in args.ratios if not (ratio == 0.7 and done) for r in finetune(model, "sweep", args, ratio)]
            + (done if 0.7 in args.ratios else []), key=lambda r: r["ratio"])
        verdicts = sweep_verdicts(sweep_rows) if sweep_rows else []
        stem = "clover" + ("" if args.only is None else "_" + "_".join(only))
        name = result_name(f"{stem}_{file_label(label)}", args, names_model=True)
        write(name, {"benchmark": "clover", "model": label, "model_path": model, "data": args.data,
                     "transfer_data": args.transfer_data, "base_nll": base, "base_nll_transfer": base_other,
                     "eval_tokens": args.max_tokens, "finetune_steps": args.steps, "lrs": args.lrs,
                     "seeds": args.seeds, "sections": only, "machine": machine(), "prune": prune_rows,
                     "prune_summary": prune_summary(prune_rows) if prune_rows else [], "qk": qk_rows,
                     "qk_claim": claim, "finetune": tune_rows, "sweep": sweep_rows, "sweep_verdicts": verdicts})
        parts = [f"{label}: base NLL {base:.4f} ({args.data}), {base_other:.4f} ({args.transfer_data})"]
        if prune_rows:
            parts += ["## Pruning without training (NLL increase; activation norms: mean [min, max] over seeds "
                      f"{args.seeds})", markdown(["ratio", "criterion", "runs", "targets", "nll_increase", "range",
                                                   "params", "kv_bytes_per_token"], prune_summary(prune_rows))]
        if qk_rows:
            parts += ["## Q-K pruning alone (the paper's GPT-2 curve)",
                      markdown(["qk_pruned", "criterion", "nll_increase"], qk_rows),
                      f"CLOVER at 45/64 costs {claim['clover_45_of_64']:+.4f}; vanilla costs as much at "
                      + (f"{claim['vanilla_ratio_at_same_cost'] * 64:.1f}/64"
                         if claim["vanilla_ratio_at_same_cost"] is not None else "no measured ratio")]
        columns = ["setting", "pruned", "tuner", "lr", "lr_at_grid_edge", "trainable_params", "rank", "nll", "nll_min",
                   "nll_max"]
        if tune_rows:
            parts += [f"## Fine-tuning, {args.steps} steps, equal trainable parameters (NLL, mean of seeds "
                      f"{args.seeds} [min, max] after the lr was picked on seed 0; recovery on {args.data} after "
                      f"pruning 70%, transfer on {args.transfer_data} unpruned)", markdown(columns, tune_rows)]
        if sweep_rows:
            parts += [f"## Recovery at every ratio ({args.steps} steps, seeds {args.seeds})",
                      markdown(columns, sweep_rows), markdown(list(verdicts[0]), verdicts)]
        (RESULTS / f"{name}.md").write_text("\n\n".join(parts) + "\n")
        print("\n\n".join(parts))


if __name__ == "__main__":
    main()
