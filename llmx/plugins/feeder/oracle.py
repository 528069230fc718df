"""The ICL oracle Ψ(C, x) the tree asks (notes §6): the label a model predicts for pool row ``x`` with the pool rows
``C`` in context, in pool-index order. Questions are batched and cached by (demonstration ids, query id): the tree and
its passes re-ask many. ``LMOracle`` scores label words with a causal LM (``core.eval.icl``); ``KnnOracle`` is a
deterministic stand-in (the nearest demonstration by shared words) for tests and CPU prototypes; ``CopyOracle`` is the
exact copier an episode pool can be judged by (a demonstration with the query's cue gives its label), under which "one
row per cue" is sufficient (notes §2.2's definition) and removing a cue's only row is not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llmx.errors import UsageError

Question = tuple[tuple[int, ...], int]  # (sorted demonstration ids, query id), all pool indices


class Oracle:
    """Caches and counts; a subclass answers uncached questions in ``_answer``. ``fits(demos)``: whether one
    question may hold these demonstrations (at most ``max_node_size`` of them; None: no limit)."""

    budget: int | None = None  # tokens one question leaves for its demonstrations (None: not counted)

    def __init__(self, rows: Sequence[dict], labels: Sequence[str], max_node_size: int | None = None) -> None:
        self.rows, self.labels, self.max_node_size = list(rows), list(labels), max_node_size
        self.cache: dict[Question, str] = {}
        self.calls = self.hits = 0

    def fits(self, demos: Sequence[int]) -> bool:
        return self.max_node_size is None or len(demos) <= self.max_node_size

    def ask(self, questions: Sequence[Question]) -> list[str]:
        """Ψ for each question; only the ones never asked reach the model (``calls``), the rest are ``hits``."""
        keys = [(tuple(sorted(c)), x) for c, x in questions]
        fresh = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if not all(self.fits(c) for c, _ in fresh):
            raise ValueError("a question does not fit one prompt (max_node_size or the model's context)")
        for key, label in zip(fresh, self._answer(fresh), strict=True):
            self.cache[key] = label
        self.calls += len(fresh)
        self.hits += len(keys) - len(fresh)
        return [self.cache[k] for k in keys]

    def infers(self, demos: Sequence[int], query: int) -> bool:
        return self.ask([(tuple(demos), query)])[0] == self.rows[query]["label"]

    def _answer(self, questions: list[Question]) -> list[str]:
        raise NotImplementedError


class LMOracle(Oracle):
    """A causal LM's label-word choice after ``fmt.prompt(demos, x)``. A question fits when its demonstrations'
    tokens, with the pool's longest query and label, fit the model's context (``core.eval.icl.demo_budget``)."""

    def __init__(self, model: Any, tok: Any, fmt: Any, rows: Sequence[dict], labels: Sequence[str],
                 batch_size: int = 16, max_node_size: int | None = None, limit: int | None = None,
                 progress: Callable = lambda x, **_: x) -> None:
        from llmx.core.eval.icl import demo_budget, demo_tokens
        from llmx.core.eval.score import scoring_limit

        super().__init__(rows, labels, max_node_size)
        self.model, self.tok, self.fmt, self.batch_size, self.progress = model, tok, fmt, batch_size, progress
        self.limit = min(limit or scoring_limit(model, tok), scoring_limit(model, tok))
        self.lengths = demo_tokens(tok, fmt, self.rows)
        self.budget = demo_budget(tok, fmt, self.rows, self.labels, self.limit)

    def fits(self, demos: Sequence[int]) -> bool:
        return super().fits(demos) and sum(self.lengths[d] for d in demos) <= self.budget

    def _answer(self, questions: list[Question]) -> list[str]:
        from llmx.core.eval.icl import classify

        prompts = [self.fmt.prompt([self.rows[i] for i in c], self.rows[x]["input"]) for c, x in questions]
        return classify(self.model, self.tok, prompts, self.labels, self.batch_size, limit=self.limit)


class KnnOracle(Oracle):
    """The demonstration sharing the most words with the query decides (ties: the later one in pool order); with
    no shared word, or no demonstration, the first label."""

    def __init__(self, rows: Sequence[dict], labels: Sequence[str], max_node_size: int | None = None) -> None:
        super().__init__(rows, labels, max_node_size)
        self.words = [set(r["input"].split()) for r in self.rows]

    def _answer(self, questions: list[Question]) -> list[str]:
        out = []
        for demos, x in questions:
            best, label = 0, self.labels[0]
            for d in demos:
                shared = len(self.words[d] & self.words[x])
                if shared and shared >= best:
                    best, label = shared, self.rows[d]["label"]
            out.append(label)
        return out


class CopyOracle(Oracle):
    """Ψ(C, x): the label of the last demonstration (pool-index order) whose ``cue`` is x's, else no label (an empty
    answer, which infers nothing): an exact copier, for episode pools (rows with a ``cue``, ``episodes.row``)."""

    NONE = ""

    def __init__(self, rows: Sequence[dict], labels: Sequence[str], max_node_size: int | None = None) -> None:
        missing = next((i for i, r in enumerate(rows) if "cue" not in r), None)
        if missing is not None:
            raise UsageError(f"pool row {missing} has no 'cue': oracle copy judges episode pools (icl-episodes)")
        super().__init__(rows, labels, max_node_size)

    def _answer(self, questions: list[Question]) -> list[str]:
        out = []
        for demos, x in questions:
            same = [d for d in demos if self.rows[d]["cue"] == self.rows[x]["cue"]]
            out.append(self.rows[same[-1]]["label"] if same else self.NONE)
        return out
