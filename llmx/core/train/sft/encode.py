"""Token ids and the trained-token mask of an SFT row, with one truncation policy for every row: the prompt
(everything before the last assistant turn, or the prompt field) keeps its last ``max_prompt_length`` tokens, then
the completion is cut from the right to fit ``max_length``."""

from __future__ import annotations

from dataclasses import dataclass

from llmx.core.train.sft.data import Row, segments


@dataclass
class Encoded:
    ids: list[int]
    trained: list[bool]
    prompt_cut: bool = False
    completion_cut: bool = False


def tokens(tok, row: Row) -> tuple[list[int], list[bool], int]:
    """Ids, the trained mask (assistant / completion tokens) and where the completion (the last trained run) starts."""
    ids: list[int] = []
    trained: list[bool] = []
    for text, train in segments(tok, row):
        piece = [tok.eos_token_id] if text is None else tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        trained += [train] * len(piece)
    return ids, trained, _last_run_start(trained)


def _last_run_start(trained: list[bool]) -> int:
    """Index where the last run of trained tokens begins (the final assistant turn)."""
    k = len(trained)
    while k > 0 and not trained[k - 1]:
        k -= 1
    while k > 0 and trained[k - 1]:
        k -= 1
    return k


def encode(tok, row: Row, max_length: int, max_prompt_length: int, completion_only: bool = True) -> Encoded:
    ids, trained, start = tokens(tok, row)
    prompt, completion = ids[:start], ids[start:]
    p_mask, c_mask = trained[:start], trained[start:]
    prompt_cut = len(prompt) > max_prompt_length
    if prompt_cut:
        prompt, p_mask = prompt[-max_prompt_length:], p_mask[-max_prompt_length:]
    if not prompt:
        prompt, p_mask = [tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id], [False]
    room = max_length - len(prompt)
    completion_cut = len(completion) > room
    completion, c_mask = completion[:room], c_mask[:room]
    mask = p_mask + c_mask
    if not completion_only:
        mask = [True] * len(mask)
    mask[0] = False  # the first token has no context: never a target
    return Encoded(prompt + completion, mask, prompt_cut, completion_cut)
