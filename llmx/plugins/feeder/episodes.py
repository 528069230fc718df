"""In-context episodes: a task built for a few-million-parameter model to solve from its context alone.

Each episode draws a fresh map from cue words to label words; an input holds one cue among distractor words, and its
label is the map's (5% of rows get another label). The cue comes last by default (``Spec.cue_last``) and the label
follows it directly: the classic induction pattern (A B ... A -> B). A 2-layer Llama learns it abruptly after a
plateau of about T*sqrt(B*C) tokens (batch B, context C, T ~ 10^5.7: Aoyama, Wilcox and Schneider, "Predicting the
Formation of Induction Heads", arXiv 2511.16893); with a ``=`` between cue and label (a 2-back match) it had not
formed after 12k steps. Training episodes hold 2 to 6 cues, so that cues repeat within a 64-token window. A model
trained on episodes can only predict a label by finding the query's cue among the demonstrations, so in-context
learning is what lowers its loss (bench_feeder.py measures whether it emerged); a held-out map (``heldout``) is then a
pool that is redundant by construction (many rows per cue): a core set of one row per cue exists, and a random subset
of its size misses cues. The words are pseudo-words (cues CVCV, distractors CVC) and colour names (labels), from a
fixed seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from llmx.core.data.icl import Format

CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
LABEL_WORDS = ("red", "blue", "green", "gold", "pink", "gray", "cyan", "teal", "jade", "rose", "navy", "lime", "plum",
               "rust", "sand", "snow")
TRAIN_EPISODES, VALIDATION_EPISODES = 6000, 300
TEMPLATE = "> {input} {label}"  # compact (8 demonstrations fit 64 tokens); every word after a space
FORMAT = Format(TEMPLATE)


def _inventory() -> tuple[list[str], list[str]]:
    rng = random.Random(0)
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    cues = sorted({a + b for a in syllables for b in syllables})
    distractors = sorted({s + c for s in syllables for c in CONSONANTS})
    return rng.sample(cues, 128), rng.sample(distractors, 128)


CUES, DISTRACTORS = _inventory()


@dataclass(frozen=True)
class Spec:
    """One map's shape: how many cues and labels, the distractors per input, the label-noise rate."""

    cues: int = 32
    labels: int = 4
    distractors: tuple[int, int] = (1, 3)
    noise: float = 0.05
    cue_last: bool = True  # the cue just before the label separator (random: anywhere among the distractors)

    def __post_init__(self) -> None:
        if not (1 <= self.cues <= len(CUES) and 2 <= self.labels <= len(LABEL_WORDS)):
            raise ValueError(f"cues must be 1..{len(CUES)} and labels 2..{len(LABEL_WORDS)}")


def draw_map(spec: Spec, rng: random.Random) -> tuple[dict[str, str], list[str]]:
    """A fresh map from ``spec.cues`` cue words to ``spec.labels`` label words (every label used when it can be)."""
    cues, labels = rng.sample(CUES, spec.cues), rng.sample(LABEL_WORDS, spec.labels)
    targets = [labels[i % len(labels)] for i in range(len(cues))]
    rng.shuffle(targets)
    return dict(zip(cues, targets, strict=True)), labels


def row(mapping: dict[str, str], labels: list[str], spec: Spec, rng: random.Random, noisy: bool = True,
        cue: str | None = None) -> dict[str, str]:
    """One ``{input, label, cue}`` row: the cue among distractors, its mapped label (another one at the noise rate)."""
    cue = cue or rng.choice(list(mapping))
    words = rng.sample(DISTRACTORS, rng.randint(*spec.distractors))
    words.insert(len(words) if spec.cue_last else rng.randint(0, len(words)), cue)
    label = mapping[cue]
    if noisy and rng.random() < spec.noise:
        label = rng.choice([lab for lab in labels if lab != label])
    return {"input": " ".join(words), "label": label, "cue": cue}


def episode(rng: random.Random, fmt: Format = FORMAT, rows: int = 40) -> str:
    """One training document: a fresh map of 2 to 6 cues over 2 to 6 labels, 1 or 2 distractors per input, ``rows``
    rows in the format."""
    spec = Spec(cues=rng.randint(2, 6), labels=rng.randint(2, 6), distractors=(1, 2))
    mapping, labels = draw_map(spec, rng)
    return fmt.render([row(mapping, labels, spec, rng) for _ in range(rows)])


def documents(split: str, fmt: Format = FORMAT) -> list[str]:
    """The ``icl-episodes`` dataset: 6000 train and 300 validation episodes in ``TEMPLATE``, each from its own seed."""
    first, count = (0, TRAIN_EPISODES) if split == "train" else (10**6, VALIDATION_EPISODES)
    return [episode(random.Random(first + k), fmt) for k in range(count)]


def heldout(spec: Spec, pool: int, test: int, seed: int) -> dict:
    """A map no training episode was built from (seeds past the dataset's), its pool (noisy, cues drawn at random)
    and its test rows (noise-free)."""
    rng = random.Random(f"heldout-map:{seed}")
    mapping, labels = draw_map(spec, rng)
    return {"map": mapping, "labels": labels,
            "pool": [row(mapping, labels, spec, rng) for _ in range(pool)],
            "test": [row(mapping, labels, spec, rng, noisy=False) for _ in range(test)]}
