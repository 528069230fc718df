"""Language-model scoring shared by the perplexity method and the reference zoo."""

from __future__ import annotations

import inspect
import math

import torch


def windows(n: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, first_scored)`` per window; scored target positions tile ``[1, n)`` exactly once.
    Consecutive windows overlap by at least one token, so no target lacks context."""
    out, begin, first = [], 0, 1
    while True:
        end = min(begin + seq_len, n)
        out.append((begin, end, first))
        if end >= n:
            return out
        first = end
        begin = min(begin + stride, end - 1)


@torch.inference_mode()
def sequence_nll(model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, stride: int, batch_size: int,
                 progress=lambda x, **_: x, windows_out: list | None = None) -> tuple[float, int]:
    """Summed NLL (nats) of ``tokens[1:]`` under a sliding window, and the number of tokens scored. A model that
    takes ``logits_to_keep`` (transformers' causal LMs) computes logits only for the positions a batch scores (the
    last ``seq_len - stride + 1`` of every window but the first): the same logits (bit for bit with MKL here; a BLAS
    that picks its kernel by row count may differ in the last bit), without the output layer and the softmax over
    the context positions. ``windows_out`` collects each window's ``((begin, end, first_scored), summed NLL, tokens
    scored)`` in order: the items a comparison pairs."""
    device = next(model.parameters()).device
    keeps = _takes_logits_to_keep(model)
    total, count = 0.0, 0
    spans = windows(len(tokens), seq_len, stride)
    batches = [spans[i:i + batch_size] for i in range(0, len(spans), batch_size)]
    for batch in progress(batches, description="perplexity"):
        by_len: dict[int, list] = {}
        for span in batch:
            by_len.setdefault(span[1] - span[0], []).append(span)
        for length, group in by_len.items():
            x = torch.stack([tokens[b:e] for b, e, _ in group]).to(device)
            keep = length - min(first - b for b, _, first in group) + 1  # logits from the first scoring position
            if keeps and keep < length:
                logits = model(input_ids=x, logits_to_keep=keep).logits[:, -keep:]
            else:
                logits, keep = model(input_ids=x).logits, length
            skipped = length - keep  # context positions whose logits were never made
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), x[:, skipped + 1:].flatten(),
                                                    reduction="none").view(len(group), keep - 1)
            for row, (b, _, first) in enumerate(group):
                window = float(nll[row, first - b - 1 - skipped:].sum())
                total += window
                count += length - (first - b)
                if windows_out is not None:
                    windows_out.append(((b, b + length, first), window, length - (first - b)))
    if windows_out is not None:
        windows_out.sort()
    return total, count


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def scored_bytes(tokenizer, tokens: torch.Tensor) -> int:
    """UTF-8 bytes of the text ``tokens[1:]`` (the scored tokens) encode, an end-of-document token counted as one
    byte: the denominator of bits per byte, which any two tokenizers share."""
    scored = tokens[1:]
    eos = int((scored == tokenizer.eos_token_id).sum()) if tokenizer.eos_token_id is not None else 0
    return len(tokenizer.decode(scored.tolist(), skip_special_tokens=True).encode("utf-8")) + eos


def bits_per_byte(total_nll: float, tokenizer, tokens: torch.Tensor) -> float:
    """Summed NLL (nats) of ``tokens[1:]`` in bits per byte of the text they encode."""
    return total_nll / math.log(2) / max(scored_bytes(tokenizer, tokens), 1)


def unigram_nll(train: torch.Tensor, test: torch.Tensor, vocab_size: int) -> float:
    """Mean NLL (nats) of ``test[1:]`` under add-one-smoothed unigram frequencies of ``train``: the floor a
    language model must beat."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    logp = torch.log(counts / counts.sum())
    return float(-logp[test[1:]].mean())


@torch.no_grad()
def mean_nll(model: torch.nn.Module, batch: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-token NLL over ``[n, seq]`` windows (each window scored on its own, on the model's device). From
    the logits, not ``.loss``: an MoE trained with a load-balancing loss adds it to ``.loss``."""
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, len(batch), chunk):
        x = batch[i:i + chunk].to(device)
        logits = model(input_ids=x).logits[:, :-1].float()
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item() * len(x)
    return total / len(batch)
