"""Text sources: named datasets from plugins (``stdlib``) or local .txt / .jsonl files, as token streams."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmx.core.names import did_you_mean
from llmx.errors import UsageError

VALIDATION_PERCENT = 10
MIN_BLOCKS = 20  # ``auto`` reads a .txt file by lines when it has fewer blank-line blocks than this


@dataclass(frozen=True)
class TextSplit:
    """How a local file is split into train and validation. ``auto`` (the default): blank-line blocks, or lines when
    the file has fewer than ``MIN_BLOCKS`` blocks; ``blocks``; ``lines``; each unit goes to validation by a hash of
    its text (``percent``), so sorting or shuffling the file keeps the split, and consecutive units of one side are
    joined back with their separators. ``tail``: the last ``percent`` of the characters (of the rows, for .jsonl),
    the behaviour before units existed. Named datasets split themselves (``stdlib`` by file path)."""

    mode: Literal["auto", "blocks", "lines", "tail"] = "auto"
    percent: int = VALIDATION_PERCENT


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
        docs = _split_file(path, split, splitting or TextSplit())
    if not any(d.strip() for d in docs):
        hint = (" (raise data.validation_percent / --validation-percent, or split by tail)"
                if path_like(source) and split == "validation" else "")
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
    hub_split = "validation" if split == "validation" else "train"
    try:
        rows = datasets.load_dataset(path, config or None, split=hub_split)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; the user needs one line
        raise UsageError(f"cannot load dataset 'hf:{name}' ({hub_split}): {exc}") from exc
    column = "text" if "text" in rows.column_names else rows.column_names[0]
    return [r for r in rows[column] if isinstance(r, str)]


def path_like(source: str) -> bool:
    return source.endswith((".txt", ".jsonl")) or Path(source).expanduser().is_file()


def _split_file(path: Path, split: str, rule: TextSplit) -> list[str]:
    from llmx.core.data.files import json_lines, read_text

    want = split == "validation"
    if path.suffix == ".jsonl":
        texts = []
        for where, row in json_lines(path):
            if not isinstance(row.get("text"), str):
                raise UsageError(f"{where}: expected an object with a string field 'text'")
            texts.append(row["text"])
        if rule.mode == "tail":
            cut = len(texts) * (100 - rule.percent) // 100
            return texts[cut:] if want else texts[:cut]
        return [t for t in texts if in_validation(t, rule.percent) == want]
    text = read_text(path)
    if rule.mode == "tail":
        cut = len(text) * (100 - rule.percent) // 100
        return [text[cut:]] if want else [text[:cut]]
    units = text_units(text, rule.mode)
    docs, run = [], []
    for unit in units:
        if in_validation(unit.strip(), rule.percent) == want:
            run.append(unit)
        elif run:
            docs.append("".join(run))
            run = []
    if run:
        docs.append("".join(run))
    return [d.strip("\n") for d in docs if d.strip()]


def text_units(text: str, mode: str) -> list[str]:
    """The text cut into blank-line blocks or lines, each keeping the separator after it and any blank lines (joining
    them restores the text); ``auto`` takes lines when there are fewer than ``MIN_BLOCKS`` blocks."""
    if mode != "lines":
        parts = re.split(r"(\n[ \t\r\f\v]*\n\s*)", text)
        blocks = [parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)]
        blocks = [b for b in blocks if b]
        if mode == "blocks" or len(blocks) >= MIN_BLOCKS:
            return blocks
    units: list[str] = []
    for line in text.splitlines(keepends=True):
        if units and not line.strip():
            units[-1] += line
        else:
            units.append(line)
    return units


def token_stream(tokenizer: Any, source: str, split: str, max_tokens: int | None = None,
                 splitting: TextSplit | None = None):
    """All documents of a split tokenised and joined by EOS, as one 1-D LongTensor (capped at ``max_tokens``)."""
    return join_documents(tokenizer, documents(source, split, splitting), max_tokens)


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
    """``[n_samples, seq_len]`` random windows of a split's token stream (seeded)."""
    import torch

    stream = token_stream(tokenizer, source, split, max(200_000, 4 * n_samples * seq_len), splitting)
    if len(stream) <= seq_len:
        raise UsageError(f"data '{source}' has only {len(stream)} tokens; need more than {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len, (n_samples,), generator=gen)
    return torch.stack([stream[s:s + seq_len] for s in starts])
