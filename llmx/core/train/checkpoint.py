"""Resumable training checkpoints: the trained tensors, the optimiser, the step and every RNG state (CPU, CUDA,
Python, NumPy), saved atomically and read back with ``torch.load(weights_only=True)`` (no code runs on load)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import torch

from llmx.core import atomic
from llmx.errors import UsageError

LATEST = "latest"
STATE, INFO = "training_state.pt", "checkpoint.json"  # a series checkpoint's optimiser state and its description


def rng_state() -> dict[str, Any]:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def state_bytes(step: int, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                identity: dict[str, Any] | None = None) -> bytes:
    """``identity``: what the checkpoint belongs to (the model and the stage's params), checked on resume."""
    buf = io.BytesIO()
    torch.save({"step": step, "params": {k: v.detach().cpu().clone() for k, v in named.items()},
                "optimizer": opt.state_dict(), "rng": rng_state(), "identity": identity or {}}, buf)
    return buf.getvalue()


def check_identity(state: dict[str, Any], identity: dict[str, Any] | None, source: Path) -> None:
    """A resumed checkpoint must be this run's: the same model and the same params (those that may change on resume,
    such as ``steps`` or ``resume`` itself, excluded by the caller); say what differs."""
    saved = state.get("identity") or {}
    if not identity or not saved:
        return
    if saved.get("model") != identity.get("model"):
        raise UsageError(f"resume: {source} was trained on model {saved.get('model')!r}, this run uses "
                         f"{identity.get('model')!r}")
    old, new = saved.get("params") or {}, identity.get("params") or {}
    differ = [k for k in sorted(old) if k in new and old[k] != new[k]]  # a param added since is not a difference
    if differ:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in differ[:4])
        raise UsageError(f"resume: {source} belongs to a run with other settings ({shown})",
                         hint="Resume with the checkpoint's settings, or start a new run without resume.")


def save(folder: Path, step: int, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
         keep: int | None = None, identity: dict[str, Any] | None = None) -> Path:
    """``folder/step_<n>.pt`` (atomic) and ``folder/latest`` naming it; with ``keep``, older files beyond the newest
    ``keep`` are removed."""
    path = atomic.write_bytes(folder / f"step_{step}.pt", state_bytes(step, named, opt, identity))
    atomic.write_text(folder / LATEST, path.name + "\n")
    if keep:
        old = sorted(folder.glob("step_*.pt"), key=lambda f: int(f.stem.removeprefix("step_")))[:-keep]
        for f in old:
            f.unlink()
    return path


def resolve(path: Path) -> Path:
    """A checkpoint file, the one a folder's ``latest`` names, or a series checkpoint's ``training_state.pt``."""
    if path.is_dir():
        if (path / STATE).is_file():
            return path / STATE
        latest = path / LATEST
        if not latest.is_file():
            raise UsageError(f"no checkpoint in {path} (no '{LATEST}' or '{STATE}' file)")
        path = path / latest.read_text().strip()
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    return path


def resumed_step(path: Path) -> int:
    """The step a checkpoint holds: from its name (``step_<n>.pt``), a series checkpoint's ``checkpoint.json``, or
    else the file itself."""
    import json
    import re

    path = resolve(Path(path))
    if match := re.fullmatch(r"step_(\d+)\.pt", path.name):
        return int(match.group(1))
    info = path.parent / INFO
    if path.name == STATE and info.is_file():
        return int(json.loads(info.read_text())["step"])
    return int(load(path)["step"])


def stage_folder(path: Path) -> Path | None:
    """The stage artifact folder that wrote a checkpoint (``checkpoints/step_<n>.pt`` or
    ``series/tokens_<n>/training_state.pt`` inside it); None for a checkpoint kept anywhere else."""
    path = resolve(Path(path)).resolve()
    if path.name == STATE and path.parent.parent.name == "series":
        return path.parents[2]
    if path.parent.name == "checkpoints":
        return path.parents[1]
    return None


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; anything that is not plain tensors and containers is refused."""
    path = resolve(Path(path))
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - unpickling raises many types; the user needs one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{path}: not a loadable llmx checkpoint ({first})") from exc


def restore(state: dict[str, Any], named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
            source: Path) -> int:
    """Copy a checkpoint into the trained tensors, the optimiser and the RNGs; return its step."""
    missing = sorted(set(named) - set(state["params"]))
    extra = sorted(set(state["params"]) - set(named))
    if missing or extra:
        what = f"lacks {', '.join(missing[:3])}" if missing else f"has unknown {', '.join(extra[:3])}"
        raise UsageError(f"checkpoint {source} does not match the trained tensors (it {what})")
    with torch.no_grad():
        for k, p in named.items():
            if state["params"][k].shape != p.shape:
                raise UsageError(f"checkpoint {source}: {k} has shape {tuple(state['params'][k].shape)}, "
                                 f"the model {tuple(p.shape)}")
            p.copy_(state["params"][k])
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])
