"""What a reference model is built from: an architecture, a preset with shape overrides, a corpus, a tokenizer and a
seed. ``RefRequest`` is the ``zoo:`` section of a recipe and the options of ``llmx zoo build``; no torch import here."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import replace
from pathlib import Path

from pydantic import ConfigDict
from pydantic.dataclasses import dataclass

from llmx.core.data import TextSplit
from llmx.core.models.archs import ATTENTION_FREE, check_shape, default_kv_heads
from llmx.core.names import did_you_mean
from llmx.core.zoo.cache import cache_root
from llmx.core.zoo.presets import DEFAULT_PRESET, PRESET_DATA, PRESETS, SHAPE, Preset
from llmx.errors import UsageError

ZOO_VERSION = 2  # 2: the key holds the resolved shape and length; entries of 1 are listed as stale
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MIN_VOCAB = 259  # the 256 bytes and 3 specials of a byte-level BPE


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class RefRequest:
    arch: str
    preset: str = DEFAULT_PRESET
    seed: int = 0
    steps: int | None = None
    data: str | None = None  # None: the preset's corpus (PRESET_DATA), else stdlib
    text_split: str = "auto"
    validation_percent: int = 10
    tokens: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    tokenizer: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise UsageError(f"unknown preset '{self.preset}'.{did_you_mean(self.preset, PRESETS)}",
                             hint=f"Presets: {', '.join(PRESETS)}.")
        if self.data is None:
            object.__setattr__(self, "data", PRESET_DATA.get(self.preset, "stdlib"))
        if self.arch not in PRESETS[self.preset]:
            known = list(PRESETS[self.preset])
            raise UsageError(f"unknown reference model '{self.arch}' for the {self.preset} preset."
                             f"{did_you_mean(self.arch, known)}", hint=f"Known: {', '.join(known)}.")
        for field in ("steps", "tokens", *SHAPE):
            value = getattr(self, field)
            if value is not None and value < (2 if field == "seq_len" else 1):
                raise UsageError(f"--{field.replace('_', '-')} must be at least {2 if field == 'seq_len' else 1}")
        TextSplit(self.text_split, self.validation_percent)  # checks both
        if self.steps and self.tokens:
            raise UsageError("--steps and --tokens both set the training length; give one")
        if self.arch in ATTENTION_FREE and (self.heads or self.kv_heads):
            raise UsageError(f"{self.arch} has no attention heads: drop --heads/--kv-heads")
        if self.tokenizer and self.vocab:
            raise UsageError("--vocab sizes a tokenizer trained here; with --tokenizer the vocabulary is that one's")
        if self.vocab is not None and self.vocab < MIN_VOCAB:
            raise UsageError(f"--vocab must be at least {MIN_VOCAB} (256 bytes and 3 special tokens)")
        spec = self.spec
        problem = check_shape(self.arch, spec.hidden, spec.heads, spec.kv_heads)
        if problem:
            raise UsageError(f"cannot build {self.arch}: {problem}")
        if self.name is not None:
            if not NAME.match(self.name):
                raise UsageError(f"--name '{self.name}': letters, digits, ., _ and -, at most 64 characters")
            if self.name in builtin_names():
                raise UsageError(f"--name '{self.name}' is a built-in reference model; choose another name")
            if self.tokenizer and self.tokenizer.removeprefix("ref:") == self.name:
                raise UsageError(f"--tokenizer ref:{self.name} names the model being built")

    @property
    def spec(self) -> Preset:
        """The preset with this request's shape overrides."""
        return replace(PRESETS[self.preset][self.arch],
                       **{f: getattr(self, f) for f in SHAPE if getattr(self, f) is not None})

    @property
    def max_steps(self) -> int:
        spec = self.spec
        if self.tokens:
            return math.ceil(self.tokens / (spec.batch * spec.seq_len))
        return self.steps or spec.max_steps

    @property
    def builtin(self) -> bool:
        """Whether this is what ``ref:ARCH[-PRESET]`` builds: nothing changed but the architecture and preset."""
        return self == RefRequest(self.arch, self.preset)

    @property
    def ref_name(self) -> str | None:
        if self.name:
            return f"ref:{self.name}"
        if self.builtin:
            return f"ref:{self.arch}" + ("" if self.preset == DEFAULT_PRESET else f"-{self.preset}")
        return None

    def key(self, corpus_fingerprint: str, tokenizer_fingerprint: str | None = None) -> str:
        """12 hex digits of everything that determines the weights, resolved (a default given explicitly, or a token
        budget that comes to the same steps, is the same model); the name is an alias and does not enter."""
        spec = self.spec
        kv = None if self.arch in ATTENTION_FREE else spec.kv_heads or default_kv_heads(self.arch, spec.heads)
        shape = {**spec.as_dict(), "max_steps": self.max_steps, "kv_heads": kv}
        if self.arch in ATTENTION_FREE:
            shape.pop("heads")
        blob = {"arch": self.arch, "shape": shape, "seed": self.seed, "corpus": corpus_fingerprint, "zoo": ZOO_VERSION}
        if tokenizer_fingerprint:
            blob["tokenizer"] = tokenizer_fingerprint
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]

    def path(self, corpus_fingerprint: str, tokenizer_fingerprint: str | None = None) -> Path:
        steps = "" if self.max_steps == PRESETS[self.preset][self.arch].max_steps else f"-n{self.max_steps}"
        key = self.key(corpus_fingerprint, tokenizer_fingerprint)
        return cache_root() / f"{self.arch}-{self.preset}-s{self.seed}{steps}-{key}"

    def options(self) -> dict:
        """The fields that differ from their defaults (what a user typed)."""
        default = RefRequest(self.arch)
        return {f: getattr(self, f) for f in self.__dataclass_fields__ if f == "arch" or getattr(self, f) != getattr(default, f)}


def builtin_names() -> list[str]:
    """``llama``, ``llama-test``, ...: the names ``ref:`` knows without a build."""
    return [arch + ("" if preset == DEFAULT_PRESET else f"-{preset}") for preset, archs in PRESETS.items() for arch in archs]


def parse_builtin(name: str) -> RefRequest | None:
    """``llama`` -> the small preset; ``llama-test`` -> that preset; None when it names no built-in model."""
    arch, _, preset = name.partition("-")
    preset = preset or DEFAULT_PRESET
    return RefRequest(arch, preset) if arch in PRESETS.get(preset, {}) else None
