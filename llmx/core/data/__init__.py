"""Text sources: named datasets from plugins (``stdlib``) or local .txt / .jsonl files, as token streams."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmx.core.names import did_you_mean
from llmx.errors import UsageError

VALIDATION_PERCENT = 10
SPLIT_MODES = ("auto", "blocks", "lines", "legacy")
SplitMode = Literal["auto", "blocks", "lines", "legacy"]
EXPECTED_HELD_UNITS = 10  # ``auto`` takes blocks when they put at least this many units in validation on average
POOL_FACTOR = 4  # random_windows draws from a pool of this many times the tokens it returns
STDLIB_IMPL = "llmx.core.data.stdlib:documents"

log = logging.getLogger("llmx.data")


@dataclass(frozen=True)
class TextSplit:
    """How a local file splits into train and validation. Units: blank-line blocks of a .txt (``blocks``), its lines
    (``lines``), or ``auto``: blocks when ``percent`` of them is at least ``EXPECTED_HELD_UNITS`` units, else lines;
    the rows of a .jsonl. Each unit goes to validation by a hash of its text, so sorting or shuffling the file keeps
    the split, and consecutive units of one side come back joined with their separators. ``legacy``: what llmx did
    before units, the last ``percent`` of a .txt's characters and .jsonl rows by a hash of file name and index. Named
    datasets split themselves (``stdlib`` by file path) and ignore this."""

    mode: SplitMode = "auto"
    percent: int = VALIDATION_PERCENT

    def __post_init__(self) -> None:
        if self.mode not in SPLIT_MODES:
            raise UsageError(f"text split must be one of {', '.join(SPLIT_MODES)}, not '{self.mode}'."
                             f"{did_you_mean(self.mode, SPLIT_MODES)}")
        if not 1 <= self.percent <= 50:
            raise UsageError(f"validation percent must be between 1 and 50, not {self.percent}")


def in_validation(key: str, percent: int = VALIDATION_PERCENT) -> bool:
    """Stable split: a document belongs to validation when the hash of its key falls in ``percent``."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100 < percent


def holdout(rows: list, fraction: float = 0.1, key=None) -> tuple[list, list]:
    """Rows split into (train, held-out) by a hash of each row's ``key(row)`` (default: its index): the same split on
    every machine; rows sharing a key (a prompt, say) land on the same side."""
    keys = [str(key(r)) if key is not None else str(i) for i, r in enumerate(rows)]
    held = [int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % 1000 < fraction * 1000 for k in keys]
    return [r for r, h in zip(rows, held, strict=True) if not h], [r for r, h in zip(rows, held, strict=True) if h]


def documents(source: str, split: str, splitting: TextSplit | None = None) -> list[str]:
    """The documents of ``split`` ('train' or 'validation') from a named dataset or a local file (split by
    ``splitting``, default ``TextSplit()``)."""
    from llmx.core.plugins import host

    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', not {split!r}")
    specs = host().datasets
    local = False
    if source.startswith("hf:"):
        docs = _hub_dataset(source.removeprefix("hf:"), split)
    elif source in specs:
        from llmx.core.spec import load_object

        docs = list(load_object(specs[source].impl)(split))
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            hint = did_you_mean(source, specs)
            raise UsageError(f"data source not found: '{source}' is neither a dataset ({', '.join(specs)}) "
                             f"nor a file.{hint}")
        from llmx.core.data.files import check_not_empty

        check_not_empty(path)
        docs, local = _split_file(path, split, splitting or TextSplit()), True
    if not any(d.strip() for d in docs):
        hint = (" (raise data.validation_percent or set data.text_split=legacy; in `llmx zoo build`: "
                "--validation-percent, --text-split)" if local else "")
        raise UsageError(f"data source '{source}' has no text in its {split} split{hint}")
    return docs


