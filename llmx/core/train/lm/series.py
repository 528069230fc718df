"""Checkpoint series: loadable model folders saved at token budgets, each with its optimiser state and a
``checkpoint.json``, listed in the series' ``manifest.json`` (tokens seen, step, learning rate at that step, the
run's schedule and a data fingerprint) for later stages to read; and cooldown branches from them."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.train import checkpoint
from llmx.core.train.distributed import is_main
from llmx.core.train.loop import StepState, TrainConfig
from llmx.errors import UsageError

MANIFEST, INFO = "manifest.json", checkpoint.INFO


def budget_steps(tokens: list[int], tokens_per_step: int, steps: int) -> dict[int, int]:
    """Step -> token budget: a budget is saved after the first step at which at least that many tokens were seen."""
    at: dict[int, int] = {}
    for budget in sorted(set(tokens)):
        step = math.ceil(budget / tokens_per_step)
        if step > steps:
            raise UsageError(f"save_at_tokens {budget} is past the run's {steps * tokens_per_step} tokens "
                             f"({steps} steps x {tokens_per_step} tokens)")
        if step in at:
            raise UsageError(f"save_at_tokens {at[step]} and {budget} fall on the same step {step} "
                             f"({tokens_per_step} tokens per step)")
        at[step] = budget
    return at


def carried(resume: str | None) -> list[dict[str, Any]]:
    """Entries of the interrupted run's series up to the resumed step (their folders stay where they are)."""
    if not resume:
        return []
    folder = checkpoint.stage_folder(Path(resume))
    manifest = folder / "series" / MANIFEST if folder is not None else None
    if manifest is None or not manifest.is_file():
        return []
    start = checkpoint.resumed_step(Path(resume))
    entries = json.loads(manifest.read_text())["checkpoints"]
    return [{**e, "path": str((manifest.parent / e["path"]).resolve())} for e in entries if e["step"] <= start]


class Series:
    """An ``after_step`` callback of the loop that writes the series (rank 0 only)."""

    def __init__(self, folder: Path, run: dict[str, Any], at: dict[int, int],
                 save: Callable[[Path, dict[str, bytes]], Path], earlier: list[dict[str, Any]]):
        self.folder, self.run, self.at, self.save = folder, run, at, save
        self.entries = list(earlier)

    def __call__(self, s: StepState) -> None:
        if s.done not in self.at or not is_main():
            return
        budget = self.at[s.done]
        entry = {"tokens": budget, "tokens_seen": s.done * self.run["tokens_per_step"], "step": s.done, "lr": s.lr,
                 "path": f"tokens_{budget}"}
        info = json.dumps({**entry, "run": self.run}, indent=2).encode()
        state = checkpoint.state_bytes(s.done, s.named, s.optimizer, s.identity)
        self.save(self.folder / entry["path"], {checkpoint.STATE: state, INFO: info})
        self.entries = [e for e in self.entries if e["step"] != s.done] + [entry]
        atomic.write_json(self.folder / MANIFEST, {"run": self.run, "checkpoints": self.entries})


def read_info(path: str) -> dict[str, Any]:
    folder = Path(path)
    info = folder / INFO
    if not info.is_file() or not (folder / checkpoint.STATE).is_file():
        raise UsageError(f"cooldown_from: {folder} is not a series checkpoint (no {INFO} and {checkpoint.STATE})")
    return json.loads(info.read_text())


def cooldown(info: dict[str, Any], run: dict[str, Any], fraction: float, base: TrainConfig) -> TrainConfig:
    """The branch: the checkpoint's step and peak rate, then a decay over ``fraction`` of its steps (WSD whose
    stable phase ends at the checkpoint). The data and tokens per step must be the checkpoint's."""
    then, step = info["run"], int(info["step"])
    if then["schedule"] not in ("constant", "wsd"):
        raise UsageError(f"cooldown_from: the checkpoint's run used a {then['schedule']} schedule; a cooldown "
                         "branches from a constant or wsd run")
    if then["schedule"] == "wsd" and step > then["steps"] - then["decay_steps"]:
        raise UsageError(f"cooldown_from: step {step} is in its run's decay phase (from step "
                         f"{then['steps'] - then['decay_steps']}); branch from the stable phase")
    for key in ("tokens_per_step", "seq_len"):
        if then[key] != run[key]:
            raise UsageError(f"cooldown_from: {key} is {run[key]} here and {then[key]} in the checkpoint's run")
    if then["data"]["fingerprint"] != run["data"]["fingerprint"]:
        raise UsageError("cooldown_from: the training data differs from the checkpoint's run "
                         f"(fingerprint {run['data']['fingerprint']} vs {then['data']['fingerprint']})")
    n = max(1, round(fraction * step))
    return TrainConfig(**{**base.__dict__, "steps": step + n, "lr": then["lr"], "warmup": then["warmup"],
                          "schedule": "wsd", "decay_steps": n})
