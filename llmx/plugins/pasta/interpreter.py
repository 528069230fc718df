"""The Pasta-Lang interpreter (notes §2, "Interpreter", and §6): a thread table over one interleaved KV cache.

Every step is one forward in which each active thread feeds its next token: one cache row (batch 1) holds every
thread's tokens in the order they were fed, visibility tables say which slots each new token sees and explicit
position ids say where it stands, so the prompt is never copied and a join only changes the tables (no copy, no
recompute). Each slot has an owner thread; a thread sees the slots of owner o below ``limits[o]``: the main thread
sees its own slots and, from the join on, every chunk's; a chunk sees what the main thread saw through its promise
and its own slots. ``attention: mask`` turns the tables into a 4-D mask for the model's own attention;
``segments`` hands them to ``attention.py`` (a CuPy kernel on CUDA, no dense mask).

- The main thread feeds the tokens it chose; ``lang.StreamParser`` reads them. When it feeds a promise's last token
  (position p), a thread is forked in the same step: it sees what the main thread sees (through that token) and
  feeds the forced ``<async>`` at p+1; the main thread's next token stands at p+1+N (``positions``: the promise's
  ``tokens`` (predicted), the given lengths (oracle) or a constant (fixed)).
- An async thread ends when it has fed ``</async>``; a promise or ``<sync/>`` inside it, EOS, or its
  ``max_chunk_tokens`` close it (the first two are recorded as errors).
- When the main thread chooses ``<sync/>`` it waits until every thread has ended; it then feeds ``<sync/>`` seeing
  every chunk. EOS with threads still running ends the main thread; the threads finish and their chunks are
  assembled after their promises (recorded: no ``<sync/>``).
- At most ``max_threads`` run at once; a later promise waits in a queue with the view it had when promised.

The critical path: forks share their promise's step, so a chunk of n tokens promised at step f ends at f+n-1 and the
sync step is one after the last chunk ends (the notes' prototype starts a thread one step after its promise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from llmx.plugins.pasta import attention, lang, layout

Positions = Literal["predicted", "oracle", "fixed"]


@dataclass
class Options:
    positions: Positions = "predicted"
    fixed_tokens: int = 32  # N for every promise with ``positions: fixed``
    lengths: list[int] | None = None  # each promise's N with ``positions: oracle``, in promise order
    max_threads: int = 8
    max_chunk_tokens: int = 256
    max_new_tokens: int = 512  # response tokens over every thread: past it the main thread ends, chunks close
    attention: Literal["mask", "segments"] = "mask"


@dataclass
class Thread:
    index: int  # 0: main; k: the k-th promise's chunk
    limits: dict[int, int]  # owner -> the first of its slots this thread does not see (absent: none seen)
    next_pos: int
    pending: int | None = None  # the token it feeds next
    fed: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    done: bool = False


@dataclass
class Result:
    main: list[int]  # the main thread's fed tokens (the response without its chunks)
    chunks: list[list[int]]  # each promise's chunk, ``<async>`` through ``</async>``
    promised: list[int]  # the N each promise's positions used
    steps: int  # forwards after the prefill
    active: list[int]  # threads fed in each step
    step_seconds: list[float]
    errors: list[str]
    slot_positions: list[int]  # the cache's position of every slot
    slot_tokens: list[int]
    slot_owners: list[int]
    cache: object
    promise_ends: list[int]  # the main thread's fed-token count at each promise's last token
    ended: str = "eos"  # why the main thread ended: eos, or cap (max_new_tokens)
    prefill_logits: torch.Tensor | None = None
    main_logits: list[torch.Tensor] | None = None
    chunk_logits: list[list[torch.Tensor]] | None = None

    @property
    def response(self) -> list[int]:
        """The assembled response: each chunk right after its promise's last token."""
        out, k = [], 0
        for i, t in enumerate(self.main, 1):
            out.append(t)
            while k < len(self.chunks) and i == self.promise_ends[k]:
                out += self.chunks[k]
                k += 1
        return out

    @property
    def tokens(self) -> int:
        return len(self.main) + sum(len(c) for c in self.chunks)

    @property
    def length_gaps(self) -> list[int]:
        """True chunk length minus the N its positions used (> 0: overlap with the main stream; < 0: a gap)."""
        return [len(c) - n for c, n in zip(self.chunks, self.promised, strict=True)]


Chooser = Callable[[Thread, torch.Tensor], int]


def greedy(thread: Thread, logits: torch.Tensor) -> int:
    return int(logits.argmax())


class Sample:
    """Sampling at ``temperature`` from a seeded generator (BoNBoN's candidates)."""

    def __init__(self, temperature: float, seed: int):
        self.temperature = temperature
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, thread: Thread, logits: torch.Tensor) -> int:
        probs = torch.softmax(logits.float().cpu() / self.temperature, -1)
        return int(torch.multinomial(probs, 1, generator=self.gen))


