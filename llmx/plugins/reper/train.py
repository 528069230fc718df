"""The align stage on reflection dialogues: RPL (reflective unlikelihood, one packed forward per dialogue) and, on
the same rows, loop and trainable set, the baselines the paper compares with: SFT on every answer, SFT on the best
answer alone, DPO on (best, worst) answers to the question and LiPO-lambda on every answer of a dialogue as a
ranked list of answers to the question (the shared losses, the reference's log-probs computed once before training,
so no copy of the weights is kept)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmx.core import preference as P
from llmx.core.data.sampling import EpochOrder
from llmx.core.multimodal import train as T
from llmx.core.multimodal.batch import Example, collate, examples
from llmx.core.train.parallel import device_of
from llmx.errors import UsageError
from llmx.plugins.reper.config import RPLParams
from llmx.plugins.reper.dialogues import Dialogue
from llmx.plugins.reper.loss import reflective_unlikelihood
from llmx.plugins.reper.pack import Packed, batch


def _device(model) -> torch.device:
    return device_of(model)


def rpl_loss(model, packs: list[Packed], p: RPLParams, seed: int, pad: int, eos: int) -> Callable[[int], tuple]:
    """Micro-batch ``i``'s mean reflective-unlikelihood loss over its dialogues (a pure function of ``i``)."""
    order = EpochOrder(len(packs), seed)

    def loss(i: int):
        b = batch([packs[k] for k in order.batch(i, p.batch_size)], pad, _device(model), eos, p.ul_tokens == "differing")
        lp = P.token_logps(model(**b.inputs).logits, b.inputs["input_ids"])
        value, stats = reflective_unlikelihood(lp, b.turn_masks, b.sigma, p.alpha, p.eps, p.granularity, p.reduction,
                                               b.ul_masks)
        present = b.turn_masks.sum(-1) > 0
        return value.mean(), {"likelihood": stats["likelihood"][present].mean(),
                              "unlikelihood": stats["unlikelihood"][present].mean()}

    return loss


def sequence_logps(model, items: list[Example], pad: int) -> torch.Tensor:
    """Summed response log-probs ``[B]`` of one-turn conversations."""
    inputs = collate(items, pad, _device(model))
    labels = inputs["labels"]
    lp = P.token_logps(model(**inputs).logits, inputs["input_ids"])
    return P.masked_sum(lp, (labels[:, 1:] != -100).to(lp.dtype))


def reference_logps(model, items: list[Example], p: RPLParams, pad: int) -> torch.Tensor:
    """Summed response log-probs ``[N]`` of the starting policy, in batches of ``p.batch_size``, in the precision
    the loop trains in (the reference: scored once, before training)."""
    device = _device(model)
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=p.precision == "bf16-mixed"):
        was = model.training
        model.eval()
        ref = [sequence_logps(model, items[s:s + p.batch_size], pad) for s in range(0, len(items), p.batch_size)]
        model.train(was)
    return torch.cat(ref)


def dpo_loss(model, chosen: list[Example], rejected: list[Example], p: RPLParams, seed: int, pad: int):
    """DPO on (best, worst) with reference log-probs of the starting policy, scored once here in the precision the
    loop trains in."""
    ref_w, ref_l = reference_logps(model, chosen, p, pad), reference_logps(model, rejected, p, pad)
    order = EpochOrder(len(chosen), seed)

    def loss(i: int):
        idx = order.batch(i, p.batch_size)
        both = sequence_logps(model, [chosen[k] for k in idx] + [rejected[k] for k in idx], pad)
        pw, pl = both[:len(idx)], both[len(idx):]
        margin = (pw - ref_w[idx]) - (pl - ref_l[idx])
        return P.dpo_loss(pw, pl, ref_w[idx], ref_l[idx], p.beta).mean(), {"reward_margin": margin.mean()}

    return loss


def lipo_labels(d: Dialogue, kind: str) -> list[float]:
    """LiPO's label of each answer: ``winrate``, the share of the dialogue's other answers it beats by the critic's
    score (ties count half; by turn order, worst to best, where an answer has no score), or ``score``, the score
    mapped from 1-10 to [0, 1]."""
    from llmx.plugins.reper.loss import score_sigma

    have = all(s is not None for s in d.scores)
    if kind == "score":
        if not have:
            raise UsageError(f"{d.where}: lipo_labels: score needs a score on every answer")
        return score_sigma(d.scores)
    keys = d.scores if have else d.turns
    n = len(keys)
    return [sum(1.0 if a > b else 0.5 if a == b else 0.0 for j, b in enumerate(keys) if j != i) / (n - 1)
            for i, a in enumerate(keys)]


