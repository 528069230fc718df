"""Gaussian sensitivity (§3.2): S(T, gamma) = E_eps[L_pre(theta_T + gamma sigma_p eps)] - L_pre(theta_T), with
eps ~ N(0, 1) per tensor drawn from one generator per draw index, so every checkpoint and every gamma meets the same
pattern; the weights are restored from a saved copy (subtracting the noise is not bitwise exact)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

DRAW_SEED = 7919  # draw k's generator is seeded with seed * DRAW_SEED + k


def targets(model: torch.nn.Module, perturb: str) -> dict[str, tuple[torch.nn.Parameter, str]]:
    """Name -> (tensor, kind) for the tensors to perturb: ``matrix`` (2+ dims), and with ``all`` also ``gain``
    (a norm module's weight) and ``bias`` (any other 1-D tensor). Tied tensors appear once."""
    norms = {id(m.weight) for m in model.modules()
             if "norm" in type(m).__name__.lower() and isinstance(getattr(m, "weight", None), torch.Tensor)}
    out: dict[str, tuple[torch.nn.Parameter, str]] = {}
    for name, p in model.named_parameters():
        kind = "matrix" if p.dim() >= 2 else "gain" if id(p) in norms else "bias"
        if kind == "matrix" or perturb == "all":
            out[name] = (p, kind)
    return out


def sigma(p: torch.Tensor, scale: str, init_std: float) -> float:
    """sigma_p of one tensor: 1, its own RMS at this checkpoint, or the init std (for a gain too: it starts at 1, so
    the init std is its noise relative to that start)."""
    if scale == "absolute":
        return 1.0
    if scale == "param_rms":
        return float(p.detach().float().pow(2).mean().sqrt())
    return init_std


def eps(shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)


@contextmanager
def perturbed(model: torch.nn.Module, chosen: dict[str, tuple[torch.nn.Parameter, str]],
              saved: dict[str, torch.Tensor], gamma: float, seed: int, draw: int, scale: str,
              init_std: float) -> Iterator[None]:
    """theta_T + gamma sigma_p eps_draw in place (names in sorted order, one generator), restored from ``saved``;
    the noise is additive for every kind, so a draw's pattern is the same at every T."""
    device = next(iter(chosen.values()))[0].device
    g = torch.Generator(device=device).manual_seed(seed * DRAW_SEED + draw)
    try:
        with torch.no_grad():
            for name in sorted(chosen):
                p = chosen[name][0]
                p.add_((eps(p.shape, g, p.device) * (gamma * sigma(saved[name], scale, init_std))).to(p.dtype))
        yield
    finally:
        with torch.no_grad():
            for name, (p, _) in chosen.items():
                p.copy_(saved[name])


def sensitivity(model: torch.nn.Module, loss: Callable[[], float], gammas: list[float], draws: int, seed: int,
                scale: str, perturb: str, init_std: float) -> tuple[float, list[dict]]:
    """L_pre and one row per gamma: S (mean over draws), its sd, the perturbed loss and each draw's loss."""
    chosen = targets(model, perturb)
    saved = {n: p.detach().clone() for n, (p, _) in chosen.items()}
    base = loss()
    rows = []
    for gamma in gammas:
        each = []
        for k in range(draws):
            with perturbed(model, chosen, saved, gamma, seed, k, scale, init_std):
                each.append(loss())
        s = [x - base for x in each]
        rows.append({"gamma": gamma, "S": statistics.fmean(s), "S_sd": statistics.stdev(s) if draws > 1 else 0.0,
                     "perturbed_loss": statistics.fmean(each), "draw_losses": each})
    return base, rows