class Forced:
    """A scripted chooser: the main thread's response tokens and each chunk's tokens (``<async>`` through
    ``</async>``, as ``Layout.script`` gives them), in promise order; a stream past its script ends (EOS for the
    main thread, ``</async>`` for a chunk)."""

    def __init__(self, main: list[int], chunks: list[list[int]], eos: int, closing: int):
        self.main, self.chunks, self.eos, self.closing = main, chunks, eos, closing

    def __call__(self, thread: Thread, logits: torch.Tensor) -> int:
        script = self.main if thread.index == 0 else self.chunks[thread.index - 1]
        at = len(thread.fed)
        if at < len(script):
            return script[at]
        return self.eos if thread.index == 0 else self.closing


def require_attention(model) -> None:
    """Refuse a model without full attention in every layer (the threads share one cache through attention masks;
    a state-space or sliding-window layer cannot hold them apart)."""
    cfg = model.config
    kinds = set()
    for name in ("layer_types", "layers_block_type"):  # per-layer kinds (transformers' and Jamba/Zamba's names)
        kinds |= set(getattr(cfg, name, None) or [])
    kinds -= {"full_attention", "attention"}
    recurrent = any(w in getattr(cfg, "model_type", "") for w in ("mamba", "rwkv", "jamba", "zamba", "bamba"))
    if getattr(cfg, "num_attention_heads", None) is None or recurrent or kinds:
        what = f"{sorted(kinds)} layers" if kinds else "layers that are not attention"
        raise lang.PastaSyntaxError(f"{type(model).__name__} has {what}: the Pasta interpreter needs full "
                                    "attention in every layer", "no-attention")


@torch.no_grad()
def run(model, prompt: list[int], tag_ids: dict[str, int], decode: Callable[[list[int]], str], eos: int,
        opts: Options | None = None, choose: Chooser = greedy, keep_logits: bool = False) -> Result:
    """Decode one response to ``prompt`` (notes §2); ``choose`` picks each thread's next token from its logits."""
    opts = opts or Options()
    if opts.attention == "mask":
        layout.mask_kind(model)  # refuses flash attention before any forward
        return _run(model, prompt, tag_ids, decode, eos, opts, choose, keep_logits)
    before = model.config._attn_implementation
    model.set_attn_implementation(attention.register())
    try:
        return _run(model, prompt, tag_ids, decode, eos, opts, choose, keep_logits)
    finally:
        model.set_attn_implementation(before)


