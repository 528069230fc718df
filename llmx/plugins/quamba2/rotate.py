"""Norm folding and Hadamard rotations (Quamba2 Sec. 4.3, QuaRot-style), exact in full precision.

With ``R = H / sqrt(d)`` orthonormal and the residual stream carried as ``x R``: every block's RMSNorm weight is
folded into its ``in_proj`` columns (the norm becomes weightless, and a weightless RMSNorm commutes with ``R``), the
final norm's weight into ``lm_head``; then ``E <- E R``, ``in_proj <- W R``, ``out_proj <- R^T W``,
``lm_head <- W R``. Inside each mixer the out_proj input gets an online rotation ``y R'`` whose inverse is fused
into ``out_proj`` (``W <- W R'``), which spreads outliers before that input is quantized to int8. That fusion
comes after the offline rearrangement (which permutes out_proj's input columns), as in the official code.
"""

from __future__ import annotations

import torch

from llmx.core.quant.hadamard import hadamard_transform


def _rot(w: torch.Tensor) -> torch.Tensor:
    """``w R`` along the last dim, computed in float64."""
    return hadamard_transform(w.double()).to(w.dtype)


@torch.no_grad()
def fold_and_rotate(model: torch.nn.Module) -> None:
    backbone = model.backbone
    lm_head = model.lm_head
    if lm_head.weight is backbone.embeddings.weight:
        lm_head.weight = torch.nn.Parameter(lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    for layer in backbone.layers:
        mixer = layer.mixer
        mixer.in_proj.weight.mul_(layer.norm.weight.to(mixer.in_proj.weight.dtype)[None, :])
        layer.norm.weight.fill_(1.0)
        mixer.in_proj.weight.copy_(_rot(mixer.in_proj.weight))
        out = mixer.out_proj
        out.weight.copy_(_rot(out.weight.t()).t())  # R^T W
        if out.bias is not None:
            out.bias.copy_(_rot(out.bias[None])[0])
    lm_head.weight.mul_(backbone.norm_f.weight.to(lm_head.weight.dtype)[None, :])
    backbone.norm_f.weight.fill_(1.0)
    lm_head.weight.copy_(_rot(lm_head.weight))
    backbone.embeddings.weight.copy_(_rot(backbone.embeddings.weight))


@torch.no_grad()
def fuse_output_hadamard(model: torch.nn.Module) -> None:
    """Turn on each mixer's online rotation of the out_proj input and fuse its inverse: ``W <- W R'``."""
    for layer in model.backbone.layers:
        w = layer.mixer.out_proj.weight
        w.copy_(_rot(w))
        layer.mixer.hadamard_out = True
