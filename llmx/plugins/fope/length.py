"""``eval --method length``: how a causal LM's loss holds up beyond its training length T (FoPE, arXiv 2412.17739
Sec. 5: perplexity as the window grows, and retrieval from far back).

- perplexity on non-overlapping held-out windows at each of ``lengths``, cut from the same tokens (each window's
  first token is context only, so a shorter length scores a few tokens fewer);
- the mean loss per position bucket ``[0, T), [T, 2T), [2T, 4T), ...`` of the longest windows (bucket b holds the
  predictions made with b's positions as context end; the buckets tile every scored token once), and the
  degradation: last bucket minus first;
- a copy probe: a held-out segment repeated at distance d (text between), scored on the repeat after its first
  token, a retrieval check that needs no passkey fine-tune;
- ``yarn_factor``: a RoPE model evaluated with YaRN through transformers' ``rope_parameters`` (training-free).

``windows.jsonl`` holds one row per window at the longest length: its mean NLL (``nll``, whose mean over windows is
the stage's ``nll``), the NLL of its predictions made with more than T tokens of context (``nll_beyond``) and that
minus the NLL of those made within T (``degradation``): the items ``llmx compare fope`` pairs across arms, each
with its ``item`` (the digest of the window's start and token ids)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.data import token_stream
from llmx.core.eval.items import FIELD, item_id
from llmx.errors import UsageError
from llmx.plugins.fope.config import LengthParams


def buckets(train_len: int, length: int) -> list[tuple[int, int]]:
    """``[0, T), [T, 2T), [2T, 4T), ...`` up to ``length - 1`` predictions (the last bucket is cut there)."""
    out, lo, hi = [], 0, train_len
    while lo < length - 1:
        out.append((lo, min(hi, length - 1)))
        lo, hi = hi, 2 * hi
    return out


@torch.inference_mode()
def token_losses(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """NLL of ``windows[:, 1:]`` given each prefix, ``(n, length - 1)`` float32."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(device)
        logits = model(input_ids=x, use_cache=False).logits[:, :-1].float()
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").cpu())
    return torch.cat(out)


def write_windows(ctx: RunContext, windows: torch.Tensor, losses: torch.Tensor, train_len: int) -> None:
    """One row per window of ``windows`` (cut end to end from the held-out tokens; the items ``llmx compare`` pairs,
    each with its ``item``): its mean NLL, the mean NLL of its predictions past the training length (context longer
    than T), and those minus the ones within it."""
    within, beyond = losses[:, :train_len], losses[:, train_len:]  # the buckets [0, T) and [T, ...)
    rows = [{FIELD: item_id(i * len(x), x.tolist()), "nll": float(w.mean()),
             "nll_beyond": float(b.mean()) if b.numel() else None,
             "degradation": float(b.mean() - a.mean()) if b.numel() else None, "tokens": int(w.numel())}
            for i, (x, w, a, b) in enumerate(zip(windows, losses, within, beyond, strict=True))]
    atomic.write_jsonl(ctx.artifact("windows.jsonl"), rows)


def recorded_train_len(ctx: RunContext) -> int | None:
    """T from this run's fope stage, else as recorded with the model (``core.models.trained_length``)."""
    from llmx.core import models
    from llmx.plugins.fope.method import STATE_KEY

    if STATE_KEY in ctx.state:
        return int(ctx.state[STATE_KEY])
    return models.trained_length(str(ctx.config.model))


@contextlib.contextmanager
def yarn(model: torch.nn.Module, factor: float | None, train_len: int, attention_factor: float | None = None):
    """The model's rotary embedding rebuilt with YaRN for the duration (restored after)."""
    if factor is None:
        yield
        return
    from llmx.plugins.fope.attention import PositionAttention

    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or any(isinstance(m, PositionAttention) for m in model.modules()):
        raise UsageError("length: yarn_factor applies to a RoPE model (transformers' rotary attention); this model "
                         "positions its tokens otherwise")
    config = model.config
    saved = dict(config.rope_parameters)
    config.rope_parameters = {**saved, "rope_type": "yarn", "factor": float(factor), "beta_fast": 32.0,
                              "beta_slow": 1.0, "original_max_position_embeddings": train_len}
    if attention_factor is not None:
        config.rope_parameters["attention_factor"] = float(attention_factor)
    device = next(model.parameters()).device
    try:
        model.model.rotary_emb = type(rotary)(config).to(device)
        yield
    finally:
        config.rope_parameters = saved
        model.model.rotary_emb = rotary


