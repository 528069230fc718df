"""How consistent a causal LM's consecutive decoder layers are (CROW, Min et al. 2025, §3.1): the mean over layer
pairs, batch and positions of ``1 - cos(h_l, h_{l+1})``. CROW regularises it; the backdoor evaluation measures it on
triggered and clean prompts (the paper's premise)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from llmx.core.models.blocks import decoder_blocks
from llmx.errors import UsageError


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if type(model).__module__.startswith("peft.") else model


def check_model(model: torch.nn.Module) -> int:
    """The decoder-layer count of a model CROW can measure: one that takes ``inputs_embeds`` and has at least 3
    decoder layers (``L - 2`` consecutive pairs once the embedding and final-norm outputs are left out)."""
    inner = base_model(model)
    if "inputs_embeds" not in inspect.signature(inner.forward).parameters:
        raise UsageError(f"{type(inner).__name__} does not take inputs_embeds: layer consistency needs a causal LM "
                         "that does")
    try:
        layers = len(decoder_blocks(inner))
    except ValueError as exc:
        raise UsageError(f"layer consistency: {exc}") from None
    if layers < 3:
        raise UsageError(f"{type(inner).__name__} has {layers} decoder layers: layer consistency needs at least 3 "
                         "(its pairs leave out the embedding output and the final-norm output)")
    return layers


def check_layout(hidden: Sequence[torch.Tensor], layers: int) -> None:
    """``output_hidden_states`` must hold the embedding output and one entry per decoder layer (the last after the
    final norm, as in HF Llama)."""
    if len(hidden) != layers + 1:
        raise UsageError(f"the model returned {len(hidden)} hidden states for {layers} decoder layers (expected "
                         f"{layers + 1}: the embedding output, then one per layer)")


def inconsistency(hidden: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the pairs ``(h_l, h_{l+1})``, ``l = 1 .. L-2`` (``hidden_states[1:-2]`` against ``[2:-1]``: the
    embedding output and the last entry, the final-norm output in HF Llama, left out, as the official code), over
    the batch and the positions where ``mask`` (batch, positions) is set (all of them without one) of
    ``1 - cos`` (eps 1e-8)."""
    a = torch.stack(tuple(hidden[1:-2])).float()
    b = torch.stack(tuple(hidden[2:-1])).float()
    per = 1 - F.cosine_similarity(a, b, dim=-1, eps=1e-8)
    if mask is None:
        return per.mean()
    w = mask.to(per.dtype)[None].expand_as(per)
    return (per * w).sum() / w.sum().clamp_min(1)


def hidden_states(model: torch.nn.Module, embeds: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Every layer's output for ``embeds`` (no cache; ``mask`` as the attention mask when given)."""
    return model(inputs_embeds=embeds, attention_mask=mask, output_hidden_states=True, use_cache=False).hidden_states
