"""The FunBO loop (notes §2.2): prompt from the database, sample completions, cut each to a program, evaluate the new
ones in the sandbox (a duplicate by normalised AST reuses its scores, unless it timed out), register the valid ones
in the prompt's island, reset every ``reset_period`` prompts, save after each prompt; finally the best validation
score among the top ``top_share`` by training score."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from llmx.core import atomic
from llmx.errors import UsageError
from llmx.plugins.funbo import prompt as P
from llmx.plugins.funbo.database import Database, Program
from llmx.plugins.funbo.program import ProgramError, key
from llmx.plugins.funbo.sandbox import Limits, Outcome, evaluate_many

TRANSIENT = ("timeout", "cpu", "crashed")  # outcomes a loaded machine can cause: not cached, a duplicate runs again


@dataclass
class Tally:
    sampled: int = 0
    valid: int = 0
    duplicates: int = 0
    prompts: int = 0
    resets: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def failed(self, reason: str) -> None:
        kind = kind_of(reason)
        self.reasons[kind] = self.reasons.get(kind, 0) + 1


def kind_of(reason: str) -> str:
    """A failure's class for the counts: a sandbox status, or what the check or the harness said."""
    head = reason.split(":", 1)[0]
    if head in ("timeout", "cpu", "memory", "crashed", "output", "file_size", "exited", "failed", "completed"):
        return head
    for words, kind in (("syntax error", "syntax"), ("no parseable", "syntax"), ("no function body", "syntax"),
                        ("not allowed", "refused"), ("signature", "refused"), ("nothing else", "refused"),
                        ("grid index", "bad index"), ("outside the grid", "bad index"), ("MemoryError", "memory"),
                        ("malformed", "malformed")):
        if words in reason:
            return kind
    return "raised"


@dataclass
class Search:
    db: Database
    sampler: object
    problems: list
    protocol: dict
    limits: Limits
    workers: int = 1
    reset_period: int = 10
    tally: Tally = field(default_factory=Tally)
    seen: dict[str, Outcome] = field(default_factory=dict)
    log: list[dict] = field(default_factory=list)

    def _evaluate(self, sources: list[str]) -> list[Outcome]:
        keys = [key(s) for s in sources]
        fresh = list(dict.fromkeys(k for k in keys if k not in self.seen))
        first: dict[str, str] = {}
        for source, k in zip(sources, keys, strict=True):
            first.setdefault(k, source)
        outcomes = evaluate_many([first[k] for k in fresh], self.problems, self.workers, limits=self.limits,
                                 **self.protocol)
        got = dict(zip(fresh, outcomes, strict=True))
        self.seen.update({k: o for k, o in got.items() if not o.reason.startswith(TRANSIENT)})
        return [self.seen.get(k) or got[k] for k in keys]

    def step(self, n: int) -> None:
        island, parents = self.db.prompt()
        version = len(parents)
        completions = self.sampler.sample(P.build([p.source for p in parents]), n)
        programs: list[str | None] = []
        for c in completions:
            try:
                programs.append(P.to_program(c, version))
            except ProgramError as e:
                programs.append(None)
                self._record(None, Outcome(False, reason=str(e)), island, duplicate=False)
        sources = [s for s in programs if s is not None]
        before = set(self.seen)
        for source, outcome in zip(sources, self._evaluate(sources), strict=True):
            duplicate = key(source) in before
            before.add(key(source))
            self._record(source, outcome, island, duplicate)
            if outcome.ok:
                self.db.register(source, outcome.scores, island)
        self.tally.prompts += 1
        if self.tally.prompts % self.reset_period == 0:
            self.db.reset()
            self.tally.resets += 1

    def _record(self, source: str | None, outcome: Outcome, island: int, duplicate: bool) -> None:
        t = self.tally
        t.sampled += 1
        t.duplicates += duplicate
        if outcome.ok:
            t.valid += 1
        else:
            t.failed(outcome.reason)
        score = self.db.reduced(outcome.scores) if outcome.ok else None
        self.log.append({"n": t.sampled, "prompt": t.prompts, "island": island, "ok": outcome.ok, "score": score,
                         "scores": outcome.scores, "duplicate": duplicate, "reason": outcome.reason, "source": source})

    def run(self, budget: int, per_prompt: int, save: Path, progress) -> None:
        steps = math.ceil(max(budget - self.tally.sampled, 0) / per_prompt)
        for _ in progress(range(steps), total=steps, description="funbo prompts"):
            self.step(min(per_prompt, budget - self.tally.sampled))
            self.save(save)

    def save(self, path: Path) -> None:
        self.db.save(path, {"tally": self.tally.__dict__, "seen": {k: o.__dict__ for k, o in self.seen.items()},
                            "setup": self.setup()})
        atomic.write_jsonl(path.with_name("candidates.jsonl"), self.log)

    def setup(self) -> dict:
        """What a resumed search must share with the saved one for its scores to be comparable."""
        return {"problems": [p.as_dict() for p in self.problems], "protocol": self.protocol}

    def evaluated(self, seed: str) -> list[Program]:
        """Every distinct valid program the search has scored (by normalised AST; wiped islands' too), the seed
        included, best first: the pool the result is chosen from."""
        pool = {key(seed): Program(seed, self.seen[key(seed)].scores, self.db.reduced(self.seen[key(seed)].scores),
                                   len(seed))} if key(seed) in self.seen and self.seen[key(seed)].ok else {}
        for row in self.log:
            if row["ok"] and row["source"]:
                pool.setdefault(key(row["source"]), Program(row["source"], row["scores"], row["score"],
                                                            len(row["source"])))
        return sorted(pool.values(), key=lambda p: -p.score)

    @classmethod
    def resume(cls, path: Path, **kw) -> Search:
        """The search saved in ``path``; UsageError when it is unreadable or was run on other problems or protocol.
        The database continues its own sequence; the sampler starts afresh."""
        try:
            d = json.loads(Path(path).read_text())
            db = Database.from_dict(d)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"resume {path}: not a funbo database.json ({type(e).__name__})") from None
        search = cls(db, **kw)
        if d.get("setup") != json.loads(json.dumps(search.setup())):
            raise UsageError(f"resume {path}: saved with other training problems or protocol; resume with the same "
                             "train, grid and protocol settings")
        search.tally = Tally(**d["tally"])
        search.seen = {k: Outcome(**o) for k, o in d["seen"].items()}
        log = Path(path).with_name("candidates.jsonl")
        search.log = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
        return search


def choose(programs: list[Program], top_share: float, validation: list, protocol: dict, limits: Limits,
           workers: int) -> tuple[Program, float, list[dict]]:
    """The best validation score among the top ``top_share`` by training score (ties: the better training score, then
    the earlier program)."""
    top = programs[: max(1, math.ceil(top_share * len(programs)))]
    outcomes = evaluate_many([p.source for p in top], validation, workers, limits=limits, **protocol)
    rows = [{"train": p.score, "validation": sum(o.scores) / len(o.scores) if o.ok else None, "reason": o.reason}
            for p, o in zip(top, outcomes, strict=True)]
    scored = [(r["validation"], p.score, -i) for i, (p, r) in enumerate(zip(top, rows, strict=True))
              if r["validation"] is not None]
    if not scored:
        return top[0], float("nan"), rows
    val, _, i = max(scored)
    return top[-i], val, rows

