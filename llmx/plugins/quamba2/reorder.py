"""Quamba2's offline rearrangement (Sec. 4.2): permute heads inside each SSD group and channels inside each head so
that sort-and-cluster groups become contiguous, rewriting every weight that touches those channels so the model
computes exactly what it did.

``head_index[h']`` is the old head placed at position h'; ``channel_index`` the old channel at each new channel
position (heads never leave their SSD group; channels never leave their head). Rewritten: the z and x rows and the
dt rows of ``in_proj`` (B and C rows untouched), the x channels of ``conv1d``, ``A_log``, ``D``, ``dt_bias``, the
gated norm's weight (exact because its groups are whole SSD groups) and the input columns of ``out_proj``.
"""

from __future__ import annotations

import torch


def channel_index(head_index: torch.Tensor, within: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Old channel for every new channel: head ``head_index[h]``'s channels in the order ``within[h]``."""
    return (head_index[:, None] * head_dim + within).reshape(-1)


def check(head_index: torch.Tensor, heads: int, groups: int) -> None:
    blocks = head_index.reshape(groups, heads // groups).sort(dim=1).values
    moved = (blocks != torch.arange(heads, device=head_index.device).reshape(groups, -1)).any(dim=1)
    if moved.any():
        raise ValueError(f"head permutation moves heads across SSD group {int(moved.nonzero()[0])}")


@torch.no_grad()
def apply(mixer, head_index: torch.Tensor, within: torch.Tensor) -> torch.Tensor:
    """Rearrange an llmx ``Mamba2Mixer`` in place (``within``: ``[heads, head_dim]`` per-head channel orders);
    returns the channel index, on the mixer's device."""
    heads, hd, inner, gs = mixer.heads, mixer.head_dim, mixer.inner, mixer.groups * mixer.state
    device = mixer.A_log.device
    head_index, within = head_index.to(device), within.to(device)
    check(head_index, heads, mixer.groups)
    ch = channel_index(head_index, within, hd)
    conv_dim = inner + 2 * gs
    bc = torch.arange(2 * inner, inner + conv_dim, device=device)
    rows = torch.cat([ch, inner + ch, bc, inner + conv_dim + head_index])
    _take(mixer.in_proj.weight, rows)
    _take(mixer.in_proj.bias, rows)
    conv_rows = torch.cat([ch, torch.arange(inner, conv_dim, device=device)])
    _take(mixer.conv_weight, conv_rows)
    _take(mixer.conv_bias, conv_rows)
    for p in (mixer.A_log, mixer.D, mixer.dt_bias):
        _take(p, head_index)
    _take(mixer.norm_weight, ch)
    w = mixer.out_proj.weight
    w.copy_(w[:, ch])
    return ch


def _take(p: torch.Tensor | None, index: torch.Tensor) -> None:
    if p is not None:
        p.copy_(p[index])
