"""``llmx analyze --method overtraining``: read the series, check its checkpoints share one architecture and
tokenizer, then per checkpoint L_pre, Gaussian sensitivity and fine-tuning degradation, and the turning points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    earlier = sorted((ctx.run_dir / "artifacts").glob("*/series/manifest.json"), key=_stage_order)
    return series.from_manifest(str(earlier[-1])) if earlier else ([], {})


IGNORED = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}


def described(path: str) -> tuple[dict[str, Any], Any]:
    """A checkpoint's full config (defaults filled in, without the keys saving touches) and tokenizer: from its
    config.json when the folder has one (no weights loaded), else from the loaded model (an adapter folder)."""
    from transformers import AutoConfig, AutoTokenizer

    if (Path(path) / "config.json").is_file():
        models.check_manifest(Path(path))
        models.quiet_transformers()
        config = AutoConfig.from_pretrained(path, local_files_only=True).to_dict()
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    else:
        model, tok = models.load(path)
        config = model.config.to_dict()
    return {k: v for k, v in config.items() if k not in IGNORED}, tok


def check_same(paths: list[str]) -> tuple[dict[str, Any], Any]:
    """Checkpoints of one run: the same config (architecture, widths, heads, rope, norms, tying) and the same
    tokenizer (vocabulary and special tokens); returns the first's config and tokenizer."""
    first, tok0 = described(paths[0])
    for path in paths[1:]:
        other, tok = described(path)
        if other != first:
            differ = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
            raise UsageError(f"overtraining: {path} has another architecture than {paths[0]} ({', '.join(differ)} "
                             "differ); compare checkpoints of one run")
        if tok.get_vocab() != tok0.get_vocab() or tok.all_special_tokens != tok0.all_special_tokens:
            raise UsageError(f"overtraining: {path} has another tokenizer than {paths[0]}; compare checkpoints of "
                             "one run")
    return first, tok0


def _stage_order(path: Path) -> tuple[int, str]:
    index = path.parts[-3].split("_")[0]
    return (int(index) if index.isdigit() else -1, path.parts[-3])


def run(ctx: RunContext, p: OvertrainingParams) -> dict[str, Any]:
    from llmx.core.data import fixed_windows, token_stream
    from llmx.core.eval.lm import mean_nll
    from llmx.core.train.lm.data import TokenWindows

    entries, info = _entries(ctx, p)
    entries = series.checked(entries, info)
    device, splitting = ctx.device, ctx.config.data.splitting

    config, tok = check_same([e["path"] for e in entries])
    init_std = p.init_std or config.get("initializer_range")
    if p.noise_scale == "init_std" and init_std is None:
        raise UsageError("overtraining: the config has no initializer_range; set init_std")

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
        model, _ = models.load(e["path"], dtype="float32", device=device)
        n_params = sum(t.numel() for t in model.parameters())
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
        tuned_rows = turning.tuned(ft, f.lrs)
    out: dict[str, Any] = {
        "checkpoints": points, "sensitivity": sens, "finetune": ft, "finetune_tuned": tuned_rows,
        "turning_points": turning.turning_points(tokens, [c["L_pre"] for c in points], sens, ft, p.turn_k,
                                                 p.turn_rtol)
        + turning.turning_points(tokens, [], [], [{**r, "lr": "tuned"} for r in tuned_rows], p.turn_k,
                                 p.turn_rtol),
        "n_checkpoints": len(entries), "params": n_params, "pre_data": data, "seq_len": seq, "init_std": init_std,
        "max_tokens_per_param": max(tokens) / n_params, "schedule": info.get("schedule"),
        "finetune_data": f.data if f.lrs else None}
    note = series.schedule_note(info, entries)
    if note:
        ctx.log.warning("overtraining: %s", note)
        out["schedule_note"] = note
    return out
