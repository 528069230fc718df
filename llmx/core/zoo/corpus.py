"""The text and tokenizer of a reference model: a data source's documents (capped for small presets) with a
fingerprint of their content, and a byte-level BPE trained on them unless another model's tokenizer is named."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmx.core.zoo.request import RefRequest
from llmx.errors import UsageError


@dataclass(frozen=True)
class Corpus:
    source: str
    train: list[str]
    validation: list[str]
    fingerprint: str


def corpus(req: RefRequest) -> Corpus:
    from llmx.core.data import TextSplit, documents

    rule = TextSplit(req.text_split, req.validation_percent)
    train, val = documents(req.data, "train", rule), documents(req.data, "validation", rule)
    limit = req.spec.corpus_chars
    if limit:
        train, val = cap(train, limit), cap(val, limit // 5)
    scene_docs = getattr(req.spec, "scene_docs", 0)
    if scene_docs:  # a vision-language model's text: code plus scene descriptions and QA in six languages
        from llmx.core.multimodal.qa import documents as scene_documents

        train = train + scene_documents(scene_docs, "train", req.seed)
        val = val + scene_documents(max(scene_docs // 10, 60), "test", req.seed)
    digest = hashlib.sha256()
    for doc in train + ["\0split\0"] + val:
        digest.update(doc.encode("utf-8", "replace"))
    return Corpus(req.data, train, val, digest.hexdigest()[:16])


def cap(docs: list[str], chars: int) -> list[str]:
    """Whole documents until ``chars`` characters are reached; a first document longer than that (a single-document
    ``.txt``) is cut to it."""
    out, total = [], 0
    for d in docs:
        if total >= chars:
            break
        out.append(d if out else d[:chars])
        total += len(out[-1])
    return out


def foreign_tokenizer(name: str) -> Any:
    """The tokenizer of another model: ``ref:NAME``, a local model folder or a hub id."""
    from transformers import AutoTokenizer

    if name.startswith("ref:"):
        from llmx.core.zoo import locate

        folder, local = locate(name), True
    else:
        folder = Path(name).expanduser()
        local = folder.exists() or name.startswith((".", "/", "~"))
        if local and not folder.is_dir():
            raise UsageError(f"--tokenizer: no model folder at {name}")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder) if local else name, local_files_only=local)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--tokenizer: cannot load '{name}': {first}") from exc
    if tok.eos_token_id is None:
        raise UsageError(f"--tokenizer: '{name}' has no end-of-sequence token to join documents with")
    return tok


def tokenizer_fingerprint(tok: Any) -> str:
    """16 hex digits of the tokenizer's full definition (vocabulary, merges, normaliser) and of the special ids the
    model config takes from it."""
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tok.get_vocab().items()))
    return hashlib.sha256(f"{text}\0{special_ids(tok)}".encode()).hexdigest()[:16]


def special_ids(tok: Any) -> tuple[int | None, int, int]:
    """(pad, bos, eos) for the model config. A tokenizer without its own pad token (none, or pad == eos, as GPT-2's
    and base Qwen2's) gets no pad id: the config's pad id becomes the embedding's ``padding_idx``, a zero row that
    never learns, and eos joins every document of the training stream. A missing bos is eos."""
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id not in (None, eos) else None
    return pad, tok.bos_token_id if tok.bos_token_id is not None else eos, eos