def _run(model, prompt, tag_ids, decode, eos, opts: Options, choose: Chooser, keep_logits: bool) -> Result:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    opening, closing, sync_id = tag_ids[lang.ASYNC_OPEN], tag_ids[lang.ASYNC_CLOSE], tag_ids[lang.SYNC]
    tags = set(tag_ids.values())
    cache = DynamicCache(config=model.config)
    n0 = len(prompt)
    slot_pos, slot_tok, slot_owner = list(range(n0)), list(prompt), [0] * n0

    def forward(tokens: list[int], positions: list[int], limits: list[dict[int, int]]):
        owner = torch.tensor(slot_owner, dtype=torch.int32, device=device)
        table = torch.tensor([[lim.get(o, 0) for o in range(max(slot_owner) + 1)] for lim in limits],
                             dtype=torch.int32, device=device)
        extra = {"pasta_owner": owner, "pasta_limit": table} if opts.attention == "segments" else {
            "attention_mask": layout.attention_mask(attention.dense(owner, table)[None], model)}
        return model(input_ids=torch.tensor([tokens], device=device), position_ids=torch.tensor([positions],
                     device=device), past_key_values=cache, use_cache=True, **extra).logits[0]

    prefill = forward(list(prompt), list(range(n0)), [{0: i + 1} for i in range(n0)])[-1]
    main = Thread(0, {0: attention.BIG}, n0)
    main.pending = _main_next(main, prefill, choose, eos)
    ended = "eos"
    threads: list[Thread] = [main]
    queue: list[tuple[int, dict[int, int], int]] = []  # promised chunks waiting for a free thread
    parser = lang.StreamParser(tag_ids, decode)
    active, seconds, errors, promised, ends = [], [], [], [], []

    def running() -> list[Thread]:
        return [t for t in threads[1:] if not t.done]

    while True:
        busy = bool(running() or queue)
        syncing = main.pending == sync_id and parser.state == "TEXT"  # not a <sync/> inside a promise's attributes
        if syncing and not busy:  # the join: main now sees every chunk
            main.limits.update({t.index: attention.BIG for t in threads[1:]})
        fed: list[Thread] = []
        if main.pending is not None and not (syncing and busy):
            tok, at, slot = main.pending, main.next_pos, len(slot_pos)
            _place(main, tok, slot_pos, slot_tok, slot_owner)
            fed.append(main)
            try:
                event = parser.feed(tok)
            except lang.PastaSyntaxError as err:
                errors.append(f"main: {err.reason}")
                synced, parser, event = parser.synced, lang.StreamParser(tag_ids, decode), None
                parser.synced = synced
            if isinstance(event, lang.PromiseDone):  # fork: the chunk takes at+1 ..., main resumes at at+1+N
                if opts.positions == "oracle" and opts.lengths is not None and len(promised) >= len(opts.lengths):
                    errors.append("main: oracle-miss")  # more promises than the oracle knows: predicted N
                n = _length(opts, event.tokens, len(promised))
                promised.append(n)
                ends.append(len(main.fed))
                seen = {o: slot + 1 for o in main.limits}  # what main saw, through the promise's last token
                queue.append((len(promised), seen, at + 1))
                main.next_pos = at + 1 + n
        while queue and len(running()) < opts.max_threads:
            k, seen, at = queue.pop(0)
            threads.append(Thread(k, {**seen, k: attention.BIG}, at, pending=opening))
        for t in running():
            _place(t, t.pending, slot_pos, slot_tok, slot_owner)
            fed.append(t)
        if not fed:
            break
        t0 = time.perf_counter()
        logits = forward([t.fed[-1] for t in fed], [slot_pos[t.slots[-1]] for t in fed], [t.limits for t in fed])
        seconds.append(time.perf_counter() - t0)
        active.append(len(fed))
        for j, t in enumerate(fed):
            if keep_logits:
                t.logits.append(logits[j].float().cpu())
            if t is main:
                main.pending = _main_next(main, logits[j], choose, eos)
            else:
                _thread_next(t, logits[j], choose, opts, errors, eos, closing, tags)
        if sum(len(t.fed) for t in threads) >= opts.max_new_tokens:  # the budget: main ends, open chunks close
            ended = "cap" if main.pending is not None else ended
            main.pending = None
            for t in running():
                if t.pending not in (None, closing):
                    errors.append(f"thread {t.index}: chunk-cap")
                    t.pending = closing
    if parser.state != "TEXT":
        errors.append("main: unfinished-promise")
    if promised and not parser.synced:
        errors.append("main: no-sync")
    ordered = sorted(threads[1:], key=lambda t: t.index)
    res = Result(main.fed, [t.fed for t in ordered], promised, len(active), active, seconds, errors, slot_pos,
                 slot_tok, slot_owner, cache, ends, ended)
    if keep_logits:
        res.prefill_logits, res.main_logits = prefill.float().cpu(), main.logits
        res.chunk_logits = [t.logits for t in ordered]
    return res


def _length(opts: Options, predicted: int, k: int) -> int:
    """The N a promise's positions skip: its prediction, the oracle's length or the fixed constant."""
    if opts.positions == "predicted":
        return predicted
    if opts.positions == "fixed":
        return opts.fixed_tokens
    if opts.lengths is None:
        raise lang.PastaSyntaxError("positions: oracle needs the chunks' lengths", "no-oracle-length")
    return opts.lengths[k] if k < len(opts.lengths) else predicted


def _place(t: Thread, tok: int, slot_pos: list[int], slot_tok: list[int], slot_owner: list[int]) -> None:
    """``t`` feeds ``tok`` into the next cache slot, at its next position."""
    t.fed.append(tok)
    t.slots.append(len(slot_pos))
    slot_pos.append(t.next_pos)
    slot_tok.append(tok)
    slot_owner.append(t.index)
    t.next_pos += 1
    t.pending = None


def _main_next(main: Thread, logits, choose: Chooser, eos: int) -> int | None:
    """The main thread's next token; None at EOS (it ends)."""
    nxt = choose(main, logits)
    return None if nxt == eos else nxt


def _thread_next(t: Thread, logits, choose: Chooser, opts: Options, errors: list[str], eos: int, closing: int,
                 tags: set[int]) -> None:
    """After ``t`` fed a token: end it at ``</async>``, else choose its next token (closing it at EOS, at a tag it
    may not emit, or at ``max_chunk_tokens``): a thread only ever feeds text, its forced ``<async>`` and
    ``</async>``."""
    if t.fed[-1] == closing:
        t.done = True
        return
    nxt = choose(t, logits)
    if nxt in tags and nxt != closing:
        errors.append(f"thread {t.index}: tag-in-thread")
        nxt = closing
    if nxt != closing and (nxt == eos or len(t.fed) + 1 >= opts.max_chunk_tokens):
        errors.append(f"thread {t.index}: {'eos' if nxt == eos else 'chunk-cap'}")
        nxt = closing
    t.pending = nxt
