"""Digit scenes with ground truth: scikit-learn's bundled handwritten digits (1,797 8x8 images, nothing downloads)
placed in the cells of a 2x2 grid on a 32-pixel RGB canvas, each with a colour and a size. Relations follow from the
cells: consecutive objects in reading order are ``left_of`` in one row, else ``above``. Digit images are split by
index (the first 80% train, the rest test), so test scenes show unseen handwriting. Everything is a pure function of
the seed."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np

from llmx.core.multimodal.languages import CELLS, COLOURS, SIZES, truth

CANVAS = 32
CELL = CANVAS // 2
SPLITS = ("train", "test")
TRAIN_SHARE = 0.8
RGB = {"red": (1.0, 0.1, 0.1), "green": (0.1, 0.9, 0.1), "blue": (0.2, 0.4, 1.0), "yellow": (1.0, 0.9, 0.1),
       "white": (1.0, 1.0, 1.0), "purple": (0.7, 0.2, 1.0)}


@dataclass(frozen=True)
class Obj:
    digit: int
    colour: str
    size: str
    cell: str
    image: int  # index into the digits data
    offset: tuple[int, int] = (0, 0)  # a small digit's place inside its cell

    def key(self) -> tuple[int, str, str, str]:
        return self.digit, self.colour, self.size, self.cell


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]  # in reading order of their cells
    split: str

    @property
    def relations(self) -> list[tuple[int, str, int]]:
        out = []
        for a, b in zip(self.objects, self.objects[1:], strict=False):
            same_row = CELLS.index(a.cell) // 2 == CELLS.index(b.cell) // 2
            out.append((a.digit, "left_of" if same_row else "above", b.digit))
        return out

    def truth(self) -> list[tuple]:
        return truth([o.key() for o in self.objects], self.relations)

    def pixels(self) -> np.ndarray:
        """The scene as a (32, 32, 3) uint8 array: black ground, each digit's ink times its colour."""
        canvas = np.zeros((CANVAS, CANVAS, 3), dtype=np.float32)
        for o in self.objects:
            ink = digit_images()[o.image] / 16.0
            if o.size == "large":
                ink = np.kron(ink, np.ones((2, 2), dtype=np.float32))
            row, col = divmod(CELLS.index(o.cell), 2)
            y, x = row * CELL + o.offset[0], col * CELL + o.offset[1]
            h, w = ink.shape
            canvas[y:y + h, x:x + w] = np.maximum(canvas[y:y + h, x:x + w], ink[..., None] * np.array(RGB[o.colour]))
        return (canvas * 255).round().astype(np.uint8)

    def image(self):
        from PIL import Image

        return Image.fromarray(self.pixels(), mode="RGB")


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.images.astype(np.float32), data.target.astype(np.int64)


def digit_images() -> np.ndarray:
    return _digits()[0]


@functools.lru_cache(maxsize=2)
def _pool(split: str) -> dict[int, list[int]]:
    """Image indices of each digit class in ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown scene split {split!r}; splits: {', '.join(SPLITS)}")
    labels = _digits()[1]
    cut = int(len(labels) * TRAIN_SHARE)
    chosen = range(cut) if split == "train" else range(cut, len(labels))
    pool: dict[int, list[int]] = {d: [] for d in range(10)}
    for i in chosen:
        pool[int(labels[i])].append(i)
    return pool


def scene(rng: random.Random, split: str, objects: int | None = None) -> Scene:
    """One scene of ``objects`` digits (1 to 4; default: drawn uniformly), distinct digits in distinct cells."""
    n = objects or rng.randint(1, 4)
    if not 1 <= n <= len(CELLS):
        raise ValueError(f"a scene holds 1 to {len(CELLS)} digits, not {n}")
    pool = _pool(split)
    cells = sorted(rng.sample(range(len(CELLS)), n))
    objs = []
    for digit, cell in zip(rng.sample(range(10), n), cells, strict=True):
        size = rng.choice(SIZES)
        room = CELL - (16 if size == "large" else 8)
        objs.append(Obj(digit, rng.choice(COLOURS), size, CELLS[cell], rng.choice(pool[digit]),
                        (rng.randint(0, room), rng.randint(0, room))))
    return Scene(tuple(objs), split)


def scenes(count: int, split: str, seed: int = 0, objects: int | None = None) -> list[Scene]:
    """``count`` scenes drawn from one seeded generator (the same list for the same arguments)."""
    rng = random.Random(f"scenes:{split}:{seed}")
    return [scene(rng, split, objects) for _ in range(count)]
