"""The training loop shared by the zoo's pre-training and every train / align stage.

AdamW, warmup + cosine (or linear / constant) schedule, gradient accumulation and clipping, optional periodic
evaluation with early stopping (the best state is restored), per-step metrics to ``metrics.jsonl``, checkpoints with
exact resume, and data parallelism under ``torchrun`` (gloo or NCCL).

Exact resume and data parallelism rest on one contract: ``loss(step, micro)`` is a pure function of its arguments
(the batch for a step is chosen by the step number, not by a stateful sampler). A checkpoint then only needs the
trained tensors, the optimiser, the step and the RNG states. Under ``torch.distributed`` rank ``r`` of ``w`` computes
micro-batches ``micro * w + r`` and the gradients are averaged, so ``w`` processes with ``grad_accum = k`` equal one
process with ``grad_accum = w * k``.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from llmx.core import atomic


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    lr: float
    warmup: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    eval_every: int | None = None
    patience: int | None = None
    checkpoint_every: int | None = None
    stop_after: int | None = None  # end the run after this many steps (a preemption), checkpointing first


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_eval: float
    seconds: float
    last_loss: float
    resumed_from: int = 0


LossFn = Callable[[int, int], "torch.Tensor | tuple[torch.Tensor, dict[str, float]]"]


def lr_at(step: int, c: TrainConfig) -> float:
    if step < c.warmup:
        return c.lr * (step + 1) / c.warmup
    if c.schedule == "constant":
        return c.lr
    frac = min((step - c.warmup) / max(c.steps - c.warmup, 1), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if c.schedule == "cosine" else 1 - frac
    return c.lr * (c.min_lr_ratio + (1 - c.min_lr_ratio) * shape)


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside ``torch.distributed``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rng_state() -> dict[str, Any]:
    import numpy as np

    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_checkpoint(folder: Path, step: int, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                    extra: dict[str, Any]) -> Path:
    """``folder/step_<n>.pt`` (atomic) and ``folder/latest`` naming it."""
    import io

    buf = io.BytesIO()
    torch.save({"step": step, "params": {k: v.detach().clone() for k, v in named.items()},
                "optimizer": opt.state_dict(), "rng": rng_state(), **extra}, buf)
    path = atomic.write_bytes(folder / f"step_{step}.pt", buf.getvalue())
    atomic.write_text(folder / "latest", path.name + "\n")
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint file, or the one a checkpoint folder's ``latest`` names."""
    from llmx.errors import UsageError

    if path.is_dir():
        latest = path / "latest"
        if not latest.is_file():
            raise UsageError(f"no checkpoint in {path} (no 'latest' file)")
        path = path / latest.read_text().strip()
    if not path.is_file():
        raise UsageError(f"checkpoint not found: {path}")
    return torch.load(path, weights_only=False)


def train(model: torch.nn.Module, params: Iterable[torch.nn.Parameter] | dict[str, torch.nn.Parameter], loss: LossFn,
          c: TrainConfig, evaluate: Callable[[], float] | None = None, progress=None,
          metrics_file: Path | None = None, checkpoint_dir: Path | None = None,
          resume: Path | None = None) -> TrainResult:
    """Optimise ``params`` on ``loss(step, micro)`` (see the module docstring for its contract)."""
    named = dict(params) if isinstance(params, dict) else {str(i): p for i, p in enumerate(params)}
    named = {k: p for k, p in named.items() if p.requires_grad}
    trained = list(named.values())
    opt = torch.optim.AdamW(trained, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
    rank, size = world()
    start = 0
    if resume is not None:
        state = load_checkpoint(resume)
        with torch.no_grad():
            for k, p in named.items():
                p.copy_(state["params"][k])
        opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        start = state["step"]
    best = (float("inf"), 0, None)
    stale, t0, step, loss_value = 0, time.perf_counter(), start - 1, float("nan")
    log = metrics_file.open("a") if metrics_file and rank == 0 else None
    model.train()
    try:
        for step in (progress or (lambda r, **_: r))(range(start, c.steps), description="training"):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, c)
            opt.zero_grad(set_to_none=True)
            loss_value, extras = 0.0, {}
            for micro in range(c.grad_accum):
                out = loss(step, micro * size + rank)
                value, stats = out if isinstance(out, tuple) else (out, {})
                (value / (c.grad_accum * size)).backward()
                loss_value += float(value.detach()) / c.grad_accum
                for k, v in stats.items():
                    extras[k] = extras.get(k, 0.0) + float(torch.as_tensor(v).detach()) / c.grad_accum
            if size > 1:
                for p in trained:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    torch.distributed.all_reduce(p.grad)
            if c.grad_clip:
                torch.nn.utils.clip_grad_norm_(trained, c.grad_clip)
            opt.step()
            record = {"step": step + 1, "loss": loss_value, "lr": lr_at(step, c), **extras}
            if evaluate is not None and c.eval_every and ((step + 1) % c.eval_every == 0 or step + 1 == c.steps):
                model.eval()
                record["eval"] = value = evaluate()
                model.train()
                if value < best[0]:
                    best, stale = (value, step + 1, copy.deepcopy(model.state_dict())), 0
                else:
                    stale += 1
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            done = step + 1
            if checkpoint_dir is not None and rank == 0 and (
                    (c.checkpoint_every and done % c.checkpoint_every == 0) or done == c.stop_after):
                save_checkpoint(checkpoint_dir, done, named, opt, {})
            if (c.patience is not None and stale >= c.patience) or done == c.stop_after:
                break
    finally:
        if log:
            log.close()
    if best[2] is not None:
        model.load_state_dict(best[2])
    model.eval()
    return TrainResult(steps=step + 1, best_step=best[1], best_eval=best[0], seconds=time.perf_counter() - t0,
                       last_loss=loss_value, resumed_from=start)
