"""The align stage on reflection dialogues: RPL (reflective unlikelihood, one packed forward per dialogue) and, on
the same rows, loop and trainable set, the baselines the paper compares with: SFT on every answer, SFT on the best
answer alone, and DPO on (best, worst) answers to the question (the shared loss, the reference's log-probs computed
once before training, so no copy of the weights is kept)."""

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


def dpo_loss(model, chosen: list[Example], rejected: list[Example], p: RPLParams, seed: int, pad: int):
    """DPO on (best, worst) with reference log-probs of the starting policy, scored once here in the precision the
    loop trains in."""
    device = _device(model)
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=p.precision == "bf16-mixed"):
        was = model.training
        model.eval()
        ref = [(sequence_logps(model, chosen[s:s + p.batch_size], pad), sequence_logps(model, rejected[s:s + p.batch_size], pad))
               for s in range(0, len(chosen), p.batch_size)]
        model.train(was)
    ref_w, ref_l = torch.cat([w for w, _ in ref]), torch.cat([r for _, r in ref])
    order = EpochOrder(len(chosen), seed)

    def loss(i: int):
        idx = order.batch(i, p.batch_size)
        both = sequence_logps(model, [chosen[k] for k in idx] + [rejected[k] for k in idx], pad)
        pw, pl = both[:len(idx)], both[len(idx):]
        margin = (pw - ref_w[idx]) - (pl - ref_l[idx])
        return P.dpo_loss(pw, pl, ref_w[idx], ref_l[idx], p.beta).mean(), {"reward_margin": margin.mean()}

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
        raise UsageError("objective dpo needs dialogues of two or more answers (best vs worst); these have one each")
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
