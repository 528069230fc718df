"""RunContext: what a method's implementation receives besides its params."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from llmx.core.config import ResolvedStage, RunConfig

T = TypeVar("T")


@dataclass
class RunContext:
    """Shared by the stages of one run. ``state`` carries the model and tokenizer from stage to stage,
    so ``quantize`` then ``eval`` measures the quantized model."""

    config: RunConfig
    run_dir: Path
    log: logging.Logger
    show_progress: bool = True
    stage: ResolvedStage | None = None
    state: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # the current stage's load_seconds, build_seconds

    @property
    def device(self) -> str:
        """The run's device; ``auto`` picks CUDA when present, and under torchrun ``cuda`` is this rank's GPU."""
        from llmx.core.train.distributed import local_device

        device = self.config.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return local_device(device)

    def _ensure_model(self) -> None:
        if "model" not in self.state:
            from llmx.core import models

            if not self.config.model:
                raise models.no_model_error()
            self.log.info("loading model %s", self.config.model)
            onloaded = self.config.onload != "none"
            sharded = self.stage is not None and getattr(self.stage.params, "strategy", None) == "fsdp"
            built = _zoo_build_seconds(self.config.model)
            t0 = time.perf_counter()
            model, tok = models.load(self.config.model, dtype=self.config.dtype,  # fsdp: onto the device by shards
                                     device="cpu" if onloaded or sharded else self.device)
            self.set_model(model, tok)
            self.record_load(time.perf_counter() - t0, _zoo_build_seconds(self.config.model) - built)

    def record_load(self, seconds: float, built: float = 0.0) -> None:
        """Count a model's load (``built``: of which a zoo build) apart from the stage's own time: the pipeline
        reports them as the stage's ``load_seconds`` and ``build_seconds``, and on a line of their own."""
        from llmx.core.progress import clock, note

        load = max(0.0, seconds - built)
        self.timings["load_seconds"] = self.timings.get("load_seconds", 0.0) + load
        if built:
            self.timings["build_seconds"] = self.timings.get("build_seconds", 0.0) + built
        if built or load >= 1:
            done = f"built in {clock(built)} (not counted in the stage's seconds), " if built else ""
            note(f"model {self.config.model}: {done}loaded in {load:.1f}s")

    @property
    def model(self) -> Any:
        self._ensure_model()
        return self.state["model"]

    @property
    def tokenizer(self) -> Any:
        self._ensure_model()
        return self.state["tokenizer"]

    def set_model(self, model: Any, tokenizer: Any | None = None) -> None:
        """Hand a transformed model to the following stages (with ``onload``, its blocks kept in CPU memory)."""
        if self.config.onload != "none":
            from llmx.core.models import onload

            onload.attach(model, self.device)
        self.state["model"] = model
        if tokenizer is not None:
            self.state["tokenizer"] = tokenizer

    def artifact(self, name: str) -> Path:
        """Path for an artifact of the current stage: ``artifacts/<index>_<method>/<name>``."""
        sub = f"{self.stage.index}_{self.stage.spec.name}" if self.stage else "run"
        path = self.run_dir / "artifacts" / sub / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def progress(self, items: Iterable[T], total: int | None = None, description: str = "") -> Iterator[T]:
        """Iterate with a rich progress bar on stderr (hidden with -q or --json)."""
        from llmx.core.progress import track

        return track(items, total=total, description=description, enabled=self.show_progress)


def _zoo_build_seconds(model: str) -> float:
    """Seconds this process has spent building zoo entries so far (0 for a model that is not ``ref:``)."""
    if not model.startswith("ref:"):
        return 0.0
    from llmx.core import zoo

    return zoo.build_seconds()
