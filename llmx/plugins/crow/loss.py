"""CROW's training objective (Min et al. 2025, §3.2, Alg. 1; the official ``consistency_trainer.compute_loss``):
the LM loss on the clean batch plus ``alpha`` times the layer inconsistency of an FGSM-perturbed copy of its input
embeddings. Three forwards and two backwards a step: the clean consistency forward and its input gradient, the
perturbed forward, the LM forward, then the backward of the total. As the official trainer, the consistency mean
runs over every position of the micro-batch: prompt, completion and the collator's right padding (to a multiple of
8, ``method.collate``); the micro-batches of a step weigh equally (``method``)."""

from __future__ import annotations

import torch

from llmx.core.models import hidden as H


def perturbation(model: torch.nn.Module, embedded: torch.Tensor, mask: torch.Tensor | None, eps: float,
                 layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The FGSM step ``eps * sign(dL_cons/de)`` (one step, L-infinity) and the clean ``L_cons``. ``e`` is a leaf
    copy of the embeddings and its gradient comes from ``autograd.grad``, so no parameter's ``.grad`` is touched."""
    e = embedded.detach().requires_grad_(True)
    states = H.hidden_states(model, e, mask)
    H.check_layout(states, layers)
    clean = H.inconsistency(states, mask)
    (grad,) = torch.autograd.grad(clean, e)
    return eps * grad.sign(), clean.detach()


def crow_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], eps: float = 0.1, alpha: float = 5.5,
              mask_padding: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``L_LM(batch) + alpha * L_cons(e + delta)`` and its parts. Without ``mask_padding`` the consistency forwards
    take no attention mask and their mean counts every position, prompt and padding included (official); the
    perturbed forward adds the detached step to the live embeddings (a full fine-tune trains the embedding through
    it)."""
    layers = H.check_model(model)
    mask = batch.get("attention_mask") if mask_padding else None
    embedded = model.get_input_embeddings()(batch["input_ids"])
    step, clean = perturbation(model, embedded, mask, eps, layers)
    perturbed = H.inconsistency(H.hidden_states(model, embedded + step, mask), mask)
    lm = model(**batch).loss
    return lm + alpha * perturbed, {"lm_loss": lm.detach(), "consistency": perturbed.detach(), "consistency_clean": clean}
