"""Token ids and the trained-token mask of an SFT row.

The row's text is tokenised as a whole, as it is at inference (TRL's SFT does the same), not piece by piece: the
pieces' character spans (``return_offsets_mapping``) say which tokens are trained, and a token that overlaps a
trained piece is trained (``"Answer:" + " yes"`` gives ``["Answer", ":", " yes"]`` with `` yes`` trained). EOS
markers are inserted as ids; the special tokens the tokenizer puts in front by default (BOS) start plain rows (a
chat template writes its own). A slow tokenizer (no offset mapping) tokenises each piece on its own.

One truncation policy for every row: the prompt (everything before the last trained run: the last assistant turn,
or the completion) keeps its leading special tokens and its last tokens up to ``max_prompt_length``, then the
completion is cut from the right to fit ``max_length``.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmx.core.tokenizer import leading_specials
from llmx.core.train.sft.data import Row, segments


@dataclass
class Encoded:
    ids: list[int]
    trained: list[bool]
    prompt_cut: bool = False
    completion_cut: bool = False


def _chunk(tok, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    text = "".join(t for t, _ in pieces)
    if not text:
        return [], []
    if not getattr(tok, "is_fast", False):  # no offset mapping: each piece on its own (may split a token)
        ids, flags = [], []
        for t, train in pieces:
            piece = tok(t, add_special_tokens=False)["input_ids"]
            ids, flags = ids + piece, flags + [train] * len(piece)
        return ids, flags
    spans, at = [], 0
    for t, train in pieces:
        spans.append((at, at + len(t), train))
        at += len(t)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    flags = []
    for a, b in enc["offset_mapping"]:
        flags.append(any(train and (a < e and s < b if b > a else s <= a < e) for s, e, train in spans))
    return list(enc["input_ids"]), flags


def tokens(tok, row: Row) -> tuple[list[int], list[bool], int, int]:
    """Ids, the trained mask, the number of leading special tokens and where the last trained run starts."""
    templated = row.messages is not None and getattr(tok, "chat_template", None)
    lead = [] if templated else leading_specials(tok)
    ids, trained = list(lead), [False] * len(lead)
    pending: list[tuple[str, bool]] = []
    for text, train in segments(tok, row) + [(None, None)]:
        if text is not None:
            pending.append((text, train))
            continue
        chunk_ids, chunk_flags = _chunk(tok, pending)
        ids, trained, pending = ids + chunk_ids, trained + chunk_flags, []
        if train is not None:  # an EOS marker (the sentinel at the end adds nothing)
            ids.append(tok.eos_token_id)
            trained.append(train)
    n = len(lead)
    if templated:  # the template's own leading specials (BOS, a header token) survive truncation as BOS does
        special = set(tok.all_special_ids)
        while n < len(ids) and ids[n] in special and not trained[n]:
            n += 1
    return ids, trained, n, _last_run_start(trained)


def _last_run_start(trained: list[bool]) -> int:
    """Index where the last run of trained tokens begins (the final assistant turn)."""
    k = len(trained)
    while k > 0 and not trained[k - 1]:
        k -= 1
    while k > 0 and trained[k - 1]:
        k -= 1
    return k


def encode(tok, row: Row, max_length: int, max_prompt_length: int, completion_only: bool = True) -> Encoded:
    ids, trained, lead, start = tokens(tok, row)
    prompt, completion = ids[:start], ids[start:]
    p_mask, c_mask = trained[:start], trained[start:]
    prompt_cut = len(prompt) > max_prompt_length
    if prompt_cut:
        keep = max(max_prompt_length - lead, 0)
        prompt = prompt[:lead][:max_prompt_length] + (prompt[len(prompt) - keep:] if keep else [])
        p_mask = p_mask[:lead][:max_prompt_length] + (p_mask[len(p_mask) - keep:] if keep else [])
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
