"""The training loop shared by the zoo's pre-training and every training stage (lm, sft, align, CLOVER, ...).

AdamW with a warmup + cosine / linear / constant / WSD schedule (``core.train.schedule``), gradient accumulation and
clipping, bf16 autocast over fp32 master weights, optional periodic evaluation with early stopping (the best state is
restored), per-step metrics to ``metrics.jsonl`` (loss, rate, gradient norm before clipping and the loss's own
figures), checkpoints with exact resume (``core/train/checkpoint.py``: torch's distributed checkpoint), and data
parallelism under ``torchrun`` on torch's engines (DDP or FSDP2, ``core/train/parallel.py``).

Exact resume and data parallelism rest on one contract: ``loss(i)`` is a pure function of the global micro-batch
index ``i`` (the batch is chosen by its number, not by a stateful sampler). Optimizer step ``s`` consumes indices
``s * n .. s * n + n - 1`` with ``n = grad_accum * world_size``; rank ``r`` takes ``s * n + m * world_size + r`` for
``m < grad_accum`` and the gradients are averaged, so ``w`` processes with ``grad_accum = k`` equal one process with
``grad_accum = w * k``, and no two ranks ever see the same micro-batch. The global RNG is seeded from the run's seed
and ``i`` before each micro-batch, so dropout masks (and any other draw of the loss) depend on the micro-batch, not
on the rank or the world size that ran it. A checkpoint then only needs the trained tensors, the optimiser and the
step.

Each micro-batch's loss is a mean. With ``weight(i)`` (its number of target tokens, say) the step's gradient is the
weighted mean over all of the step's micro-batches on every rank, so a step is the mean over its tokens whatever the
split into micro-batches and processes (transformers' ``num_items_in_batch``); the weights are a pure function of
``i`` too, so no rank waits for another's count. Without it micro-batches weigh equally.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from llmx.core import atomic, runs
from llmx.core.train import checkpoint
from llmx.core.train.distributed import all_sum, from_main, world
from llmx.core.train.parallel import Engine, device_of, full, wrap
from llmx.core.train.schedule import DecayShape, Schedule, lr_at
from llmx.errors import UsageError

Precision = Literal["fp32", "bf16-mixed"]


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    lr: float
    warmup: int = 0
    schedule: Schedule = "cosine"
    min_lr_ratio: float = 0.1
    decay_steps: int = 0  # WSD: steps of the final decay
    decay_shape: DecayShape = "linear"
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    grad_accum: int = 1
    precision: Precision = "fp32"
    eval_every: int | None = None
    patience: int | None = None  # early stopping on ``evaluate``; the best state is restored
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = None
    stop_after: int | None = None  # end the run after this many steps (a preemption), checkpointing first
    seed: int = 0  # with the micro-batch index, the global RNG's seed for that micro-batch

    def lr_at(self, step: int) -> float:
        return lr_at(step, lr=self.lr, steps=self.steps, warmup=self.warmup, schedule=self.schedule,
                     min_lr_ratio=self.min_lr_ratio, decay_steps=self.decay_steps, decay_shape=self.decay_shape)

    def micro_batches(self, size: int) -> int:
        """Global micro-batches per optimizer step."""
        return self.grad_accum * size


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_eval: float
    seconds: float
    last_loss: float
    resumed_from: int = 0
    optimizer_bytes: int = 0  # measured: every tensor the optimiser holds (AdamW: both moments)


@dataclass
class StepState:
    """What an ``after_step`` callback sees: the steps done, the rate of the last step, the trained tensors and the
    optimiser (so a callback can write a resumable snapshot)."""

    done: int
    lr: float
    named: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    identity: dict[str, Any] | None = None


LossFn = Callable[[int], "torch.Tensor | tuple[torch.Tensor, dict[str, float]]"]
OptimizerFactory = Callable[[list[dict], "TrainConfig"], torch.optim.Optimizer]


def adamw(groups: list[dict], c: TrainConfig) -> torch.optim.Optimizer:
    """The loop's default optimiser: ``torch.optim.AdamW`` over the rate groups."""
    return torch.optim.AdamW(groups, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)


def micro_index(step: int, micro: int, c: TrainConfig, rank: int, size: int) -> int:
    """The global micro-batch index of this rank's ``micro``-th micro-batch of ``step`` (module docstring)."""
    return step * c.micro_batches(size) + micro * size + rank


def micro_seed(seed: int, index: int) -> int:
    """The global RNG's seed for micro-batch ``index`` of a run seeded ``seed``."""
    return (seed * 1_000_003 + index) % (2**63 - 1)


