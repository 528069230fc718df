"""CROW's training objective (Min et al. 2025, §3.2, Alg. 1; the official ``consistency_trainer.compute_loss``):
the LM loss on the clean batch plus ``alpha`` times the layer inconsistency of an FGSM-perturbed copy of its input
embeddings. Three forwards and two backwards a step: the clean consistency forward and its input gradient, the
perturbed forward, the LM forward, then the backward of the total."""

from __future__ import annotations

import torch

from llmx.core.models import hidden as H


def crow_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], eps: float = 0.1, alpha: float = 5.5,
              mask_padding: bool = False, measure: H.Measure = "cosine") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``L_LM(batch) + alpha * L_cons(e + eps * sign(dL_cons/de))`` and its parts. ``e`` is a leaf copy of the
    input embeddings, so the perturbation's gradient reaches no parameter (``autograd.grad``); the perturbed forward
    adds the detached step to the live embeddings (a full fine-tune trains the embedding through it)."""
    layers = H.check_model(model)
    mask = batch.get("attention_mask") if mask_padding else None
    embedded = model.get_input_embeddings()(batch["input_ids"])
    e = embedded.detach().requires_grad_(True)
    states = H.hidden_states(model, e, mask)
    H.check_layout(states, layers)
    clean = H.inconsistency(states, mask, measure)
    (grad,) = torch.autograd.grad(clean, e)
    step = eps * grad.sign()
    perturbed = H.inconsistency(H.hidden_states(model, embedded + step, mask), mask, measure)
    lm = model(**batch).loss
    return lm + alpha * perturbed, {"lm_loss": lm.detach(), "consistency": perturbed.detach(),
                                    "consistency_clean": clean.detach()}