def _copy_probe(model, stream: torch.Tensor, p: LengthParams, train_len: int, longest: int) -> dict[str, float]:
    """Mean NLL of a repeated segment's tokens (after its first) at each distance."""
    c = p.copy_len or max(2, min(train_len // 2, 32))
    distances = p.copy_distances or [d for d in (train_len // 2, train_len, 2 * train_len, 4 * train_len)
                                     if c <= d and d + c <= longest]
    if not distances or max(distances) + c > longest or min(distances) < c:
        raise UsageError(f"length: copy distances must lie in [copy_len {c}, longest length {longest} - copy_len]")
    if len(stream) < p.copy_samples * max(distances):
        raise UsageError(f"length: the held-out text has {len(stream)} tokens, too few for {p.copy_samples} copy "
                         f"samples at distance {max(distances)} (fewer copy_samples or shorter distances)")
    out = {}
    for d in distances:
        rows = []
        for i in range(p.copy_samples):
            x = stream[i * d:(i + 1) * d]
            rows.append(torch.cat([x, x[:c]]))
        losses = token_losses(model, torch.stack(rows), p.batch_size)
        out[str(d)] = float(losses[:, d:].mean())  # predictions of repeat tokens 1..c-1
    return out


def run(ctx: RunContext, p: LengthParams) -> dict[str, Any]:
    train_len = p.train_len or recorded_train_len(ctx)
    if train_len is None:
        raise UsageError("length: the model records no training length; set train_len")
    lengths = sorted(p.lengths or [train_len * m for m in (1, 2, 4, 8)])
    if lengths[0] < train_len:
        raise UsageError(f"length: lengths must not be shorter than the training length {train_len} "
                         f"(got {lengths[0]})")
    longest = lengths[-1]
    need = p.windows * longest
    tok = ctx.tokenizer
    stream = token_stream(tok, p.source or ctx.config.data.source, p.split, need + p.copy_samples * longest,
                          ctx.config.data.splitting)
    if len(stream) < need:
        raise UsageError(f"length: the held-out text has {len(stream)} tokens; {p.windows} windows of {longest} "
                         f"need {need} (fewer windows or shorter lengths)")
    tokens = stream[:need]
    model = ctx.model.eval()
    result: dict[str, Any] = {"train_len": train_len, "lengths": lengths, "windows": p.windows,
                              "tokens": need, "yarn_factor": p.yarn_factor,
                              "yarn_attention_factor": p.yarn_attention_factor}
    with yarn(model, p.yarn_factor, train_len, p.yarn_attention_factor):
        for length in ctx.progress(lengths, description="lengths"):
            n = need // length
            cut = tokens[:n * length].view(n, length)
            losses = token_losses(model, cut, p.batch_size)
            result[f"ppl@{length}"] = math.exp(float(losses.mean()))
            if length == longest:
                write_windows(ctx, cut, losses, train_len)
                result["nll"] = float(losses.mean())
                per_position = losses.mean(0)
                result["buckets"] = {f"[{lo},{hi})": float(per_position[lo:hi].mean())
                                     for lo, hi in buckets(train_len, longest)}
                result["scored_per_window"] = int(per_position.numel())
        values = list(result["buckets"].values())
        result["degradation"] = values[-1] - values[0]
        rest = stream[need:]
        result["copy_loss"] = _copy_probe(model, rest if len(rest) >= p.copy_samples * longest else stream, p,
                                          train_len, longest)
    return result
