"""Token ids of a corpus's documents under one tokenizer, each document tokenised once and kept on disk.

A cache file holds the documents tokenised so far (any subset: a caller tokenises only the documents it reads), under
``$LLMX_CACHE_DIR/data/tokens`` (default ``~/.cache/llmx/data/tokens``). Its name and its header carry one key, a
hash of the corpus key (for ``stdlib``: the Python, the folder and every file's path, size and mtime) and the
tokenizer's identity (its class, end-of-document id, full serialisation and the ids of a probe text): another
tokenizer or an edited corpus reads another file, never this one's ids. A file that does not parse, whose key,
length or checksum does not match, is ignored (and replaced at the next write). Writes go to a temporary file
renamed over the old one (``core.atomic``), after merging what another process wrote since: concurrent runs never
see a half-written file, and at worst one's additions are tokenised again later.

Layout: ``MAGIC``, the header's length (8 bytes, little endian), the header (JSON: format, key, ``docs`` as
``[index, offset, length]`` rows, the byte order, CRC-32 of the payload), then the payload: every document's ids as
int32 in that byte order (a file from a host of the other order is ignored).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FORMAT = 1
MAGIC = b"LLMXTOKS"
PROBE = "def f(x):\n    return {'a': x ** 2}  # \u00e9\u4e2d\n\n\tclass A: pass\r\n"
log = logging.getLogger("llmx.data")

_identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_loaded: OrderedDict[str, dict[int, torch.Tensor]] = OrderedDict()  # cache key -> ids read or made in this process
KEEP_LOADED = 2


def cache_dir() -> Path:
    """Beside the zoo, under the same root (``LLMX_CACHE_DIR``, else ``$XDG_CACHE_HOME/llmx``, else ~/.cache/llmx)."""
    from llmx.core.zoo.cache import cache_root

    return cache_root().parent / "data" / "tokens"


@functools.cache
def _library_versions() -> tuple[str | None, ...]:
    """tokenizers' and transformers' versions: two of them may serialise alike and still split differently."""
    from importlib import metadata

    out = []
    for dist in ("tokenizers", "transformers"):
        try:
            out.append(metadata.version(dist))
        except metadata.PackageNotFoundError:
            out.append(None)
    return tuple(out)


def tokenizer_key(tok: Any) -> str | None:
    """A hash of everything that decides ``tok(text, add_special_tokens=False)`` and the end-of-document id: the
    class, the EOS id, the backend's full serialisation (vocabulary, merges, normaliser, pre-tokenizer, added tokens),
    whether special tokens are split, the tokenizers and transformers versions, and the ids of ``PROBE`` plus the
    special tokens (catching preprocessing done in Python). ``None`` for a tokenizer with no serialisation (a slow
    one): its documents are not cached."""
    backend = getattr(tok, "backend_tokenizer", None)
    if not callable(getattr(backend, "to_str", None)):
        return None
    try:
        specials = "".join(getattr(tok, "all_special_tokens", []) or [])  # split or kept whole: what the probe shows
        probe = list(tok(PROBE + specials, add_special_tokens=False)["input_ids"])
        size = len(tok)
        known = _identities.get(tok)
        if known is None or known[0] != size:
            known = (size, hashlib.sha256(backend.to_str().encode()).hexdigest())
            _identities[tok] = known
    except Exception as exc:  # noqa: BLE001 - an exotic tokenizer: uncached, never wrong
        log.debug("tokenizer not cacheable (%s: %s)", type(exc).__name__, exc)
        return None
    ident = {"class": f"{type(tok).__module__}.{type(tok).__qualname__}", "eos": tok.eos_token_id,
             "backend": known[1], "probe": probe, "libraries": _library_versions(),
             "split_special": getattr(backend, "encode_special_tokens", None)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


class DocumentTokens:
    """``get(i)``: document ``i``'s ids (int32, without EOS), from memory, the cache file, or the tokenizer (then kept
    until ``save()``). ``key=None``: nothing is read or written (the ids are still made once per object)."""

    def __init__(self, tokenizer: Any, text: Callable[[int], str], count: int, key: str | None, name: str = "corpus"):
        self.tokenizer, self.text, self.count, self.key = tokenizer, text, count, key
        self.path = cache_dir() / f"{name}-{key[:32]}.bin" if key else None
        self.tokenized = 0  # documents this object tokenised (the rest came from a cache)
        self.tokens_made = 0
        self._new: dict[int, torch.Tensor] = {}
        if key is None:
            self._ids: dict[int, torch.Tensor] = {}
        elif key in _loaded:
            _loaded.move_to_end(key)
            self._ids = _loaded[key]
        else:
            self._ids = _read(self.path, key) or {}
            _loaded[key] = self._ids
            while len(_loaded) > KEEP_LOADED:
                _loaded.popitem(last=False)

    def __len__(self) -> int:
        return self.count

    def get(self, i: int) -> torch.Tensor:
        ids = self._ids.get(i)
        if ids is None:
            made = self.tokenizer(self.text(i), add_special_tokens=False)["input_ids"]
            ids = torch.tensor(made, dtype=torch.int32, device="cpu")
            self._ids[i] = self._new[i] = ids
            self.tokenized += 1
            self.tokens_made += len(ids)
        return ids

    def save(self) -> None:
        """Write the documents tokenised since the last save (merged with the file as it is now)."""
        if not self._new or self.path is None:
            return
        merged = {**(_read(self.path, self.key) or {}), **self._ids}
        try:
            _write(self.path, self.key, merged)
        except OSError as exc:  # a read-only or full cache: the run goes on, tokenising again next time
            log.warning("cannot write the token cache %s: %s", self.path, exc.strerror or exc)
        self._new = {}


def _read(path: Path, key: str) -> dict[int, torch.Tensor] | None:
    """The file's documents, or None when it is missing or is not a whole file of this key."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if data[:len(MAGIC)] != MAGIC:
            raise ValueError("not a token cache")
        start = len(MAGIC) + 8
        size = int.from_bytes(data[len(MAGIC):start], "little")
        head = json.loads(data[start:start + size])
        payload = memoryview(data)[start + size:]
        if head.get("format") != FORMAT or head.get("key") != key or head.get("byteorder") != sys.byteorder:
            raise ValueError("another format or key")
        docs = head["docs"]
        if (len(payload) != 4 * sum(n for _, _, n in docs) or zlib.crc32(payload) != head["crc32"]
                or any(off < 0 or n < 0 or off + n > len(payload) // 4 for _, off, n in docs)):
            raise ValueError("truncated or damaged")
        flat = torch.frombuffer(bytearray(payload), dtype=torch.int32) if len(payload) else torch.empty(
            0, dtype=torch.int32, device="cpu")
        return {int(i): flat[off:off + n] for i, off, n in docs}
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        log.debug("ignoring the token cache %s (%s)", path, exc)
        return None


def _write(path: Path, key: str, docs: dict[int, torch.Tensor]) -> None:
    from llmx.core import atomic

    rows, parts, offset = [], [], 0
    for i in sorted(docs):
        ids = docs[i]
        rows.append([i, offset, len(ids)])
        parts.append(ids)
        offset += len(ids)
    flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int32, device="cpu")
    payload = flat.cpu().numpy().tobytes()
    head = json.dumps({"format": FORMAT, "key": key, "byteorder": sys.byteorder, "docs": rows,
                       "crc32": zlib.crc32(payload)}).encode()
    atomic.write_bytes(path, MAGIC + len(head).to_bytes(8, "little") + head + payload)
