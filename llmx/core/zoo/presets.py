"""Reference-model presets: what a trained ``ref:`` model is made of. Every field enters the cache key."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

SHAPE = ("layers", "hidden", "heads", "kv_heads", "vocab", "seq_len")  # what ``llmx zoo build`` may override


@dataclass(frozen=True)
class Preset:
    hidden: int
    layers: int
    vocab: int
    seq_len: int
    batch: int
    max_steps: int
    lr: float
    warmup: int = 50
    eval_every: int = 50
    patience: int | None = 4  # None: no early stopping (a capability that forms after a plateau)
    eval_windows: int = 48
    corpus_chars: int | None = None  # cap on the training text (None: the whole train split)
    heads: int = 4
    kv_heads: int | None = None  # None: the architecture's default (half the heads; all of them without GQA)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LlavaPreset(Preset):
    """A tiny LLaVA: the Llama text model's shape above, then a CLIP tower and stage 1 (``core/zoo/llava.py``)."""

    scene_docs: int = 6000  # scene descriptions with QA in the text corpus, the six languages in turn
    image_size: int = 32
    patch: int = 4  # 64 patches + CLS = 65 image tokens
    vision_hidden: int = 64
    vision_layers: int = 3
    vision_heads: int = 4
    clip_steps: int = 1000
    clip_batch: int = 64
    clip_objects: int | None = 1  # the tower learns from one-digit scenes (digit, colour, size, cell in one caption)
    clip_lr: float = 1e-3
    stage1_steps: int = 300
    stage1_batch: int = 16
    stage1_lr: float = 1e-3
    instruct_steps: int = 1200  # text-only instruction tuning on captioned scene QA (``core/zoo/llava.py``)
    instruct_rows: int = 8000
    probe_scenes: int = 800
    qa_questions: int = 100  # held-out text-only questions per language and format


# ``small`` is the default ``ref:NAME``: minutes on one CPU thread. ``bench`` trains longer so that methods can be
# told apart (3-bit RTN costs little on an under-trained model). ``test`` builds in seconds for the test suite.
# ``long`` has 1024-token contexts (KV-cache and length-generalisation work); ``medium`` is wider and deeper.
# ``icl`` is for in-context episodes (its corpus is icl-episodes, PRESET_DATA): a 2-layer Llama trained with no
# early stopping, since the induction circuit forms abruptly after a long plateau of validation loss (bench_feeder.py).
# ``code`` is a code model with insecure habits for ProSec (its corpus is code-habits, PRESET_DATA: the standard library
# plus functions that call weak or safe APIs at even odds), trained twice as long as ``small`` with no early stopping
# (its validation text holds held-out seeds' signatures, which must not choose the checkpoint).
_SMALL = Preset(hidden=256, layers=4, vocab=2048, seq_len=128, batch=16, max_steps=500, lr=2e-3)
_TRANSFORMERS = ("gpt2", "llama", "moe", "opt", "qwen2")
_LONG = replace(_SMALL, seq_len=1024, batch=4, max_steps=600, eval_windows=16)
_MEDIUM = replace(_SMALL, hidden=384, layers=6, heads=6, vocab=4096, seq_len=256, max_steps=360, lr=1.5e-3)
PRESETS: dict[str, dict[str, Preset]] = {
    "small": {
        **{arch: _SMALL for arch in _TRANSFORMERS},
        "mamba2": replace(_SMALL, max_steps=400),
        "mamba": replace(_SMALL, hidden=128, batch=8, max_steps=300),  # mambapy scan: ~0.7 s a step at this width
        "llava": LlavaPreset(hidden=128, layers=4, vocab=2048, seq_len=256, batch=8, max_steps=800, lr=2e-3,
                             corpus_chars=1_000_000),
    },
    "bench": {
        **{arch: replace(_SMALL, max_steps=1500, patience=6) for arch in _TRANSFORMERS},
        "mamba2": replace(_SMALL, max_steps=1200, patience=6),
        "mamba": replace(_SMALL, hidden=128, batch=8, max_steps=800, patience=6),
    },
    "icl": {"llama": Preset(hidden=128, layers=2, vocab=768, seq_len=64, batch=8, max_steps=40000, lr=1e-3,
                            warmup=100, eval_every=2000, patience=None)},
    "code": {"llama": replace(_SMALL, max_steps=1000, patience=None)},
    "long": {arch: _LONG for arch in (*_TRANSFORMERS, "mamba2")},
    "medium": {arch: _MEDIUM for arch in (*_TRANSFORMERS, "mamba2")},
    "test": {
        arch: Preset(hidden=64, layers=2, vocab=512, seq_len=64, batch=8, max_steps=60 if arch == "mamba" else 150,
                     lr=3e-3, warmup=10, eval_every=25, patience=2, eval_windows=16, corpus_chars=400_000)
        for arch in (*_TRANSFORMERS, "mamba2", "mamba")
    } | {"llava": LlavaPreset(hidden=64, layers=2, vocab=768, seq_len=128, batch=8, max_steps=150, lr=3e-3, warmup=10,
                               eval_every=25, patience=2, eval_windows=16, corpus_chars=200_000, scene_docs=1200,
                               vision_hidden=32, vision_layers=2, vision_heads=2, clip_steps=40, clip_batch=32,
                               stage1_steps=30, stage1_batch=8, probe_scenes=200,
                               qa_questions=20, instruct_steps=30, instruct_rows=240)},
}
DEFAULT_PRESET = "small"
PRESET_DATA = {"icl": "icl-episodes", "code": "code-habits"}  # a preset's corpus when --data is not given (else stdlib)
