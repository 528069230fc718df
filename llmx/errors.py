"""Errors that carry their exit code: the CLI turns each into one message on stderr."""

from __future__ import annotations

from dataclasses import dataclass


class LlmxError(Exception):
    """Base class: a failure the user can act on. ``exit_code`` is what the CLI returns."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def lines(self) -> list[str]:
        out = [self.message]
        if self.hint:
            out.append(self.hint)
        return out


class UsageError(LlmxError):
    """Bad input from the user: an unknown name, a bad value, an unreadable file (exit 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One configuration mistake, located by its dotted path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(UsageError):
    """A configuration with one or more problems, all reported at once (exit 2)."""

    def __init__(self, problems: list[Problem], *, source: str | None = None):
        self.problems = list(problems)
        self.source = source
        n = len(self.problems)
        where = f" in {source}" if source else ""
        super().__init__(f"{n} problem{'s' if n != 1 else ''}{where}")

    def lines(self) -> list[str]:
        """One line for one problem; a count and an indented list for several."""
        if len(self.problems) == 1:
            return [f"{self.problems[0]}" + (f" (in {self.source})" if self.source else "")]
        return [self.message + ":"] + [f"  {p}" for p in self.problems]

    def __str__(self) -> str:  # what a Python caller sees: every problem
        return "\n".join(self.lines())


class MissingRequirement(LlmxError):
    """A GPU, CuPy or an optional extra that this run needs is absent (exit 3)."""

    exit_code = 3


def extra_hint(extra: str) -> str:
    """How to install one of llmx's extras: from the checkout llmx is installed from (``pip install -e``), since
    ``pip install 'llmx[...]'`` would ask the package index for a project of that name."""
    if extra == "gpu":
        return "Install it with: pip install -e '.[gpu]' (CUDA 12) or -e '.[gpu-cuda13]' (CUDA 13), in the llmx checkout"
    return f"Install it with: pip install -e '.[{extra}]', in the llmx checkout"


class CannotRun(LlmxError):
    """A method cannot run as asked: a training strategy it cannot shard under, say (exit 3, before any work)."""

    exit_code = 3


class RunFailed(LlmxError):
    """A stage raised while running (exit 1)."""

    exit_code = 1


class DeviceMismatch(RunFailed):
    """A tensor on a device its path cannot run on (a CUDA tensor reaching a CPU-only kernel, a layer's input on
    another device than its weights), named by the layer: raised instead of a silent copy (exit 1)."""
