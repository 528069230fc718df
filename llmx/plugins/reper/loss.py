"""Reflective unlikelihood (RePer, §2.2 of the notes; the README's loss figure): for a dialogue of T responses,

    L = - sum_t [ sigma_t log p(y_t | c_t) + alpha (1 - sigma_t) log(1 - p(y_t | c_t)) ]

``granularity: token`` applies both terms per response token (Welleck et al.'s unlikelihood, ``log(1 - p)`` as
``log(-expm1(log p))`` clamped at ``eps``) and averages each over the response (``reduction: sum`` adds instead);
``sequence`` uses the response's joint probability, whose ``log(1 - p)`` is about 0 once a response has more than a
few tokens (why token level is the default). The paper writes the sequence form; its code is unreleased."""

from __future__ import annotations

import torch


def log1m(logp: torch.Tensor, eps: float) -> torch.Tensor:
    """``log(1 - p)`` from ``log p``, with ``1 - p`` clamped at ``eps`` so loss and gradient stay finite as p -> 1."""
    return torch.log(torch.clamp(-torch.expm1(logp), min=eps))


def reflective_unlikelihood(token_logps: torch.Tensor, turn_masks: torch.Tensor, sigma: torch.Tensor,
                            alpha: float = 8.0, eps: float = 1e-6, granularity: str = "token",
                            reduction: str = "mean", ul_masks: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-dialogue loss ``[B]`` from ``token_logps [B, L]``, ``turn_masks [B, T, L]`` (response t's tokens; an
    all-zero row is an absent turn) and ``sigma [B, T]``. ``ul_masks`` (token level) restricts the unlikelihood
    term to some of each response's tokens (its EOS left out; ``ul_tokens: differing``). Stats: the per-turn likelihood and
    unlikelihood terms, for logging."""
    m = turn_masks.to(token_logps.dtype)
    lp = token_logps.unsqueeze(1)  # [B, 1, L]
    present = m.sum(-1) > 0
    if granularity == "token":
        u = m if ul_masks is None else ul_masks.to(token_logps.dtype)
        like = (m * lp).sum(-1)
        unlike = (u * log1m(lp, eps)).sum(-1)
        if reduction == "mean":
            like = like / m.sum(-1).clamp(min=1)
            unlike = unlike / u.sum(-1).clamp(min=1)
    elif granularity == "sequence":
        like = (m * lp).sum(-1)
        unlike = log1m(like, eps)
    else:
        raise ValueError(f"granularity must be token or sequence, not {granularity!r}")
    per_turn = (sigma * like + alpha * (1 - sigma) * unlike) * present
    return -per_turn.sum(-1), {"likelihood": like, "unlikelihood": unlike}


def linear_sigma(turns: list[int], total: int) -> list[float]:
    """``sigma_t = t / T`` (the README: rewards rise linearly from turn 1 to T)."""
    return [t / total for t in turns]


def score_sigma(scores: list[float], low: float = 1.0, high: float = 10.0) -> list[float]:
    """The critic's score normalised to [0, 1] on its 1-10 scale."""
    return [min(max((s - low) / (high - low), 0.0), 1.0) for s in scores]
