"""Pasta-Lang (Jin et al., ICML 2025; notes §2): ``<promise topic="T" tokens="N"/>`` holds a place in the main stream
for a semantically independent chunk of predicted length N, ``<async>…</async>`` is the chunk, ``<sync/>`` joins.

Tags are built from six tokenizer special tokens, so a promise's topic and count are ordinary tokens between
specials and text between specials tokenizes the same inline or alone. Grammar (kept simple: one join):

    response := piece* [ <sync/> text* ]      piece := text | promise <async> text </async>

An ``<async>`` follows its promise at once; no nesting; promises only before the one ``<sync/>``. The interpreter's
main thread emits promises without their chunks (``render(..., chunks=False)``) and is read by ``StreamParser``.
No torch import here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmx.errors import UsageError

PROMISE_OPEN = '<promise topic="'
PROMISE_MID = '" tokens="'
PROMISE_CLOSE = '"/>'
ASYNC_OPEN = "<async>"
ASYNC_CLOSE = "</async>"
SYNC = "<sync/>"
SPECIALS = (PROMISE_OPEN, PROMISE_MID, PROMISE_CLOSE, ASYNC_OPEN, ASYNC_CLOSE, SYNC)
MAX_ATTR_TOKENS = 64  # a promise's topic or count longer than this in tokens is a runaway, not an attribute

_SPLIT = re.compile("|".join(re.escape(s) for s in sorted(SPECIALS, key=len, reverse=True)))
_COUNT = re.compile(r"[0-9]+")


class PastaSyntaxError(UsageError):
    """Malformed Pasta-Lang; ``reason`` is a short code (``bad-count``, ``nested-promise``, …) for the interpreter."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Promise:
    topic: str
    tokens: int
    chunk: str = ""


@dataclass(frozen=True)
class Annotated:
    """A parsed response: text and promises in order; ``<sync/>`` stands before ``main[sync]`` (None: absent)."""

    main: list[str | Promise]
    sync: int | None

    @property
    def promises(self) -> list[Promise]:
        return [p for p in self.main if isinstance(p, Promise)]


def promise_tag(topic: str, tokens: int) -> str:
    return f"{PROMISE_OPEN}{topic}{PROMISE_MID}{tokens}{PROMISE_CLOSE}"


def render(main: Sequence[str | Promise], sync: int | None = None, chunks: bool = True) -> str:
    """Annotated text of ``main`` with ``<sync/>`` before ``main[sync]``; ``chunks=False``: the main thread's view
    (promises without their ``<async>`` chunks)."""
    out = []
    for i, piece in enumerate([*main, ""]):
        if i == sync:
            out.append(SYNC)
        if isinstance(piece, Promise):
            out.append(promise_tag(piece.topic, piece.tokens))
            if chunks:
                out.append(f"{ASYNC_OPEN}{piece.chunk}{ASYNC_CLOSE}")
        else:
            out.append(piece)
    return "".join(out)


def check_topic(topic: str) -> str:
    if not topic.strip():
        raise PastaSyntaxError("a promise with an empty topic", "empty-topic")
    if '"' in topic:
        raise PastaSyntaxError(f"a promise topic contains '\"': {topic!r}", "quote-in-topic")
    return topic


def check_count(text: str) -> int:
    if not _COUNT.fullmatch(text):
        raise PastaSyntaxError(f"promise tokens must be a non-negative integer, not {text!r}", "bad-count")
    return int(text)


def _segments(text: str) -> list[tuple[str | None, str, int]]:
    """(tag, text, offset): tag is one of SPECIALS, or None for the text between them (empty texts dropped)."""
    out, at = [], 0
    for m in _SPLIT.finditer(text):
        if m.start() > at:
            out.append((None, text[at:m.start()], at))
        out.append((m.group(), m.group(), m.start()))
        at = m.end()
    if at < len(text):
        out.append((None, text[at:], at))
    return out


def _error(what: str, reason: str, at: int) -> PastaSyntaxError:
    return PastaSyntaxError(f"{what} (at character {at})", reason)


class _Reader:
    def __init__(self, text: str):
        self.segs, self.i, self.end = _segments(text), 0, len(text)

    def peek(self) -> tuple[str | None, str, int]:
        return self.segs[self.i] if self.i < len(self.segs) else ("", "", self.end)

    def text(self) -> str:
        tag, s, _ = self.peek()
        if tag is not None:
            return ""
        self.i += 1
        return s

    def expect(self, want: str, where: str) -> None:
        tag, _, at = self.peek()
        if tag == want:
            self.i += 1
            return
        if tag == "":
            raise _error(f"text ends inside {where}: expected {want!r}", "unclosed", at)
        if tag == PROMISE_OPEN:
            raise _error(f"a nested promise inside {where}", "nested-promise", at)
        if tag == ASYNC_OPEN and want == ASYNC_CLOSE:
            raise _error(f"a nested <async> inside {where}", "nested-async", at)
        got = "text" if tag is None else repr(tag)
        raise _error(f"{got} inside {where}: expected {want!r}", "unbalanced", at)


