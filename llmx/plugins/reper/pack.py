"""One packed forward per dialogue: the whole dialogue tokenised as the ``llava`` trainer tokenises a conversation
(the chat template, ``<image>`` expanded, loss on the assistant turns), each response's tokens a turn mask. When a
dialogue exceeds ``max_length`` its earliest responses are dropped, each with the feedback after it, never the
image tokens or the last turn; a last turn that still does not fit is cut from the right."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmx.core.multimodal.batch import Example, collate, examples
from llmx.core.multimodal.model import IMAGE_TOKEN, text_tokenizer
from llmx.core.train.sft.data import Row
from llmx.core.train.sft.encode import tokens
from llmx.errors import UsageError
from llmx.plugins.reper.dialogues import Dialogue
from llmx.plugins.reper.loss import linear_sigma, score_sigma


@dataclass
class Packed:
    example: Example
    spans: list[tuple[int, int]]  # [start, end) token positions of each kept response (EOS included)
    kept: list[int]  # positions in the dialogue's answers
    sigma: list[float]


def runs(trained: list[bool]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of trained tokens: one per assistant turn."""
    out, start = [], None
    for k, flag in enumerate([*trained, False]):
        if flag and start is None:
            start = k
        elif not flag and start is not None:
            out.append((start, k))
            start = None
    return out


def sigmas(d: Dialogue, schedule: str) -> list[float]:
    """Each answer's sigma: ``linear`` t/T, ``score`` the normalised critic score, ``data`` the row's own."""
    if schedule == "linear":
        return linear_sigma(d.turns, len(d.answers))
    values = d.scores if schedule == "score" else d.sigmas
    if any(v is None for v in values):
        raise UsageError(f"{d.where}: sigma: {schedule} needs a {'score' if schedule == 'score' else 'sigma'} on "
                         "every answer")
    return score_sigma(values) if schedule == "score" else list(values)


def pack(proc, d: Dialogue, image_tokens: int, max_length: int, schedule: str) -> Packed:
    tok = text_tokenizer(proc)
    keep = list(range(len(d.answers)))
    while len(keep) > 1 and len(_ids(tok, d, keep, image_tokens)) > max_length:
        keep = keep[1:]
    e = examples(proc, [d.conversation(keep)], image_tokens, max_length)[0]
    spans = runs(e.row.trained)
    if len(spans) != len(keep):
        raise ValueError(f"{d.where}: {len(spans)} trained runs for {len(keep)} answers")
    s = sigmas(d, schedule)
    return Packed(e, spans, keep, [s[k] for k in keep])


def _ids(tok, d: Dialogue, keep: list[int], image_tokens: int) -> list[int]:
    conv = d.conversation(keep)
    msgs = [{**m, "content": m["content"].replace(IMAGE_TOKEN, IMAGE_TOKEN * image_tokens)} for m in conv.messages]
    return tokens(tok, Row(d.where, messages=msgs))[0]


@dataclass
class Batch:
    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask, labels (the answers: a router must not read them), pixel_values
    turn_masks: torch.Tensor  # [B, T, L-1] over token_logps positions
    sigma: torch.Tensor  # [B, T]
    ul_masks: torch.Tensor  # [B, T, L-1]: the tokens the unlikelihood term reads


def batch(items: list[Packed], pad_id: int, device, eos_id: int | None = None, differing: bool = False) -> Batch:
    """Padded dialogues with their turn masks. The unlikelihood masks leave out each answer's EOS (``eos_id``: the
    best answer ends with it too) and, with ``differing``, every token the dialogue's best answer holds."""
    inputs = collate([p.example for p in items], pad_id, device)
    width = inputs["input_ids"].shape[1] - 1
    turns = max(len(p.spans) for p in items)
    masks = torch.zeros(len(items), turns, width)
    ul = torch.zeros_like(masks)
    sigma = torch.zeros(len(items), turns)
    for i, p in enumerate(items):
        ids = p.example.row.ids
        best = set(ids[slice(*p.spans[-1])]) if differing else set()
        for t, (a, b) in enumerate(p.spans):
            masks[i, t, a - 1:b - 1] = 1
            sigma[i, t] = p.sigma[t]
            ul[i, t, a - 1:b - 1] = torch.tensor([float(x != eos_id and x not in best) for x in ids[a:b]])
    return Batch(inputs, masks.to(device), sigma.to(device), ul.to(device))
