"""``llmx analyze --method overtraining``: read the series, check its checkpoints share one architecture and
tokenizer, then per checkpoint L_pre, Gaussian sensitivity and fine-tuning degradation, and the turning points."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core import models
from llmx.core.context import RunContext
from llmx.errors import UsageError
from llmx.plugins.overtraining import noise, series, turning
from llmx.plugins.overtraining.config import OvertrainingParams
from llmx.plugins.overtraining.finetune import degradation


def _entries(ctx: RunContext, p: OvertrainingParams) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if p.checkpoints:
        return series.from_list(p.checkpoints)
    if p.series:
        return series.from_manifest(p.series)
    earlier = sorted((ctx.run_dir / "artifacts").glob("*/series/manifest.json"))
    return series.from_manifest(str(earlier[-1])) if earlier else ([], {})


def shape(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(t.shape) for n, t in model.named_parameters()}


def check_same(first: tuple[str, Any, Any], other: tuple[str, Any, Any]) -> None:
    """Checkpoints of one run: the same parameter names and shapes, and the same vocabulary."""
    (a, ma, ta), (b, mb, tb) = first, other
    if type(ma).__name__ != type(mb).__name__ or shape(ma) != shape(mb):
        raise UsageError(f"overtraining: {b} has another architecture than {a} ({type(mb).__name__}, "
                         f"{sum(t.numel() for t in mb.parameters())} parameters); compare checkpoints of one run")
    if ta.get_vocab() != tb.get_vocab():
        raise UsageError(f"overtraining: {b} has another tokenizer vocabulary than {a}; compare checkpoints of one run")


def run(ctx: RunContext, p: OvertrainingParams) -> dict[str, Any]:
    from llmx.core.data import fixed_windows, token_stream
    from llmx.core.eval.lm import mean_nll
    from llmx.core.train.lm.data import TokenWindows

    entries, info = _entries(ctx, p)
    entries = series.checked(entries, info)
    device, splitting = ctx.device, ctx.config.data.splitting

    def load(path: str) -> tuple[Any, Any]:
        return models.load(path, dtype="float32", device=device)

    first = (entries[0]["path"], *load(entries[0]["path"]))
    for e in entries[1:]:
        check_same(first, (e["path"], *load(e["path"])))
    model0, tok = first[1], first[2]
    n_params = sum(t.numel() for t in model0.parameters())
    init_std = p.init_std or getattr(model0.config, "initializer_range", None)
    if p.noise_scale == "init_std" and init_std is None:
        raise UsageError("overtraining: the config has no initializer_range; set init_std")
    del model0

    data = p.data or info.get("data", {}).get("source") or ctx.config.data.source
    seq = p.seq_len or info.get("seq_len") or 128
    held = fixed_windows(token_stream(tok, data, "validation", 8 * p.eval_windows * seq, splitting), seq,
                         p.eval_windows)
    f = p.finetune
    if f.lrs:
        t_held = fixed_windows(token_stream(tok, f.data, "validation", 8 * f.eval_windows * f.seq_len, splitting),
                               f.seq_len, f.eval_windows)
        t_stream = token_stream(tok, f.data, "train", f.max_tokens, splitting)
    corpus = info.get("data", {}).get("tokens")
    points, sens, tuned_rows, ft = [], [], [], []
    for e in ctx.progress(entries, total=len(entries), description="checkpoints"):
        model, _ = load(e["path"])
        l_pre, rows = noise.sensitivity(model, lambda m=model: mean_nll(m, held), p.gammas, p.draws,
                                        ctx.config.seed, p.noise_scale, p.perturb, init_std or 0.0)
        points.append({"T": e["tokens"], "step": e["step"], "lr": e["lr"], "annealed": e["annealed"],
                       "tokens_per_param": e["tokens"] / n_params,
                       "epochs": e["tokens"] / corpus if corpus else None, "L_pre": l_pre})
        sens += [{"T": e["tokens"], **r} for r in rows]
        if f.lrs:
            ft += [{"T": e["tokens"], **r} for r in degradation(
                model, lambda m: mean_nll(m, held), lambda m: mean_nll(m, t_held),
                lambda seed: TokenWindows(t_stream, f.seq_len, seed), f, l_pre)]
        del model
    tokens = [e["tokens"] for e in entries]
    if len(f.lrs) > 1 and ft:
        tuned_rows = turning.tuned(ft)
    out: dict[str, Any] = {
        "checkpoints": points, "sensitivity": sens, "finetune": ft, "finetune_tuned": tuned_rows,
        "turning_points": turning.turning_points(tokens, sens, ft)
        + turning.turning_points(tokens, [], [{**r, "lr": "tuned"} for r in tuned_rows]),
        "n_checkpoints": len(entries), "params": n_params, "pre_data": data, "seq_len": seq, "init_std": init_std,
        "max_tokens_per_param": max(tokens) / n_params, "schedule": info.get("schedule"),
        "finetune_data": f.data if f.lrs else None}
    note = series.schedule_note(info, entries)
    if note:
        ctx.log.warning("overtraining: %s", note)
        out["schedule_note"] = note
    return out
