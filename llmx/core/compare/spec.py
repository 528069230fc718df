"""What a comparison is: the arms (a method and its params each, or the starting model), the arm the paper proposes
(``target``; every other arm is a baseline), the evaluation that scores every arm item by item, the metric and its
direction, the cost axis (each arm's declared cost, else a stage metric that measures it) and the tolerance within
which arms count as matched, the seeds, and the quick form CI runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arm:
    """One side: ``stages`` as a recipe's pipeline (``{"method": ..., "params": {...}}`` each; none: the starting
    model as it is); ``family`` is its line in the plot (default: its first method, or ``start``); ``cost`` its place
    on the comparison's cost axis where no stage measures it (16 for a float16 model's bits per weight)."""

    name: str
    stages: tuple[Mapping[str, Any], ...] = ()
    family: str = ""
    cost: float | None = None

    @property
    def line(self) -> str:
        return self.family or (str(self.stages[0]["method"]) if self.stages else "start")


@dataclass(frozen=True)
class ComparisonSpec:
    """A paper's comparison. ``evaluation`` is the stage appended to every arm (``None``: each arm's own last stage
    scores it, a decoding method's, say); it writes ``items`` (an artifact of ``.jsonl`` rows, one per scored item: a
    window, a prompt, keyed by its ``item`` id) whose ``metric`` field is paired across arms on the same (seed, item).
    ``baselines`` are the arms judged against the target (default: every other arm; the rest are references, drawn and
    tabled at their own cost). ``cost_key`` names the stage metric giving an arm's cost when it declares none
    (``METHOD.key``: that method's stage's, where an earlier stage reports the key too); arms whose costs differ from
    the target's by more than ``tolerance`` (a fraction of the target's cost where ``relative``) are refused before any
    run when their costs are declared, and judged "unmatched" when measured (``None``: the axis is only drawn).
    ``quick`` holds param overrides for CI, applied to every stage whose params have the field (``METHOD.key``: that
    method's stages only), and ``quick_seeds`` its seeds. ``kinds`` are the ``model_type`` values it can run on (empty:
    any causal LM). ``corpus``: whether the run's text corpus (``--data``) feeds what is calibrated, trained or scored;
    a comparison whose stages read data of their own refuses ``--data`` (their ``data`` params take it, through
    ``--set``). ``report`` names other fields of the items reported per arm beside the metric (a parse rate, a utility
    score), and ``by`` an item field the metric is also reported by (per CWE): each an arm's mean with its interval over
    (seed, item), not judged; ``counts`` names stage metrics (the pairs a data stage made) reported per arm and seed
    where one of its stages records them; a target's count of 0 (its data stage made nothing: its training had nothing
    to train on) marks every verdict with those seeds (``void_seeds``), and a target void on every seed is judged
    "void", not "within noise"; ``diagnostics`` names stage metrics reported per arm and seed the same way, never judged
    (how a router's gates separate languages). ``shares`` names the metric or reported fields that are shares (a rate,
    an accuracy): their per-arm intervals are held in [0, 1]."""

    name: str
    summary: str
    target: str
    arms: tuple[Arm, ...]
    baselines: tuple[str, ...] = ()
    evaluation: Mapping[str, Any] | None = field(default_factory=lambda: {"method": "perplexity", "params": {}})
    items: str = "windows.jsonl"
    metric: str = "nll"
    higher_is_better: bool = False
    cost: str = "bits per weight"
    cost_key: str | None = "weight_bits_per_element"
    tolerance: float | None = None
    relative: bool = False
    seeds: tuple[int, ...] = (0, 1, 2)
    quick: Mapping[str, Any] = field(default_factory=dict)
    quick_seeds: tuple[int, ...] = (0,)
    model: str = "ref:llama"
    quick_model: str = "ref:llama-test"
    quick_zoo: Mapping[str, Any] | None = None  # how to build the quick model where no preset is (a recipe's zoo)
    data: Mapping[str, Any] = field(default_factory=lambda: {"source": "stdlib", "seq_len": 128})
    kinds: tuple[str, ...] = ()
    corpus: bool = True
    dtype: str | None = None  # the runs' dtype (default: the run config's), e.g. bfloat16 where the paper measures it
    report: tuple[str, ...] = ()  # item fields reported per arm with intervals, beside the judged metric
    by: str | None = None  # an item field the metric is also reported by, per arm (e.g. "cwe")
    counts: tuple[str, ...] = ()  # stage metrics per arm and seed (pairs made); the target's 0 voids its seed
    diagnostics: tuple[str, ...] = ()  # stage metrics per arm and seed, reported only
    shares: tuple[str, ...] = ()  # the metric or report fields that are shares: their per-arm intervals stay in [0, 1]
    paper: str = ""
    plugin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"comparison {self.name!r}: two arms share a name")
        if self.target not in names:
            raise ValueError(f"comparison {self.name!r}: target {self.target!r} is not one of its arms")
        if len(names) < 2:
            raise ValueError(f"comparison {self.name!r} needs a baseline beside its target")
        if not set(self.baselines) <= set(names) - {self.target}:
            raise ValueError(f"comparison {self.name!r}: a baseline is not one of its other arms")
        if not set(self.shares) <= {self.metric, *self.report}:
            raise ValueError(f"comparison {self.name!r}: a share is neither its metric nor a reported field")

    def matched(self, cost: float, target: float) -> bool:
        """Whether ``cost`` is within the tolerance of the target's ``target`` (no tolerance: always)."""
        if self.tolerance is None:
            return True
        return abs(cost - target) <= self.tolerance * (abs(target) if self.relative else 1.0)

    @property
    def judged(self) -> tuple[str, ...]:
        return self.baselines or tuple(a.name for a in self.arms if a.name != self.target)

    def arm(self, name: str) -> Arm:
        from llmx.core.names import did_you_mean
        from llmx.errors import UsageError

        found = next((a for a in self.arms if a.name == name), None)
        if found is None:
            names = [a.name for a in self.arms]
            raise UsageError(f"comparison '{self.name}' has no arm '{name}'.{did_you_mean(name, names)}",
                             hint=f"Its arms: {', '.join(names)}.")
        return found

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "paper": self.paper, "target": self.target,
                "baselines": list(self.judged),
                "arms": [{"name": a.name, "family": a.line, "cost": a.cost, "stages": [dict(s) for s in a.stages]}
                         for a in self.arms],
                "evaluation": dict(self.evaluation or {}), "metric": self.metric,
                "higher_is_better": self.higher_is_better,
                "cost": self.cost, "tolerance": self.tolerance, "relative": self.relative, "seeds": list(self.seeds),
                "quick": dict(self.quick), "quick_seeds": list(self.quick_seeds), "model": self.model,
                "quick_model": self.quick_model,
                "quick_zoo": dict(self.quick_zoo or {}),
                "data": dict(self.data), "corpus": self.corpus, "kinds": list(self.kinds), "dtype": self.dtype,
                "plugin": self.plugin, **({"report": list(self.report)} if self.report else {}),
                **({"by": self.by} if self.by else {}), **({"counts": list(self.counts)} if self.counts else {}),
                **({"diagnostics": list(self.diagnostics)} if self.diagnostics else {}),
                **({"shares": list(self.shares)} if self.shares else {})}
