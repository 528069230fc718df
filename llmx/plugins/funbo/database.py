"""FunSearch's programs database (notes §2.1, ``programs_database.py``): islands of clusters keyed by a program's
per-function score signature; a prompt picks an island uniformly, clusters by a softmax of their scores at
temperature T0 (1 - (n mod period) / period), n the island's program count (with replacement: two slots may share a
cluster), and within a cluster prefers shorter programs (softmax of minus the normalised length in characters,
temperature 1); a program registered again (a duplicate, whose scores are reused) counts again, as FunSearch's
re-evaluation would; a reset wipes the weaker half of the islands (ties broken by noise) and seeds each with the
best program of a random survivor. ``reduce: mean`` is FunBO's score over its functions, ``last`` FunSearch's. Reset
every ``reset_period`` prompts, not every 4 hours: a stated deviation. JSON-saved with its generator's state, so a
resumed search continues the same sequence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy.special import softmax as _sp_softmax

from llmx.core import atomic


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """FunSearch's ``_softmax``: probabilities of logits / T, the largest corrected so that they sum to exactly 1."""
    logits = np.asarray(logits, dtype=np.float64)
    if not np.all(np.isfinite(logits)):
        raise ValueError(f"non-finite logits {logits}")
    p = _sp_softmax(logits / temperature)
    top = int(np.argmax(p))
    p[top] = 1.0 - p[:top].sum() - p[top + 1:].sum()
    return p


@dataclass
class Program:
    source: str
    scores: list[float]
    score: float
    length: int  # characters, FunSearch's len(str(program))


@dataclass
class Island:
    clusters: dict[tuple, list[Program]] = field(default_factory=dict)
    programs: int = 0

    def cluster_score(self, signature: tuple) -> float:
        return self.clusters[signature][0].score


@dataclass
class Database:
    islands: int = 10
    functions_per_prompt: int = 2
    temperature_init: float = 0.1
    temperature_period: int = 30_000
    reduce: str = "mean"
    seed: int = 0
    state: list[Island] = field(default_factory=list)
    best: list[Program | None] = field(default_factory=list)
    rng: np.random.Generator = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.state = self.state or [Island() for _ in range(self.islands)]
        self.best = self.best or [None] * self.islands
        self.rng = self.rng or np.random.default_rng(self.seed)

    def reduced(self, scores: list[float]) -> float:
        return float(np.mean(scores)) if self.reduce == "mean" else float(scores[-1])

    def register(self, source: str, scores: list[float], island: int | None = None) -> Program:
        """Into ``island``, or into every island (the seed, and a reset's founder into its new island)."""
        program = Program(source, list(scores), self.reduced(scores), len(source))
        for i in range(self.islands) if island is None else (island,):
            isl = self.state[i]
            isl.clusters.setdefault(tuple(program.scores), []).append(program)
            isl.programs += 1
            if self.best[i] is None or program.score > self.best[i].score:
                self.best[i] = program
        return program

    def temperature(self, island: int) -> float:
        n = self.state[island].programs
        return self.temperature_init * (1 - (n % self.temperature_period) / self.temperature_period)

    def cluster_probabilities(self, island: int) -> tuple[list[tuple], np.ndarray]:
        isl = self.state[island]
        signatures = list(isl.clusters)
        scores = np.array([isl.cluster_score(s) for s in signatures])
        return signatures, softmax(scores, self.temperature(island))

    def program_probabilities(self, cluster: list[Program]) -> np.ndarray:
        lengths = np.array([p.length for p in cluster], dtype=np.float64)
        normalised = (lengths - lengths.min()) / (lengths.max() + 1e-6)
        return softmax(-normalised, 1.0)

    def prompt(self) -> tuple[int, list[Program]]:
        """An island and its chosen programs, ascending by score (the prompt's v0, v1, ...)."""
        island = int(self.rng.integers(self.islands))
        signatures, p = self.cluster_probabilities(island)
        k = min(len(signatures), self.functions_per_prompt)
        chosen = self.rng.choice(len(signatures), size=k, p=p)
        programs = []
        for c in chosen:
            cluster = self.state[island].clusters[signatures[c]]
            programs.append(cluster[int(self.rng.choice(len(cluster), p=self.program_probabilities(cluster)))])
        return island, sorted(programs, key=lambda q: q.score)

    def reset(self) -> list[int]:
        """Wipe the weaker half of the islands; each restarts from the best program of a random surviving island."""
        best = np.array([b.score if b else -np.inf for b in self.best])
        order = np.argsort(best + self.rng.standard_normal(self.islands) * 1e-6)
        wiped, kept = order[: self.islands // 2], order[self.islands // 2:]
        for i in wiped:
            self.state[i], self.best[i] = Island(), None
            founder = self.best[int(self.rng.choice(kept))]
            self.register(founder.source, founder.scores, int(i))
        return [int(i) for i in wiped]

    def to_dict(self) -> dict:
        islands = [{"programs": isl.programs,
                    "clusters": [[asdict(p) for p in cluster] for cluster in isl.clusters.values()]}
                   for isl in self.state]
        return {"config": {"islands": self.islands, "functions_per_prompt": self.functions_per_prompt,
                           "temperature_init": self.temperature_init, "temperature_period": self.temperature_period,
                           "reduce": self.reduce, "seed": self.seed},
                "islands": islands, "best": [asdict(b) if b else None for b in self.best],
                "rng": self.rng.bit_generator.state}

    @classmethod
    def from_dict(cls, d: dict) -> Database:
        state = []
        for isl in d["islands"]:
            clusters = {}
            for cluster in isl["clusters"]:
                programs = [Program(**p) for p in cluster]
                clusters[tuple(programs[0].scores)] = programs
            state.append(Island(clusters, isl["programs"]))
        rng = np.random.default_rng()
        rng.bit_generator.state = d["rng"]
        return cls(**d["config"], state=state, best=[Program(**b) if b else None for b in d["best"]], rng=rng)

    def save(self, path: Path, extra: dict | None = None) -> None:
        atomic.write_json(path, {**self.to_dict(), **(extra or {})})
