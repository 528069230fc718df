"""Batched completion of prompts for any causal LM: greedy or seeded sampling, stop strings, prompt budgets.

Sampling draws every completion from its own generator, seeded by ``(seed, prompt index, sample index)``, so a
completion does not depend on which others share its batch. Decoding goes through ``model.generate`` (its caches
and position handling serve every architecture), with the draw done by a logits processor and greedy selection
of the drawn token. Prompts are encoded as in training (the tokenizer's own special tokens), left-padded in a batch;
recurrent models (Mamba), whose state padding would enter, batch only prompts of equal length. A prompt longer than
the model's context less ``max_new_tokens`` keeps its last tokens, and the completion says so.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

RECURRENT = ("mamba", "mamba2", "falcon_mamba")


@dataclass(frozen=True)
class Completion:
    text: str
    stop: str | None  # the stop string that ended it, "eos", or None: the token budget ran out
    tokens: int  # new tokens generated
    truncated: bool = False  # the prompt lost its first tokens to fit the context


def row_seed(seed: int, prompt: int, sample: int) -> int:
    return ((seed * 1_000_003 + prompt) * 1_009 + sample) % (2**63)


def _eos_ids(model, tok) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    return {int(i) for i in [*ids, tok.eos_token_id] if i is not None}


def context_limit(model) -> int | None:
    cfg = model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def cut(text: str, stop: Sequence[str], include_stop: bool) -> tuple[str, str | None]:
    """``text`` up to its earliest stop string (kept when ``include_stop``), and that string."""
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at + (len(s) if include_stop else 0)], s


class _Stop:
    """Stopping criterion: a row is done once its new text holds a stop string."""

    def __init__(self, tok, start: int, stop: Sequence[str]):
        self.tok, self.start, self.stop = tok, start, [s for s in stop if s]

    def __call__(self, input_ids: torch.Tensor, scores, **_) -> torch.Tensor:
        done = [any(s in self.tok.decode(row[self.start:], skip_special_tokens=True) for s in self.stop)
                for row in input_ids]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class _Draw:
    """Logits processor that samples each row from its own generator (temperature, then nucleus ``top_p``) and
    leaves only the drawn token, which greedy selection then takes."""

    def __init__(self, generators: list[torch.Generator], temperature: float, top_p: float):
        self.generators, self.temperature, self.top_p = generators, temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p >= self.top_p  # the smallest set reaching top_p is kept
            probs = probs.scatter(-1, order, sorted_p.masked_fill(outside, 0.0))
        u = torch.stack([torch.rand((), generator=g, device=g.device) for g in self.generators]).to(probs.device)
        cdf = probs.cumsum(-1)
        pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_max(probs.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter(-1, pick, 0.0)


def _batches(lengths: list[int], batch_size: int, equal_only: bool) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    out: list[list[int]] = []
    for r in order:
        if out and len(out[-1]) < batch_size and (not equal_only or lengths[out[-1][0]] == lengths[r]):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _config(model, max_new_tokens: int, pad: int, eos: set[int]):
    cfg = copy.deepcopy(model.generation_config)
    cfg.update(do_sample=False, num_beams=1, temperature=None, top_p=None, top_k=None, repetition_penalty=None,
               no_repeat_ngram_size=None, max_new_tokens=max_new_tokens, max_length=None, min_new_tokens=None,
               pad_token_id=pad, eos_token_id=sorted(eos) or None)
    return cfg


@torch.inference_mode()
def generate(model, tok, prompts: Sequence[str], *, max_new_tokens: int, samples: int = 1, temperature: float = 0.0,
             top_p: float = 1.0, stop: Sequence[str] = (), include_stop: bool = False, seed: int = 0, batch_size: int = 8,
             progress: Callable = lambda x, **_: x) -> list[list[Completion]]:
    """``samples`` completions of each prompt, ``[prompt][sample]``; ``temperature == 0`` is greedy decoding."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    if temperature == 0 and samples > 1:
        raise ValueError("greedy decoding gives one completion per prompt; set temperature > 0 for several samples")
    device = next(model.parameters()).device
    eos = _eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos, default=0)
    limit = context_limit(model)
    budget = max(limit - max_new_tokens, 1) if limit else None
    encoded = [tok(p)["input_ids"] for p in prompts]
    truncated = [budget is not None and len(ids) > budget for ids in encoded]
    encoded = [ids[-budget:] if cut_ else ids for ids, cut_ in zip(encoded, truncated, strict=True)]
    rows = [(i, j) for i in range(len(prompts)) for j in range(samples)]
    equal_only = getattr(model.config, "model_type", "") in RECURRENT
    out: list[list[Completion | None]] = [[None] * samples for _ in prompts]
    for batch in progress(_batches([len(encoded[i]) for i, _ in rows], batch_size, equal_only), description="generating"):
        width = max(len(encoded[rows[r][0]]) for r in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
        for b, r in enumerate(batch):
            seq = encoded[rows[r][0]]
            ids[b, width - len(seq):] = torch.tensor(seq, dtype=torch.long, device=device)
            mask[b, width - len(seq):] = 1
        processors = LogitsProcessorList()
        if temperature > 0:
            gens = [torch.Generator(device=device).manual_seed(row_seed(seed, *rows[r])) for r in batch]
            processors.append(_Draw(gens, temperature, top_p))
        criteria = StoppingCriteriaList([_Stop(tok, width, stop)] if any(stop) else [])
        gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config(model, max_new_tokens, pad, eos),
                             logits_processor=processors, stopping_criteria=criteria)
        for b, r in enumerate(batch):
            new = gen[b, width:].tolist()
            ended = next((k for k, t in enumerate(new) if t in eos), None)
            new = new if ended is None else new[:ended]
            while ended is None and new and new[-1] == pad:  # a row a stop string ended is padded to the batch's end
                new.pop()
            text, hit = cut(tok.decode(new, skip_special_tokens=True), stop, include_stop)
            i, j = rows[r]
            out[i][j] = Completion(text, hit or ("eos" if ended is not None else None), len(new), truncated[i])
    return out  # type: ignore[return-value]
