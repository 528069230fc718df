"""Batched completion of prompts for any causal LM: greedy or seeded sampling, stop strings, prompt budgets.

Sampling draws every completion from its own generator, seeded by ``(seed, prompt index, sample index)``, so a
completion does not depend on which others share its batch. Decoding goes through ``model.generate`` (its caches
and position handling serve every architecture), with the draw done by a logits processor and greedy selection
of the drawn token (up to the floating-point differences of batched kernels, bf16 on a GPU above all). Prompts are
encoded as in training (the tokenizer's own special tokens), left-padded in a batch; stateful models (Mamba and
the other recurrent ones transformers marks ``_is_stateful``), whose state padding would enter, batch only prompts
of equal length. A prompt longer than the model's context less ``max_new_tokens`` keeps its last tokens, and the
completion says so.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from llmx.errors import UsageError

LENGTH_FIELDS = ("n_positions", "max_position_embeddings", "n_ctx")  # checked in this order, as lm-eval does


@dataclass(frozen=True)
class Completion:
    text: str
    stop: str | None  # the stop string that ended it, "eos", or None: the token budget ran out
    ids: tuple[int, ...] = ()  # the tokens sampled, an EOS included (what a token-level KL scores)
    prompt_tokens: int = 0  # the prompt's last tokens the model saw
    truncated: bool = False  # the prompt lost its first tokens to fit the context

    @property
    def tokens(self) -> int:
        """New tokens generated."""
        return len(self.ids)


def row_seed(seed: int, prompt: int, sample: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{prompt}:{sample}".encode(), digest_size=8).digest(), "big") >> 1


def eos_ids(model, tok) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    return {int(i) for i in [*ids, tok.eos_token_id] if i is not None}


def context_limit(model) -> int | None:
    """The model's context length from its config (a composite config's ``text_config`` first), or None."""
    for cfg in (getattr(model.config, "text_config", None), model.config):
        for name in LENGTH_FIELDS:
            value = getattr(cfg, name, None) if cfg is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def cut(text: str, stop: Sequence[str], include_stop: bool) -> tuple[str, str | None]:
    """``text`` up to its earliest stop string (kept when ``include_stop``), and that string."""
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at + (len(s) if include_stop else 0)], s


class StopStrings:
    """Stopping criterion: a row is done once the tail of its new text holds a stop string (one transfer from the
    device per step; only the last tokens are decoded, and the final cut decodes the whole completion anyway)."""

    def __init__(self, tok, start: int, stop: Sequence[str]):
        self.tok, self.start, self.stop = tok, start, [s for s in stop if s]
        self.tail = 4 * max(len(s) for s in self.stop) + 4

    def __call__(self, input_ids: torch.Tensor, scores, **_) -> torch.Tensor:
        rows = input_ids[:, max(self.start, input_ids.shape[1] - self.tail):].tolist()
        done = [any(s in self.tok.decode(row, skip_special_tokens=True) for s in self.stop) for row in rows]
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
        pick = torch.stack([torch.multinomial(row, 1, generator=g) for row, g in zip(probs, self.generators, strict=True)])
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
    cfg.update(do_sample=False, num_beams=1, num_return_sequences=1, return_dict_in_generate=False, temperature=None,
               top_p=None, top_k=None, repetition_penalty=None, no_repeat_ngram_size=None, max_new_tokens=max_new_tokens,
               max_length=None, min_length=0, min_new_tokens=None, pad_token_id=pad, eos_token_id=sorted(eos) or None)
    return cfg


@torch.inference_mode()
def generate(model, tok, prompts: Sequence[str], *, max_new_tokens: int, samples: int = 1, temperature: float = 0.0,
             top_p: float = 1.0, stop: Sequence[str] = (), include_stop: bool = False, seed: int = 0, batch_size: int = 8,
             progress: Callable = lambda x, **_: x, inputs: Callable[[list[int]], dict] | None = None,
             special_tokens: bool = True, truncate: bool = True) -> list[list[Completion]]:
    """``samples`` completions of each prompt, ``[prompt][sample]``; ``temperature == 0`` is greedy decoding.
    ``inputs(prompt indices)`` gives a batch's other model inputs in row order (a vision model's pixel values);
    ``special_tokens: False`` leaves the tokenizer's own specials out (a chat template already holds them);
    ``truncate: False`` refuses a prompt over the context instead of keeping its last tokens (image tokens)."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    if temperature == 0 and samples > 1:
        raise UsageError(f"greedy decoding (temperature 0) gives one completion per prompt, not {samples}; set "
                         "temperature > 0 to sample several")
    device = next(model.parameters()).device
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos, default=0)
    limit = context_limit(model)
    if limit and max_new_tokens >= limit:
        raise UsageError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in this model's context of "
                         f"{limit} tokens")
    budget = limit - max_new_tokens if limit else None
    encoded = [tok(p, add_special_tokens=special_tokens)["input_ids"] for p in prompts]
    truncated = [budget is not None and len(ids) > budget for ids in encoded]
    if not truncate and any(truncated):
        i = truncated.index(True)
        raise UsageError(f"prompt {i} has {len(encoded[i])} tokens: over this model's context of {limit} less "
                         f"max_new_tokens {max_new_tokens}")
    encoded = [ids[-budget:] if cut_ else ids for ids, cut_ in zip(encoded, truncated, strict=True)]
    rows = [(i, j) for i in range(len(prompts)) for j in range(samples)]
    equal_only = bool(getattr(model, "_is_stateful", False))
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
        criteria = StoppingCriteriaList([StopStrings(tok, width, stop)] if any(stop) else [])
        extra = inputs([rows[r][0] for r in batch]) if inputs else {}
        gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=_config(model, max_new_tokens, pad, eos),
                             logits_processor=processors, stopping_criteria=criteria, **extra)
        for b, r in enumerate(batch):
            new = gen[b, width:].tolist()
            ended = next((k for k, t in enumerate(new) if t in eos), None)
            if ended is not None and cut(tok.decode(new[:ended], skip_special_tokens=True), stop, include_stop)[1]:
                ended = None  # a stop string came first: this EOS is the padding of a finished row (pad == EOS)
            sampled = new if ended is None else new[:ended + 1]
            while ended is None and sampled and sampled[-1] in (pad, *eos):  # a row a stop string ended is padded
                sampled.pop()
            text, hit = cut(tok.decode(sampled, skip_special_tokens=True), stop, include_stop)
            i, j = rows[r]
            out[i][j] = Completion(text, hit or ("eos" if ended is not None else None), tuple(sampled),
                                   len(encoded[i]), truncated[i])
    return out  # type: ignore[return-value]
