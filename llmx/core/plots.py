"""``llmx report --plot DIR``: the figures people look at, each as a PNG with the CSV it was drawn from beside it.

- ``pareto``: perplexity against weight bits, one panel per model (each evaluation takes the bits of the last
  quantization before it in its run; none before is FP, drawn at 16; a pruned or trained model is labelled by what
  changed it), with the front of points no other run on that model beats on both;
- ``loss``: training-loss curves from the ``metrics.jsonl`` of training stages;
- ``bars``: one bar per stage for a metric (default: the most common headline metric);
- ``series``: a checkpoint-series study (``analyze --method overtraining``): sensitivity S against tokens per gamma,
  and forgetting after fine-tuning against tokens per rate, one pair of panels per stage.

Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import csv
import importlib.util
import re
import statistics
from pathlib import Path
from typing import Any

from llmx.core.report import KEY_METRICS, StageRow, short_run
from llmx.errors import MissingRequirement, extra_hint

FP_BITS = 16
MAX_PANELS = 4  # models with the most points


def _pyplot():
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingRequirement("--plot needs matplotlib", hint=extra_hint("plot"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def weight_bits(bits: Any) -> int | None:
    m = re.match(r"w(\d+)", str(bits))
    return int(m.group(1)) if m else None


def pareto_points(rows: list[StageRow]) -> list[dict[str, Any]]:
    points, bits, method = [], {}, {}
    for r in rows:
        b = weight_bits(r.metrics.get("bits")) if r.stage == "quantize" else None
        if b is not None:
            bits[r.run], method[r.run] = b, r.method
        elif r.stage in ("prune", "train", "align"):  # another model than the FP one, at the same bits
            method[r.run] = f"{method[r.run]} + {r.method}" if r.run in method else f"{r.method} ({r.stage})"
        elif isinstance(r.metrics.get("perplexity"), (int, float)) and r.stage == "eval":
            points.append({"model": r.model, "run": short_run(r.run), "stage": r.label, "method": method.get(r.run, "fp"),
                           "weight_bits": bits.get(r.run, FP_BITS), "perplexity": r.metrics["perplexity"]})
    return points


def front(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other has both fewer bits and lower perplexity than (ties kept), by bits."""
    return sorted((p for p in points if not any(q["weight_bits"] <= p["weight_bits"] and q["perplexity"] < p["perplexity"]
                                                 or q["weight_bits"] < p["weight_bits"] and q["perplexity"] <= p["perplexity"]
                                                 for q in points)), key=lambda p: p["weight_bits"])


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[StageRow], folder: Path, metric: str | None = None) -> list[Path]:
    """Write every figure the rows can give into ``folder``; return the PNG paths."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    points = pareto_points(rows)
    if points:
        models = sorted({p["model"] for p in points}, key=lambda m: -sum(p["model"] == m for p in points))[:MAX_PANELS]
        fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
        table = []
        for ax, model in zip(axes[0], models, strict=True):
            mine = [p for p in points if p["model"] == model]
            for m in sorted({p["method"] for p in mine}):
                ax.scatter([p["weight_bits"] for p in mine if p["method"] == m],
                           [p["perplexity"] for p in mine if p["method"] == m], label=m, s=36)
            best = front(mine)
            ax.plot([p["weight_bits"] for p in best], [p["perplexity"] for p in best], "k--", lw=1, label="front")
            ax.set(xlabel=f"weight bits (FP = {FP_BITS})", ylabel="perplexity", title=model)
            ax.legend(fontsize=8)
            table += [{**p, "on_front": p in best} for p in mine]
        fig.suptitle("Perplexity against weight bits")
        written.append(_save(fig, plt, folder / "pareto.png"))
        _write_csv(folder / "pareto.csv", table)
    curves = [r for r in rows if r.curve and any("loss" in c for c in r.curve)]
    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        table = []
        for r in curves:
            steps = [c for c in r.curve if "loss" in c]
            ax.plot([c["step"] for c in steps], [c["loss"] for c in steps], label=f"{short_run(r.run)} {r.label}")
            table += [{"run": r.run, "stage": r.label, "step": c["step"], "loss": c["loss"]} for c in steps]
        ax.set(xlabel="step", ylabel="training loss", title="Training loss")
        ax.legend(fontsize=7)
        written.append(_save(fig, plt, folder / "loss.png"))
        _write_csv(folder / "loss.csv", table)
    studies = [r for r in rows if r.metrics.get("sensitivity") and r.metrics.get("checkpoints")]
    if studies:
        written.append(_series(plt, studies[:MAX_PANELS], folder))
    metric = metric or _common_metric(rows)
    bars = [r for r in rows if isinstance(r.metrics.get(metric), (int, float)) and not isinstance(r.metrics.get(metric), bool)]
    if bars:
        fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(bars) + 2), 4))
        labels = [f"{short_run(r.run).split(' ')[0]}\n{r.label}" for r in bars]
        ax.bar(range(len(bars)), [r.metrics[metric] for r in bars], color="tab:blue")
        ax.set_xticks(range(len(bars)), labels, rotation=60, ha="right", fontsize=7)
        ax.set(ylabel=metric, title=f"{metric} by stage")
        written.append(_save(fig, plt, folder / "bars.png"))
        _write_csv(folder / "bars.csv", [{"run": r.run, "stage": r.label, metric: r.metrics[metric]} for r in bars])
    return written


def _series(plt, rows: list[StageRow], folder: Path) -> Path:
    """Per overtraining study: the perturbed loss L_pre + S(T, gamma) (the notes' U-shape signature) and L_pre after
    fine-tuning per rate, each against L_pre itself; a turning point T* is starred."""
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.8 * len(rows)), squeeze=False)
    table = []
    for (left, right), r in zip(axes, rows, strict=True):
        m = r.metrics
        base = {c["T"]: c["L_pre"] for c in m["checkpoints"]}
        curves = [(left, "perturbed_loss", "gamma", g, [(x["T"], x["perturbed_loss"], x["S"])
                                                        for x in m["sensitivity"] if x["gamma"] == g])
                  for g in dict.fromkeys(x["gamma"] for x in m["sensitivity"])]
        ft = m.get("finetune") or []
        for lr in dict.fromkeys(x["lr"] for x in ft):
            ts = sorted({x["T"] for x in ft if x["lr"] == lr})
            after = [statistics.fmean(x["L_pre_after"] for x in ft if x["lr"] == lr and x["T"] == t) for t in ts]
            curves.append((right, "L_pre_after", "lr", lr, [(t, v, v - base[t]) for t, v in zip(ts, after,
                                                                                                  strict=True)]))
        stars = {(t["curve"], "gamma" if "gamma" in t else "lr", t.get("gamma", t.get("lr"))): t["T_star"]
                 for t in m.get("turning_points", []) if t["T_star"] is not None}
        for ax, curve, key, value, points in curves:
            line, = ax.plot([t for t, _, _ in points], [v for _, v, _ in points], "o-", label=f"{key} {value:g}")
            at = {t: v for t, v, _ in points}
            star = stars.get((curve, key, value))
            if star in at:
                ax.plot([star], [at[star]], "*", markersize=14, color=line.get_color())
            table += [{"run": r.run, "stage": r.label, "curve": curve, key: value, "T": t, "value": v,
                       "minus_L_pre": d} for t, v, d in points]
        for ax in (left, right):
            ax.plot(list(base), list(base.values()), "k--", label="L_pre")
            ax.legend(fontsize=8)
        table += [{"run": r.run, "stage": r.label, "curve": "L_pre", "T": t, "value": v, "minus_L_pre": 0.0}
                  for t, v in base.items()]
        left.set(xscale="log", xlabel="pre-training tokens T", ylabel="L_pre + S(T, gamma)",
                 title=f"{short_run(r.run)} {r.label}: perturbed loss")
        right.set(xscale="log", xlabel="pre-training tokens T", ylabel="L_pre after fine-tuning",
                  title="pre-training loss after fine-tuning")
    _write_csv(folder / "series.csv", table)
    return _save(fig, plt, folder / "series.png")


def _common_metric(rows: list[StageRow]) -> str:
    def numeric(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    counts = {k: sum(1 for r in rows if numeric(r.metrics.get(k))) for k in KEY_METRICS}
    return max(KEY_METRICS, key=lambda k: (counts[k], -KEY_METRICS.index(k)))


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
