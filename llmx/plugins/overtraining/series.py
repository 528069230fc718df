"""The checkpoints under study: a series manifest (``core/train/lm/series.py``) or a list, sorted by tokens, each
with the learning rate it was saved at and whether the run's schedule had already decayed there (then the late
checkpoints are also annealed, a confound the notes name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmx.core.train import checkpoint
from llmx.core.train.lm import series as lm_series
from llmx.errors import UsageError

DECAYING = ("cosine", "linear")
IDENTITY = ("model", "init", "seed", "lr", "tokens_per_step", "seq_len")  # a run's identity; steps, world size and
# cooldown branches may differ between its checkpoints


def _manifest(path: Path) -> Path:
    found = path if path.is_file() else path / lm_series.MANIFEST
    if not found.is_file():
        found = path / "series" / lm_series.MANIFEST
    if not found.is_file():
        raise UsageError(f"series: {path} holds no {lm_series.MANIFEST} (an lm run with save_at_tokens writes one)")
    return found


def from_manifest(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    found = _manifest(Path(path))
    try:
        saved = json.loads(found.read_text())
        entries = [{"path": str((found.parent / e["path"]).resolve()), "tokens": int(e["tokens"]),
                    "step": int(e["step"]), "lr": float(e["lr"])} for e in saved["checkpoints"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"series: {found} is not a checkpoint-series manifest ({exc})") from None
    return entries, saved.get("run", {})


def from_list(items: list[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Listed folders; a series checkpoint's ``checkpoint.json`` fills its tokens, step and lr, and every listed
    series checkpoint must come from one run (the notes' first pitfall)."""
    entries, run, first = [], {}, None
    for item in items:
        folder = Path(item.path)
        info = json.loads((folder / checkpoint.INFO).read_text()) if (folder / checkpoint.INFO).is_file() else {}
        tokens = item.tokens if item.tokens is not None else info.get("tokens")
        if tokens is None:
            raise UsageError(f"checkpoints: {folder} needs tokens (it has no {checkpoint.INFO})")
        lr = item.lr if item.lr is not None else info.get("lr")
        entries.append({"path": str(folder.resolve()), "tokens": int(tokens), "step": info.get("step"),
                        "lr": None if lr is None else float(lr)})
        if "run" in info and not run:
            run, first = info["run"], folder
        elif "run" in info and identity(info["run"]) != identity(run):
            differ = sorted(k for k, v in identity(run).items() if identity(info["run"])[k] != v)
            raise UsageError(f"checkpoints: {folder} and {first} come from different runs ({', '.join(differ)} "
                             "differ); compare checkpoints of one run")
    return entries, run


def identity(run: dict[str, Any]) -> dict[str, Any]:
    return {**{k: run.get(k) for k in IDENTITY}, "data": run.get("data", {}).get("fingerprint")}


def checked(entries: list[dict[str, Any]], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Sorted by tokens, every folder present, no budget twice; each flagged ``annealed`` when its lr is 0 or below
    the run's peak (the highest listed lr when no run is known): a decayed schedule, or a cooldown branch."""
    if not entries:
        raise UsageError("overtraining: the series is empty (give series=, checkpoints=, or an lm stage with "
                         "save_at_tokens before this one)")
    for e in entries:
        if not Path(e["path"]).is_dir():
            raise UsageError(f"overtraining: checkpoint folder {e['path']} is missing")
    tokens = [e["tokens"] for e in entries]
    if len(set(tokens)) != len(tokens):
        raise UsageError(f"overtraining: two checkpoints at the same token count ({sorted(tokens)})")
    listed = [e["lr"] for e in entries if e["lr"] is not None]
    peak = run.get("lr") or max(listed, default=None)
    for e in entries:
        warming = e["step"] is not None and e["step"] <= run.get("warmup", 0)
        e["annealed"] = bool(e["lr"] is not None and not warming
                             and (e["lr"] == 0 or (peak and e["lr"] < 0.999 * peak)))
    return sorted(entries, key=lambda e: e["tokens"])


def schedule_note(run: dict[str, Any], entries: list[dict[str, Any]]) -> str | None:
    """Why the series mixes budget with annealing, or None."""
    if run.get("schedule") in DECAYING:
        return (f"the run used a {run['schedule']} schedule: later checkpoints are also annealed (lower lr), which "
                "confounds sensitivity with the schedule; a constant or wsd run with cooldown branches separates them")
    flags = [e["annealed"] for e in entries]
    if all(flags):
        return "every checkpoint is annealed (cooldown branches or a decayed end): a like-for-like annealed series"
    if any(flags):
        return "some checkpoints were saved below the run's peak lr (annealed): compare them with annealed ones only"
    return None