def _hub_dataset(name: str, split: str) -> list[str]:
    """``hf:NAME[:CONFIG]`` through the optional ``datasets`` package (needs it installed and a network)."""
    import importlib.util

    from llmx.errors import MissingRequirement

    if importlib.util.find_spec("datasets") is None:
        raise MissingRequirement(f"data source 'hf:{name}' needs the 'datasets' package", hint="pip install datasets")
    import datasets

    path, _, config = name.partition(":")
    try:
        rows = datasets.load_dataset(path, config or None, split=split)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; the user needs one line
        raise UsageError(f"cannot load dataset 'hf:{name}' ({split}): {exc}") from exc
    column = "text" if "text" in rows.column_names else rows.column_names[0]
    return [r for r in rows[column] if isinstance(r, str)]


def _split_file(path: Path, split: str, rule: TextSplit) -> list[str]:
    from llmx.core.data.files import json_lines, read_text

    want = split == "validation"
    if path.suffix == ".jsonl":
        texts = []
        for where, row in json_lines(path):
            if not isinstance(row.get("text"), str):
                raise UsageError(f"{where}: expected an object with a string field 'text'")
            texts.append(row["text"])
        keys = ([f"{path.name}:{i}" for i in range(len(texts))] if rule.mode == "legacy"
                else [t.strip() for t in texts])
        return [t for t, k in zip(texts, keys, strict=True) if in_validation(k, rule.percent) == want]
    text = read_text(path)
    if rule.mode == "legacy":
        cut = len(text) * (100 - rule.percent) // 100
        return [text[cut:]] if want else [text[:cut]]
    units = text_units(text, rule.mode, rule.percent)
    held = [in_validation(u.strip(), rule.percent) for u in units]
    _check_share(str(path), units, held, rule.percent)
    docs, run = [], []
    for unit, h in zip(units, held, strict=True):
        if h == want:
            run.append(unit)
        elif run:
            docs.append("".join(run))
            run = []
    if run:
        docs.append("".join(run))
    return [d.strip("\r\n") for d in docs if d.strip()]


def text_units(text: str, mode: str, percent: int = VALIDATION_PERCENT) -> list[str]:
    """The text cut into blank-line blocks or lines, each keeping the line break and blank lines after it (joining
    them restores the text; a block keeps its first line's indentation); ``auto`` takes blocks when ``percent`` of
    them is at least ``EXPECTED_HELD_UNITS``."""
    if mode != "lines":
        parts = re.split(r"(\n[ \t\r\f\v]*\n(?:[ \t\r\f\v]*\n)*)", text)
        blocks = _attach_blank([parts[i] + (parts[i + 1] if i + 1 < len(parts) else "")
                                for i in range(0, len(parts), 2)])
        if mode == "blocks" or len(blocks) * percent >= 100 * EXPECTED_HELD_UNITS:
            return blocks
    return _attach_blank(text.splitlines(keepends=True))


def _attach_blank(pieces: list[str]) -> list[str]:
    """Whitespace-only pieces joined to the unit before them (to the first unit when they lead the text)."""
    units: list[str] = []
    lead = ""
    for piece in pieces:
        if piece.strip():
            units.append(lead + piece)
            lead = ""
        elif units:
            units[-1] += piece
        else:
            lead += piece
    return units or ([lead] if lead else [])


@functools.lru_cache(maxsize=64)
def _warn_share(path: str, share: float, percent: int) -> None:
    log.warning("%s: validation holds %.1f%% of the characters, against %d%% asked: its units differ much in size "
                "(data.text_split=lines, or a higher data.validation_percent, evens it out)", path, share, percent)


def _check_share(path: str, units: list[str], held: list[bool], percent: int) -> None:
    total = sum(map(len, units))
    share = 100 * sum(len(u) for u, h in zip(units, held, strict=True) if h) / max(total, 1)
    if 0 < share < percent / 3:
        _warn_share(path, share, percent)


def token_stream(tokenizer: Any, source: str, split: str, max_tokens: int | None = None,
                 splitting: TextSplit | None = None):
    """All documents of a split tokenised and joined by EOS, as one 1-D LongTensor (capped at ``max_tokens``).
    Documents are read and tokenised only up to the cap; ``stdlib``'s come from the token cache when an earlier run
    tokenised them (``core.data.tokens``)."""
    docs = document_tokens(tokenizer, source, split, splitting)
    return _joined(docs, range(len(docs)), tokenizer.eos_token_id, max_tokens)


