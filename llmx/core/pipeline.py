"""Run a resolved pipeline: requirements first, then each stage in order, recording metrics as it goes."""

from __future__ import annotations

import importlib.util
import logging
import random
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmx.core import atomic, runs
from llmx.core.config import ResolvedRun
from llmx.core.context import RunContext
from llmx.core.signals import Terminated
from llmx.errors import CannotRun, ConfigError, LlmxError, MissingRequirement, RunFailed, UsageError, extra_hint


@dataclass
class RunResult:
    path: Path
    stages: list[dict[str, Any]] = field(default_factory=list)
    model: Any = None  # the model and tokenizer after the last stage (for the Python API)
    tokenizer: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.path), "stages": self.stages}


EXTRAS = {"cupy": "gpu", "peft": "lora", "lm_eval": "lm-eval", "compressed_tensors": "export", "bandit": "security"}


def check_requirements(run: ResolvedRun) -> None:
    """Exit 3 before anything is written when a stage needs what this machine lacks: the method's declared
    requirements, and those its params add (``params.requirements()``, such as ``peft`` for a LoRA adapter); and the
    device the run asks for."""
    check_device(run.config.device)
    cuda = run.config.device.startswith("cuda")
    for stage in run.stages:
        why = getattr(stage.params, "unsupported", lambda: None)()
        if why:
            raise CannotRun(f"method '{stage.spec.name}' {why}")
        extra = getattr(stage.params, "requirements", lambda: ())()
        for req in (*stage.spec.requires, *extra):
            if req == "cupy" and not cuda:
                continue  # a method's CuPy kernels serve CUDA tensors only; the CPU runs their PyTorch references
            if req == "gpu" or req == "cupy":
                import torch

                if not torch.cuda.is_available():
                    raise MissingRequirement(f"method '{stage.spec.name}' needs a CUDA GPU and none is available")
            if req != "gpu":
                require_modules(f"method '{stage.spec.name}'", [req])


def require_modules(who: str, modules) -> None:
    """Exit 3 naming the install command when a Python package ``who`` needs is absent."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            hint = extra_hint(EXTRAS[module]) if module in EXTRAS else f"Install it with: pip install {module}"
            raise MissingRequirement(f"{who} needs the Python package '{module}', which is not installed",
                                     hint=f"Install it with: {hint}")


def check_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            found = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise MissingRequirement(f"--device {device}: this machine has {found} CUDA device(s) visible to torch",
                                     hint="Run with --device cpu, or install a CUDA build of torch.")
    elif device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise MissingRequirement("--device mps: Apple's Metal backend is not available here")


def check_references(run: ResolvedRun) -> None:
    """Exit 2 before the first stage when any stage names a data source, file, model or checkpoint that is not there
    (the zoo entry a recipe builds counts as there)."""
    from llmx.core.refs import check_params

    built = f"ref:{run.zoo.name}" if run.zoo is not None else None
    problems = [p for p in check_params(run.config, "") if not (p.path == "model" and run.config.model == built)]
    for stage in run.stages:
        problems += check_params(stage.params, f"pipeline.{stage.index}.params.")
    if problems:
        raise ConfigError(problems)


def seed_everything(seed: int, threads: int | None) -> None:
    random.seed(seed)
    if importlib.util.find_spec("numpy"):
        import numpy as np

        np.random.seed(seed % 2**32)
    if importlib.util.find_spec("torch"):
        import torch

        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)


def execute(run: ResolvedRun, *, show_progress: bool = True, model: tuple[Any, Any] | None = None) -> RunResult:
    """Run the stages in order; ``model`` is an in-memory ``(model, tokenizer)`` to start from instead of
    ``config.model``."""
    check_requirements(run)
    check_references(run)
    if run.zoo is not None:  # before the run folder exists: a bad corpus leaves nothing behind
        from llmx.core import zoo

        zoo.ensure(run.zoo, show_progress=show_progress)
    from llmx.core.train import distributed

    rank = distributed.init(run.config.device)
    runs.sweep(Path(run.config.output_dir))
    path = runs.create(run, rank)
    lock = runs.hold(path)
    result = RunResult(path)
    log = logging.getLogger("llmx.run")
    log.setLevel(logging.DEBUG)
    handler = logging.FileHandler(path / runs.LOG)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    meta = runs.start_meta(run)
    runs.write_meta(path, meta)
    ctx = RunContext(config=run.config, run_dir=path, log=log, show_progress=show_progress and rank == 0)
    if model is not None:
        ctx.set_model(*model)
    try:
        seed_everything(run.config.seed, run.config.threads)
        for stage in run.stages:
            ctx.stage = stage
            log.info("stage %s: %s %s", stage.index, stage.stage.value, stage.spec.name)
            ctx.timings.clear()
            t0 = time.perf_counter()
            try:
                metrics = dict(stage.spec.load()(ctx, stage.params) or {})
            except (LlmxError, KeyboardInterrupt, Terminated):
                raise
            except Exception as exc:
                log.debug("stage %s failed:\n%s", stage.label, traceback.format_exc())
                raise RunFailed(f"stage {stage.label} ({stage.stage.value}) failed: {type(exc).__name__}: {exc}",
                                hint=f"Details in {path / runs.LOG}") from exc
            # a model's load and a zoo build inside it are the stage's own figures, not its seconds
            loads = {k: round(v, 3) for k, v in ctx.timings.items()}
            seconds = time.perf_counter() - t0 - sum(ctx.timings.values())
            result.stages.append({"index": stage.index, "stage": stage.stage.value, "method": stage.spec.name,
                                  "seconds": round(max(0.0, seconds), 3), **loads, "metrics": metrics})
            atomic.write_json(path / runs.METRICS, {"stages": result.stages})
        runs.finish_meta(path, meta, "ok")
        if "model" in ctx.state:
            result.model, result.tokenizer = ctx.state["model"], ctx.state.get("tokenizer")
        return result
    except (UsageError, MissingRequirement, CannotRun) as exc:  # bad input, a missing extra, a way it cannot run
        if not result.stages:  # not a run yet: leave nothing behind
            shutil.rmtree(path, ignore_errors=True)
        else:  # finished stages keep their artifacts
            runs.finish_meta(path, meta, "failed", error=exc.message)
            done = ", ".join(f"{s['index']}:{s['method']}" for s in result.stages)
            exc.hint = "\n".join(filter(None, [exc.hint, f"Run folder kept: {path} ({done} finished)."]))
        raise
    except (KeyboardInterrupt, Terminated):  # Ctrl-C, or SIGTERM under the CLI
        runs.finish_meta(path, meta, "interrupted")
        raise
    except LlmxError as exc:
        runs.finish_meta(path, meta, "failed", error=exc.message)
        raise
    finally:
        log.removeHandler(handler)
        handler.close()
        runs.drop(lock)  # the lock file goes with its holder
