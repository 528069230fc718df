"""The reference zoo: small models trained from real text on the CPU, cached and verified.

``ref:NAME`` (``ref:llama``, ``ref:mamba2``, ...) loads the ``small`` preset, building it on first use; ``ref:NAME-test``
and ``ref:NAME-bench`` select the other presets. An entry lives in ``$LLMX_CACHE_DIR/zoo`` (default
``~/.cache/llmx/zoo``) under a key hashed from everything that determines it: architecture, preset, seed, steps,
a fingerprint of the corpus and the zoo's version. A manifest of SHA-256 sums is checked on every load; a corrupted
entry is rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.names import did_you_mean
from llmx.core.zoo.presets import DEFAULT_PRESET, PRESETS, Preset
from llmx.errors import UsageError

ZOO_VERSION = 1
MANIFEST, INFO = "manifest.json", "zoo.json"
log = logging.getLogger("llmx.zoo")


def cache_root() -> Path:
    base = os.environ.get("LLMX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llmx")
    return Path(base) / "zoo"


@dataclass(frozen=True)
class RefRequest:
    arch: str
    preset: str = DEFAULT_PRESET
    seed: int = 0
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise UsageError(f"unknown preset '{self.preset}'; presets: {', '.join(PRESETS)}")
        if self.arch not in PRESETS[self.preset]:
            known = list(PRESETS[self.preset])
            raise UsageError(f"unknown reference model '{self.arch}'.{did_you_mean(self.arch, known)}",
                             hint=f"Known: {', '.join(known)}.")
        if self.steps is not None and self.steps < 1:
            raise UsageError("--steps must be at least 1")

    @property
    def spec(self) -> Preset:
        return PRESETS[self.preset][self.arch]

    def key(self, corpus_fingerprint: str) -> str:
        blob = json.dumps({"arch": self.arch, "preset": self.spec.as_dict(), "seed": self.seed, "steps": self.steps,
                           "corpus": corpus_fingerprint, "zoo": ZOO_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def path(self, corpus_fingerprint: str) -> Path:
        steps = f"-n{self.steps}" if self.steps else ""
        return cache_root() / f"{self.arch}-{self.preset}-s{self.seed}{steps}-{self.key(corpus_fingerprint)}"


def corpus(spec: Preset) -> tuple[list[str], list[str], str]:
    """Train and validation documents of the standard-library corpus (capped for small presets) and a fingerprint."""
    from llmx.core.data import documents

    train, val = documents("stdlib", "train"), documents("stdlib", "validation")
    if spec.corpus_chars:
        train, val = _cap(train, spec.corpus_chars), _cap(val, spec.corpus_chars // 5)
    digest = hashlib.sha256()
    for doc in train + ["\0split\0"] + val:
        digest.update(doc.encode("utf-8", "replace"))
    return train, val, digest.hexdigest()[:16]


def _cap(docs: list[str], chars: int) -> list[str]:
    out, total = [], 0
    for d in docs:
        if total >= chars:
            break
        out.append(d)
        total += len(d)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(entry: Path) -> str | None:
    """None when the entry is complete and intact, else what is wrong with it."""
    if not entry.is_dir():
        return "missing"
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return "no readable manifest"
    for name, digest in manifest.items():
        f = entry / name
        if not f.is_file():
            return f"{name} is missing"
        if _sha256(f) != digest:
            return f"{name} does not match its checksum"
    return None


def build(req: RefRequest, show_progress: bool | None = None) -> Path:
    """Train the reference model for ``req`` and store it atomically in the cache; return its folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmx.core.data import join_documents
    from llmx.core.evaluation import sequence_nll, unigram_nll
    from llmx.core.models import quiet_transformers
    from llmx.core.models.archs import config
    from llmx.core.progress import track
    from llmx.core.tokenizer import train_bpe
    from llmx.core.zoo.train import pretrain

    spec = req.spec
    show = sys.stderr.isatty() if show_progress is None else show_progress
    train_docs, val_docs, fingerprint = corpus(spec)
    target = req.path(fingerprint)
    log.info("building ref:%s (%s preset, seed %s) into %s", req.arch, req.preset, req.seed, target)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several times faster than 2 for models this small
    try:
        tok = train_bpe(train_docs, spec.vocab)
        train_ids = join_documents(tok, train_docs)
        val_ids = join_documents(tok, val_docs)
        torch.manual_seed(req.seed)
        model = AutoModelForCausalLM.from_config(config(req.arch, len(tok), spec.hidden, spec.layers,
                                                        max_positions=max(1024, 2 * spec.seq_len)))
        result = pretrain(model, train_ids, val_ids, spec, req.seed, req.steps,
                          progress=lambda r, **kw: track(r, enabled=show, **kw))
        scored = val_ids[: 40_000 if spec.corpus_chars is None else 8_000]
        total, count = sequence_nll(model, scored, spec.seq_len, spec.seq_len // 2, batch_size=16)
        info = {
            "name": f"ref:{req.arch}", "arch": req.arch, "preset": req.preset, "seed": req.seed, "steps": req.steps,
            "preset_spec": spec.as_dict(), "corpus": {"source": "stdlib", "fingerprint": fingerprint,
                                                      "train_tokens": len(train_ids), "val_tokens": len(val_ids)},
            "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
            "steps_run": result.steps, "best_step": result.best_step, "train_seconds": round(result.seconds, 1),
            "best_val_nll": result.best_eval,
            "val_perplexity": float(torch.tensor(total / count).exp()), "val_tokens_scored": count,
            "unigram_perplexity": float(torch.tensor(unigram_nll(train_ids, scored, len(tok))).exp()),
            "zoo_version": ZOO_VERSION, "torch": torch.__version__,
        }
    finally:
        torch.set_num_threads(threads)
    quiet_transformers()
    with atomic.folder(target) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n")
        manifest = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return target


def ensure(req: RefRequest, force: bool = False, show_progress: bool | None = None) -> Path:
    """The verified cache folder for ``req``, built (or rebuilt, if corrupted) when needed."""
    _, _, fingerprint = corpus(req.spec)
    path = req.path(fingerprint)
    problem = "rebuild requested" if force else verify(path)
    if problem is None:
        return path
    if problem != "missing":
        log.warning("zoo entry %s: %s; rebuilding it", path.name, problem)
    import torch

    with torch.inference_mode(False), torch.enable_grad():  # a caller may be inside inference mode
        return build(req, show_progress)


def info(path: Path) -> dict[str, Any]:
    return json.loads((path / INFO).read_text())


def entries() -> list[dict[str, Any]]:
    """Every cached entry with its figures and whether it verifies."""
    root = cache_root()
    out = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        problem = verify(entry)
        data = info(entry) if problem is None else {}
        out.append({"entry": entry.name, "path": str(entry), "ok": problem is None, "problem": problem, **data})
    return out


def parse_name(name: str) -> RefRequest:
    """``llama`` -> small preset; ``llama-test`` / ``llama-bench`` -> that preset."""
    arch, _, preset = name.partition("-")
    return RefRequest(arch, preset or DEFAULT_PRESET)


def load(name: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """The ``ref:NAME`` model source: verified from the cache, built first if needed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmx.core.models import quiet_transformers, torch_dtype

    quiet_transformers()
    path = ensure(parse_name(name.removeprefix("ref:")))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), local_files_only=True)
    return model.to(device), AutoTokenizer.from_pretrained(path, local_files_only=True)