def _promise(r: _Reader) -> Promise:
    r.expect(PROMISE_OPEN, "a promise")
    topic = r.text()
    r.expect(PROMISE_MID, "a promise's attributes")
    count = r.text()
    at = r.peek()[2]
    r.expect(PROMISE_CLOSE, "a promise's attributes")
    try:
        topic, tokens = check_topic(topic), check_count(count)
    except PastaSyntaxError as e:
        raise _error(e.message, e.reason, at) from None
    tag, _, at = r.peek()
    if tag is None:
        raise _error(f"text between the promise {topic!r} and its <async>", "text-before-async", at)
    r.expect(ASYNC_OPEN, f"the promise {topic!r} (its <async> must follow it at once)")
    chunk = r.text()
    r.expect(ASYNC_CLOSE, f"the <async> of {topic!r}")
    return Promise(topic, tokens, chunk)


def parse(text: str) -> Annotated:
    """The pieces of an annotated response; ``PastaSyntaxError`` names the first problem and its character."""
    r, main, sync = _Reader(text), [], None
    while r.i < len(r.segs):
        tag, s, at = r.peek()
        if tag is None:
            r.i += 1
            main.append(s)
        elif tag == SYNC:
            if sync is not None:
                raise _error("a second <sync/>", "second-sync", at)
            sync, r.i = len(main), r.i + 1
        elif tag == PROMISE_OPEN:
            if sync is not None:
                raise _error("a promise after <sync/>", "promise-after-sync", at)
            main.append(_promise(r))
        else:
            raise _error(f"{tag!r} outside a promise", "stray-tag", at)
    return Annotated(main, sync)


def strip(text: str) -> str:
    """``text`` without its tags: the plain response, chunks in place (the text must parse)."""
    return "".join(p if isinstance(p, str) else p.chunk for p in parse(text).main)


def ids(tokenizer: Any) -> dict[str, int] | None:
    """Tag -> token id, or None when the tokenizer lacks the Pasta tokens (a model not equipped for Pasta-Lang)."""
    vocab = tokenizer.get_added_vocab()
    return {s: vocab[s] for s in SPECIALS} if all(s in vocab for s in SPECIALS) else None


def equip(tokenizer: Any, model: Any = None) -> dict[str, int]:
    """Add the six tags as special tokens (idempotent) and grow ``model``'s embeddings to the tokenizer, new rows the
    mean of the old ones (input and, when untied, output embeddings)."""
    tokenizer.add_special_tokens({"extra_special_tokens": list(SPECIALS)}, replace_extra_special_tokens=False)
    if model is not None:
        _resize(model, len(tokenizer))
    return ids(tokenizer)


def _resize(model: Any, size: int) -> None:
    import torch

    old_in = model.get_input_embeddings().weight
    n = old_in.shape[0]
    if size <= n:
        return
    out = model.get_output_embeddings()
    tied = out is not None and out.weight is old_in
    saved = [old_in.detach().clone()] + ([] if out is None or tied else [out.weight.detach().clone()])
    if out is not None and not tied and getattr(out, "bias", None) is not None:
        saved.append(out.bias.detach().clone())
    model.resize_token_embeddings(size, mean_resizing=False)
    new_out = model.get_output_embeddings()
    params = [model.get_input_embeddings().weight]
    if out is not None and not tied:
        params.append(new_out.weight)
        if getattr(new_out, "bias", None) is not None:
            params.append(new_out.bias)
    with torch.no_grad():
        for param, old in zip(params, saved, strict=True):
            param[n:] = old.float().mean(0).to(param.dtype)


@dataclass(frozen=True)
class PromiseDone:
    topic: str
    tokens: int


@dataclass(frozen=True)
class Sync:
    pass


class StreamParser:
    """The main thread's tags, one token at a time: ``feed`` returns ``PromiseDone`` when a well-formed promise
    closes, ``Sync`` at ``<sync/>``, else None; malformed tags raise ``PastaSyntaxError`` (with ``reason``)."""

    def __init__(self, tag_ids: dict[str, int], decode: Callable[[list[int]], str],
                 max_attr_tokens: int = MAX_ATTR_TOKENS):
        self.tag = {v: k for k, v in tag_ids.items()}
        self.decode, self.max_attr = decode, max_attr_tokens
        self.state, self.buf, self.topic, self.synced = "TEXT", [], "", False

    def feed(self, tok: int) -> PromiseDone | Sync | None:
        tag = self.tag.get(tok)
        if self.state == "TEXT":
            return self._text(tag)
        want = PROMISE_MID if self.state == "TOPIC" else PROMISE_CLOSE
        if tag is None:
            self.buf.append(tok)
            if len(self.buf) > self.max_attr:
                raise PastaSyntaxError(f"a promise attribute longer than {self.max_attr} tokens", "runaway-attribute")
            return None
        if tag != want:
            raise PastaSyntaxError(f"{tag!r} inside a promise's attributes", "special-in-attributes")
        text, self.buf = self.decode(self.buf), []
        if self.state == "TOPIC":
            self.topic, self.state = check_topic(text), "COUNT"
            return None
        self.state = "TEXT"
        return PromiseDone(self.topic, check_count(text))

    def _text(self, tag: str | None) -> Sync | None:
        if tag is None:
            return None
        if tag == PROMISE_OPEN:
            if self.synced:
                raise PastaSyntaxError("a promise after <sync/>", "promise-after-sync")
            self.state = "TOPIC"
            return None
        if tag == SYNC:
            if self.synced:
                raise PastaSyntaxError("a second <sync/>", "second-sync")
            self.synced = True
            return Sync()
        if tag in (ASYNC_OPEN, ASYNC_CLOSE):
            raise PastaSyntaxError(f"{tag!r} in the main thread (chunks belong to async threads)", "async-in-main")
        raise PastaSyntaxError(f"{tag!r} outside a promise", "stray-tag")