def lipo_loss(model, lists: list[list[Example]], labels: list[list[float]], p: RPLParams, seed: int, pad: int):
    """LiPO-lambda on each dialogue's answers as one list, rewards ``beta (log pi - log pi_ref)`` of each answer to
    the question alone (DPO's context), reference log-probs of the starting policy scored once; a micro-batch is
    ``p.batch_size`` lists, its loss their mean."""
    flat = [e for items in lists for e in items]
    starts = [0]
    for items in lists:
        starts.append(starts[-1] + len(items))
    ref = reference_logps(model, flat, p, pad)
    order = EpochOrder(len(lists), seed)

    def loss(i: int):
        idx = order.batch(i, p.batch_size)
        lp = sequence_logps(model, [e for k in idx for e in lists[k]], pad)
        width = max(len(lists[k]) for k in idx)
        rows, marks, psi, at = [], [], [], 0
        for k in idx:
            n = len(lists[k])
            r = p.beta * (lp[at:at + n] - ref[starts[k]:starts[k] + n].to(lp.device))
            rows.append(torch.cat([r, r.new_zeros(width - n)]))
            marks.append([True] * n + [False] * (width - n))
            psi.append(labels[k] + [0.0] * (width - n))
            at += n
        rewards = torch.stack(rows)
        mask = torch.tensor(marks, device=lp.device)
        value = P.lipo_lambda_loss(rewards, torch.tensor(psi, device=lp.device), mask)
        counts = mask.sum(-1)
        margin = rewards[torch.arange(len(idx), device=lp.device), counts - 1] - rewards[:, 0]  # best - worst
        return value.mean(), {"reward_margin": (margin / p.beta).mean()}

    return loss


def objective(model, proc, dialogues: list[Dialogue], packs: list[Packed], p: RPLParams, seed: int, pad: int,
              image_tokens: int) -> tuple[Callable, Callable | None, int]:
    """The loss of ``p.objective``, its per-micro-batch weight (SFT: response tokens) and the rows it trains on."""
    if p.objective == "rpl":
        return rpl_loss(model, packs, p, seed, pad, proc.tokenizer.eos_token_id), None, len(packs)
    if p.objective in ("sft_all", "sft_best"):
        items = ([pk.example for pk in packs] if p.objective == "sft_all" else
                 examples(proc, [d.conversation([len(d.answers) - 1]) for d in dialogues], image_tokens, p.max_length))
        return T.loss_fn(model, items, p.batch_size, seed, pad), T.weights(items, p.batch_size, seed), len(items)
    pairs = [d for d in dialogues if len(d.answers) > 1]
    if not pairs:
        raise UsageError(f"objective {p.objective} needs dialogues of two or more answers "
                         f"({'a list' if p.objective == 'lipo' else 'best vs worst'}); these have one each")
    if p.objective == "lipo":
        flat = examples(proc, [d.conversation([k]) for d in pairs for k in range(len(d.answers))], image_tokens,
                        p.max_length)
        lists, at = [], 0
        for d in pairs:
            lists.append(flat[at:at + len(d.answers)])
            at += len(d.answers)
        return lipo_loss(model, lists, [lipo_labels(d, p.lipo_labels) for d in pairs], p, seed, pad), None, len(pairs)
    chosen = examples(proc, [d.conversation([len(d.answers) - 1]) for d in pairs], image_tokens, p.max_length)
    rejected = examples(proc, [d.conversation([0]) for d in pairs], image_tokens, p.max_length)
    return dpo_loss(model, chosen, rejected, p, seed, pad), None, len(pairs)


@torch.no_grad()
def turn_logps(model, packs: list[Packed], pad: int, batch_size: int = 8) -> dict[str, float]:
    """Mean per-token log-prob of each dialogue's first (kept) and last answer, averaged over ``packs``."""
    if not packs:
        return {}
    was = model.training
    model.eval()
    first, last = [], []
    for s in range(0, len(packs), batch_size):
        b = batch(packs[s:s + batch_size], pad, _device(model))
        lp = P.token_logps(model(**b.inputs).logits, b.inputs["input_ids"])
        per_turn = P.masked_mean(lp.unsqueeze(1), b.turn_masks)
        counts = (b.turn_masks.sum(-1) > 0).sum(-1)
        first += per_turn[:, 0].tolist()
        last += per_turn[torch.arange(len(counts), device=counts.device), counts - 1].tolist()
    model.train(was)
    return {"first": sum(first) / len(first), "last": sum(last) / len(last)}