def _local_bytes(t: torch.Tensor) -> int:
    """Bytes this process holds of ``t`` (its shard of a sharded one)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _metrics_log(path: Path | None, start: int, resume: Path | None):
    """Open ``metrics.jsonl`` for appending. A resumed run first writes the history up to its step, from this file
    or else from the run it resumes (its stage folder's ``metrics.jsonl``), so the file is the whole curve and never
    repeats a step (a half-written last line of a killed run is dropped)."""
    if path is None:
        return None
    kept: list[str] = []
    if start:
        folder = checkpoint.stage_folder(resume) if not path.is_file() else None
        source = path if path.is_file() else (folder / path.name if folder is not None else None)
        if source is not None and source.is_file():
            kept = [r for r in runs.records(source) if r.get("step", start + 1) <= start]
    atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return path.open("a")


def _groups(named: dict[str, torch.nn.Parameter], lr_scale: Callable[[str], float] | None) -> list[dict]:
    """One optimiser group per rate multiplier, in the order the tensors come."""
    groups: dict[float, dict[str, torch.nn.Parameter]] = {}
    for name, p in named.items():
        groups.setdefault(float(lr_scale(name)) if lr_scale else 1.0, {})[name] = p
    return [{"params": list(ps.values()), "names": list(ps), "scale": scale} for scale, ps in groups.items()]


def train(model: torch.nn.Module, params: Iterable[torch.nn.Parameter] | dict[str, torch.nn.Parameter], loss: LossFn,
          c: TrainConfig, evaluate: Callable[[], float] | None = None, progress=None,
          metrics_file: Path | None = None, checkpoint_dir: Path | None = None, resume: Path | None = None,
          after_step: Callable[[StepState], None] | None = None,
          weight: Callable[[int], float] | None = None, identity: dict[str, Any] | None = None,
          verify_resume: bool = True, lr_scale: Callable[[str], float] | None = None,
          optimizer: OptimizerFactory = adamw, engine: Engine | None = None) -> TrainResult:
    """Optimise ``params`` on ``loss(i)`` (see the module docstring for its contract). ``identity`` goes into every
    checkpoint; with ``verify_resume``, a ``resume`` checkpoint carrying another one is refused. ``lr_scale(name)``
    multiplies the schedule's rate for that tensor (a separate projector rate, say). ``optimizer(groups, c)`` builds
    the optimiser (default AdamW); each group carries its tensors' ``names`` and rate ``scale``. ``engine``: the data
    parallelism ``model`` (and any module trained beside it) is under (``parallel.wrap``); without one, under
    torchrun the loop puts ``model`` under DDP for the run."""
    named = dict(params) if isinstance(params, dict) else {str(i): p for i, p in enumerate(params)}
    named = {k: p for k, p in named.items() if p.requires_grad}
    trained = list(named.values())
    low = sorted({str(p.dtype) for p in trained if p.dtype != torch.float32})
    if low:
        raise UsageError(f"training needs float32 master weights; the trained tensors are {', '.join(low)} "
                         "(load the model in float32; precision: bf16-mixed runs the forward in bfloat16)")
    opt = optimizer(_groups(named, lr_scale), c)
    rank, size = world()
    start = 0
    if resume is not None:
        if verify_resume:
            checkpoint.check_identity(checkpoint.describe(resume), identity, resume)
        start = checkpoint.restore(resume, named, opt)
    if start > c.steps:
        raise UsageError(f"the checkpoint is at step {start}, past this run's {c.steps} steps")
    device_type = device_of(model).type  # where it computes (offloaded shards sit in CPU memory)
    bf16 = c.precision == "bf16-mixed"
    best = (float("inf"), 0, None)
    stale, t0, step, loss_value = 0, time.perf_counter(), start - 1, float("nan")
    log = _metrics_log(metrics_file, start, resume) if rank == 0 else None
    own = engine is None
    engine = wrap(model, "ddp") if own else engine
    spread = size if engine.averages else 1  # the engine divides the summed gradients by the world size
    model.train()
    try:
        if size > 1:
            engine.check(named)
        for step in (progress or (lambda r, **_: r))(range(start, c.steps), description="training"):
            lr = c.lr_at(step)
            for group in opt.param_groups:
                group["lr"] = lr * group["scale"]
            opt.zero_grad(set_to_none=True)
            totals: dict[str, torch.Tensor] = {}
            n = c.micro_batches(size)
            whole = sum(weight(step * n + k) for k in range(n)) if weight is not None else n
            for micro in range(c.grad_accum):
                i = micro_index(step, micro, c, rank, size)
                share = (weight(i) if weight is not None else 1) / max(whole, 1e-12)
                torch.manual_seed(micro_seed(c.seed, i))
                with engine.sync(micro == c.grad_accum - 1):
                    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
                        out = loss(i)
                    value, stats = out if isinstance(out, tuple) else (out, {})
                    (value.float() * (share * spread)).backward()
                for k, v in {"loss": value, **stats}.items():
                    v = torch.as_tensor(v, dtype=torch.float32, device=value.device).detach().mean()
                    totals[k] = totals.get(k, 0.0) + v * share
            if size > 1:
                all_sum(list(totals.values()))
            norm = torch.nn.utils.clip_grad_norm_(trained, c.grad_clip or float("inf"))
            opt.step()
            figures = {k: float(v) for k, v in totals.items()}
            figures["grad_norm"] = float(full(norm))
            loss_value = figures["loss"]
            record = {"step": step + 1, "lr": lr, **figures}
            if evaluate is not None and c.eval_every and ((step + 1) % c.eval_every == 0 or step + 1 == c.steps):
                model.eval()
                with torch.no_grad():  # no graph (under FSDP a forward with one waits for its backward)
                    score = evaluate()
                record["eval"] = score = from_main(score) if size > 1 else score  # one best step on every rank
                model.train()
                if score < best[0]:
                    keep = copy.deepcopy(model.state_dict()) if c.patience is not None else None
                    best, stale = (score, step + 1, keep), 0
                else:
                    stale += 1
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            done = step + 1
            if after_step is not None:
                after_step(StepState(done, lr, named, opt, identity))
            if checkpoint_dir is not None and (
                    (c.checkpoint_every and done % c.checkpoint_every == 0) or done == c.stop_after):
                checkpoint.save(checkpoint_dir, done, named, opt, keep=c.keep_checkpoints, identity=identity)
            if (c.patience is not None and stale >= c.patience) or done == c.stop_after:
                break
    finally:
        if log:
            log.close()
        if own:
            engine.release()
    if best[2] is not None:
        model.load_state_dict(best[2])
    model.eval()
    state_bytes = sum(_local_bytes(t) for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return TrainResult(steps=step + 1, best_step=best[1], best_eval=best[0], seconds=time.perf_counter() - t0,
                       last_loss=loss_value, resumed_from=start, optimizer_bytes=state_bytes)