def join_documents(tokenizer: Any, docs: list[str], max_tokens: int | None = None):
    """Documents tokenised and joined by EOS into one 1-D LongTensor (capped at ``max_tokens``)."""
    import torch

    ids: list[int] = []
    for doc in docs:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
        if max_tokens and len(ids) >= max_tokens:
            break
    return torch.tensor(ids[:max_tokens] if max_tokens else ids, dtype=torch.long)


def document_tokens(tokenizer: Any, source: str, split: str, splitting: TextSplit | None = None):
    """The split's documents as a ``DocumentTokens`` (each tokenised on first use): ``stdlib``'s read lazily, file by
    file, and kept in the token cache under the corpus's and the tokenizer's keys; any other source's read at once
    (its documents are one call) and tokenised once per call."""
    from llmx.core.data.tokens import DocumentTokens, tokenizer_key
    from llmx.core.plugins import host

    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', not {split!r}")
    spec = host().datasets.get(source)
    if spec is not None and spec.impl == STDLIB_IMPL:
        from llmx.core.data import stdlib

        files = stdlib.corpus(split, stdlib.stdlib_root())
        if files.paths:  # (else documents() below says the split is empty)
            tok_key = tokenizer_key(tokenizer)
            key = hashlib.sha256(f"{files.key}:{tok_key}".encode()).hexdigest() if tok_key else None
            return DocumentTokens(tokenizer, files.read, len(files.paths), key, f"stdlib-{split}")
    texts = documents(source, split, splitting)
    return DocumentTokens(tokenizer, texts.__getitem__, len(texts), None)


def _joined(docs, order, eos: int, max_tokens: int | None, cut: bool = True):
    """Documents ``order`` of ``docs`` joined by EOS into a LongTensor, read until it holds ``max_tokens`` (then cut
    there when ``cut``)."""
    import torch

    end = torch.tensor([eos], dtype=torch.int32, device="cpu")
    parts, total = [], 0
    for i in order:
        parts += [docs.get(i), end]
        total += len(parts[-2]) + 1
        if max_tokens and total >= max_tokens:
            break
    docs.save()
    stream = torch.cat(parts).long() if parts else torch.empty(0, dtype=torch.long, device="cpu")
    return stream[:max_tokens] if max_tokens and cut else stream


def fixed_windows(stream, seq_len: int, n: int):
    """``[n, seq_len]`` evenly spaced windows of a token stream: the same held-out windows at every evaluation."""
    import torch

    n = min(n, (len(stream) - 1) // seq_len)
    if n < 1:
        raise UsageError(f"the held-out data has {len(stream)} tokens, fewer than one window of {seq_len}")
    starts = torch.linspace(0, len(stream) - seq_len - 1, n, device=stream.device).long()
    return torch.stack([stream[s:s + seq_len] for s in starts])


def random_windows(tokenizer, source: str, n_samples: int, seq_len: int, seed: int = 0,
                   split: str = "train", splitting: TextSplit | None = None):
    """``[n_samples, seq_len]`` random windows of a split (seeded: the same windows wherever the corpus (for the
    stdlib: the Python patch version), the tokenizer and torch's generator are the same; issue 65 changed the draw,
    so figures stored before it do not reproduce draw for draw). The split's documents are taken in a seeded random
    order and tokenised (or read from the token cache) until the pool joining them by EOS holds ``POOL_FACTOR`` times
    the tokens asked for; the windows start uniformly in that pool. So a draw tokenises about ``POOL_FACTOR`` times
    what it returns (plus the rest of the last document, which the pool keeps whole), from documents in a random
    order (a small draw: a few of them)."""
    import torch

    docs = document_tokens(tokenizer, source, split, splitting)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(docs), generator=gen, device="cpu").tolist()
    stream = _joined(docs, order, tokenizer.eos_token_id, POOL_FACTOR * n_samples * seq_len + 1, cut=False)
    if len(stream) <= seq_len:
        raise UsageError(f"data '{source}' has only {len(stream)} tokens; need more than {seq_len}")
    starts = torch.randint(0, len(stream) - seq_len, (n_samples,), generator=gen)
    return torch.stack([stream[s:s + seq_len] for s in starts])
