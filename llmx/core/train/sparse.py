"""Sparse fine-tuning supports: which entries of a weight matrix train, at a LoRA-sized budget.

A support is a sorted 1-D ``long`` tensor of flat (row-major) indices into the matrix. ``select`` scores the entries
and keeps the top ``k`` with ties broken by the lower index, so a support is a deterministic function of the weight:

- ``lift``: ``|W_f|`` with ``W_f`` the rank-``f`` truncated SVD of ``W`` in float32 (LIFT's principal weights, Liu et
  al. 2025, §3); ``svd: lowrank`` takes ``torch.svd_lowrank`` with ``q = 2f`` (the official ``lift_rand_sparse``);
- ``magnitude``: ``|W|`` (magnitude sparse fine-tuning, PEFT's Super-Tuning);
- ``random``: uniform scores from the given generator (random sparse fine-tuning, PEFT SHiRA's default mask).
"""

from __future__ import annotations

from typing import Literal

import torch

MaskKind = Literal["lift", "magnitude", "random"]
SVDKind = Literal["full", "lowrank"]
KINDS: tuple[str, ...] = ("lift", "magnitude", "random")


def budget(m: int, n: int, r: int) -> int:
    """Entries of an ``m x n`` matrix a rank-``r`` LoRA adapter's parameter count buys: ``min(r(m + n), mn)``."""
    return min(r * (m + n), m * n)


def low_rank(weight: torch.Tensor, rank: int, svd: SVDKind = "full", seed: int = 0) -> torch.Tensor:
    """The rank-``rank`` truncated SVD reconstruction of ``weight`` in float32, on its device. ``lowrank`` draws
    ``torch.svd_lowrank``'s random projection from its own seeded generator (the global RNG is left as it was)."""
    w = weight.detach().float()
    if svd == "lowrank":
        q = min(2 * rank, min(w.shape))
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            u, s, v = torch.svd_lowrank(w, q=q)
        return (u[:, :rank] * s[:rank]) @ v[:, :rank].T
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vh[:rank]


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted flat indices of the ``k`` largest scores; among equal scores at the cut the lower indices win."""
    flat = scores.reshape(-1)
    if k >= flat.numel():
        return torch.arange(flat.numel(), device=flat.device)
    cut = torch.topk(flat, k, sorted=True).values[-1]
    above = (flat > cut).nonzero().squeeze(1)
    at_cut = (flat == cut).nonzero().squeeze(1)[:k - above.numel()]
    return torch.sort(torch.cat([above, at_cut])).values


@torch.no_grad()
def select(weight: torch.Tensor, k: int, kind: MaskKind, filter_rank: int = 32, svd: SVDKind = "full",
           generator: torch.Generator | None = None, seed: int = 0) -> torch.Tensor:
    """The support of ``k`` entries of ``weight`` by ``kind`` (module docstring)."""
    if kind == "lift":
        scores = low_rank(weight, filter_rank, svd, seed).abs()
    elif kind == "magnitude":
        scores = weight.detach().float().abs()
    elif kind == "random":
        scores = torch.rand(weight.shape, generator=generator, device=generator.device if generator else "cpu")
        scores = scores.to(weight.device)
    else:
        raise ValueError(f"unknown mask kind {kind!r} (kinds: {', '.join(KINDS)})")
    return top_k(scores, k)


def dense_mask(index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The boolean matrix of a support."""
    mask = torch.zeros(shape.numel(), dtype=torch.bool, device=index.device)
    mask[index] = True
    return mask.view(shape)


def captured(delta: torch.Tensor, index: torch.Tensor) -> float:
    """The share of an update's energy on a support: ``||delta * M||^2 / ||delta||^2`` (LIFT's diagnostic)."""
    d = delta.detach().float().reshape(-1)
    total = float(d.square().sum())
    return float(d[index.to(d.device)].square().sum()) / total if total > 0 else 0.0
