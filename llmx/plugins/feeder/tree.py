"""The FEEDER tree (notes §2.2, a reconstruction: the paper's code is not public). Every pool row starts as a leaf;
each level pairs the nodes at random and keeps, for a pair (A, B), A if A is sufficient for B, else B if B is
sufficient for A, else A ∪ B (sufficiency per instance: Ψ(A, x) = y for every (x, y) in B). After ``depth`` levels
(or one node) the remaining nodes are united; ``rounds`` > 1 runs the tree again on that set. The necessity pass
visits members in random order and drops one when the rest still infers it (``necessity: self``) or still infers
every pool row the set inferred (``pool``, the notes' "removal keeps the set sufficient": |S| x n questions); the
repair pass adds the pool rows the set does not infer, while they fit. Sufficiency is not transitive, so the share of
the pool the set infers is measured, never assumed. A node (or the final union) that does not fit one prompt
(``max_node_size``, the model's context) is cut, and every cut is counted: ``cut: random`` keeps the rows of a random
order while they fit; ``redundancy`` (reconstructed) visits them in a random order and keeps each one the rows kept so
far do not already infer, while it fits, so a cut drops redundant rows before rows that carry something new.
``versus_random`` pairs the set's pool inference with random subsets of its size (notes §4's informative baseline)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass, field

from llmx.core.eval import stats
from llmx.plugins.feeder.oracle import Oracle


@dataclass
class Selection:
    indices: list[int]
    oracle_calls: int
    cache_hits: int
    sufficiency_rate: float  # share of the pool rows Ψ(S, x) labels right
    inferred: list[bool]
    per_class: dict[str, int]
    seed: int
    sufficiency_rate_nonmembers: float  # the same over the rows outside the set (members see themselves)
    truncations: int = 0  # nodes cut to fit one prompt
    truncated_rows: int = 0  # rows those cuts dropped
    levels: list[int] = field(default_factory=list)  # nodes left after each level, over the rounds
    dropped_by_necessity: int = 0
    added_by_repair: int = 0
    repair_unfit: int = 0  # uninferred rows the repair pass had no room for
    dropped_after_repair: int = 0  # members the second necessity pass (after repair) dropped
    repair_reverted: bool = False  # the repaired set inferred fewer pool rows: the set before repair is kept
    budget: int | None = None  # tokens one question leaves for demonstrations (LM oracle)

    def as_dict(self) -> dict:
        return asdict(self)


def _fill(oracle: Oracle, kept: list[int], candidates: list[int], size: int | None = None) -> list[int]:
    """``kept`` plus the candidates, in their order, that still fit one prompt (at most ``size`` rows in all)."""
    kept = list(kept)
    for i in candidates:
        if size is not None and len(kept) >= size:
            break
        if oracle.fits([*kept, i]):
            kept.append(i)
    return kept


def _fill_new(oracle: Oracle, candidates: list[int]) -> list[int]:
    """The candidates, in their order, that the ones kept before do not infer and that still fit one prompt."""
    kept: list[int] = []
    for i in candidates:
        if oracle.fits([*kept, i]) and not (kept and oracle.infers(kept, i)):
            kept.append(i)
    return kept


class _Cap:
    def __init__(self, oracle: Oracle, rng: random.Random, how: str = "random") -> None:
        if how not in ("random", "redundancy"):
            raise ValueError(f"cut must be random or redundancy, not {how!r}")
        self.oracle, self.rng, self.how, self.cuts, self.rows = oracle, rng, how, 0, 0

    def __call__(self, node: list[int]) -> list[int]:
        if self.oracle.fits(node):
            return node
        order = self.rng.sample(node, len(node))
        kept = _fill_new(self.oracle, order) if self.how == "redundancy" else _fill(self.oracle, [], order)
        self.cuts += 1
        self.rows += len(node) - len(kept)
        return sorted(kept)


def sufficient(oracle: Oracle, pairs: list[tuple[list[int], list[int]]]) -> list[bool]:
    """For each (A, B): whether A infers every row of B, all questions in one batch."""
    questions = [(tuple(a), x) for a, b in pairs for x in b]
    said = iter(oracle.ask(questions))
    return [all([next(said) == oracle.rows[x]["label"] for x in b]) for _, b in pairs]


def tree(oracle: Oracle, leaves: list[int], depth: int | None, rng: random.Random, cap: _Cap,
         levels: list[int]) -> list[int]:
    """One round: the union of the nodes left after ``depth`` levels (None: until one node)."""
    nodes = [[i] for i in leaves]
    level = 0
    while len(nodes) > 1 and (depth is None or level < depth):
        rng.shuffle(nodes)
        pairs = [(nodes[k], nodes[k + 1]) for k in range(0, len(nodes) - 1, 2)]
        carried = [nodes[-1]] if len(nodes) % 2 else []
        a_for_b = sufficient(oracle, pairs)
        ask_back = [k for k, ok in enumerate(a_for_b) if not ok]
        b_for_a = dict(zip(ask_back, sufficient(oracle, [(pairs[k][1], pairs[k][0]) for k in ask_back]), strict=True))
        parents = []
        for k, (a, b) in enumerate(pairs):
            if a_for_b[k]:
                parents.append(a)
            elif b_for_a[k]:
                parents.append(b)
            else:
                parents.append(cap(sorted(a + b)))
        nodes = parents + carried
        level += 1
        levels.append(len(nodes))
    return cap(sorted({i for node in nodes for i in node}))


def necessity(oracle: Oracle, chosen: list[int], rng: random.Random, check: str = "self") -> list[int]:
    """Each member in random order is dropped when the rest still infers it (``self``) or every pool row the set
    inferred before the pass (``pool``)."""
    kept = list(chosen)
    covered = [x for x, ok in enumerate(inferred(oracle, kept)) if ok] if check == "pool" else []
    for a in rng.sample(chosen, len(chosen)):
        rest = [i for i in kept if i != a]
        if not rest:
            continue
        queries = covered if check == "pool" else [a]
        if all(said == oracle.rows[x]["label"] for said, x in
               zip(oracle.ask([(tuple(rest), x) for x in queries]), queries, strict=True)):
            kept = rest
    return kept


def inferred(oracle: Oracle, chosen: list[int]) -> list[bool]:
    """Whether Ψ(S, x) = y for every pool row (the brute-force recount of sufficiency)."""
    return [said == row["label"] for said, row in
            zip(oracle.ask([(tuple(chosen), x) for x in range(len(oracle.rows))]), oracle.rows, strict=True)]


def select(oracle: Oracle, depth: int | None = None, rounds: int = 1, necessity_pass: bool = True,
           repair_pass: bool = False, seed: int = 0, necessity_check: str = "pool", cut: str = "random") -> Selection:
    """The FEEDER set of the oracle's pool, with its cost and its measured pool-sufficiency rate. Oracle calls are
    at most n per level (each row is asked once per pair it is in), so n K R for the tree, plus |S| (``self``) or
    |S| n (``pool``) for the necessity pass, n for the recount, and |node| per ``redundancy`` cut. The repair pass
    adds n for its recount and a second necessity pass over the grown set; a repaired set that infers fewer pool rows
    than the set before it (added mislabelled rows can override clean ones) is discarded (``repair_reverted``)."""
    rng = random.Random(seed)
    cap = _Cap(oracle, rng, cut)
    levels: list[int] = []
    chosen = list(range(len(oracle.rows)))
    for _ in range(rounds):
        chosen = tree(oracle, chosen, depth, rng, cap, levels)
    before = len(chosen)
    if necessity_pass:
        chosen = necessity(oracle, chosen, rng, necessity_check)
    dropped = before - len(chosen)
    hits = inferred(oracle, chosen)
    added = unfit = after_repair = 0
    reverted = False
    if repair_pass and not all(hits):
        missing = [x for x, ok in enumerate(hits) if not ok and x not in chosen]
        grown = _fill(oracle, chosen, rng.sample(missing, len(missing)))
        added, unfit = len(grown) - len(chosen), len(missing) - (len(grown) - len(chosen))
        repaired = sorted(grown)
        if necessity_pass and added:
            kept = necessity(oracle, repaired, rng, necessity_check)
            after_repair, repaired = len(repaired) - len(kept), kept
        new_hits = inferred(oracle, repaired)
        reverted = sum(new_hits) < sum(hits)
        if not reverted:
            chosen, hits = repaired, new_hits
    members = set(chosen)
    outside = [ok for x, ok in enumerate(hits) if x not in members]
    return Selection(sorted(chosen), oracle.calls, oracle.hits, sum(hits) / max(len(hits), 1), hits,
                     dict(sorted(Counter(oracle.rows[i]["label"] for i in chosen).items())), seed,
                     sum(outside) / len(outside) if outside else 1.0, cap.cuts, cap.rows, levels, dropped, added, unfit,
                     after_repair, reverted, oracle.budget)


def versus_random(oracle: Oracle, chosen: list[int], hits: list[bool], draws: int, seed: int) -> dict:
    """The set against ``draws`` random subsets of its size, paired per pool row: the set's inference of the row
    (1/0, ``hits``) minus the share of the subsets that infer it, the mean with a bootstrap interval and the rows
    the set wins or loses (``core.eval.stats.paired``). A subset is a random order's rows while they fit one prompt,
    up to the set's size; its questions are counted here, apart from the selection's."""
    rng, n, calls = random.Random(seed), len(oracle.rows), oracle.calls
    shares, sizes = [0.0] * n, []
    for _ in range(draws):
        subset = _fill(oracle, [], rng.sample(range(n), n), len(chosen))
        sizes.append(len(subset))
        for x, ok in enumerate(inferred(oracle, subset)):
            shares[x] += ok / draws
    versus = stats.paired(shares, [float(h) for h in hits], seed=seed)
    return {"draws": draws, "subset_rows": stats.mean(sizes), "random_sufficiency_rate": stats.mean(shares),
            **versus.as_dict("sufficiency_minus_random"), "oracle_calls": oracle.calls - calls}
