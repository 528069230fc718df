"""Quamba2's sort-and-cluster of the SSM input x (Sec. 4.1) and its grouped int8 scales.

From calibration: a statistic per channel of x (mean |x| over a sample's tokens, running max over samples). Inside
each SSD group: sort every head's channels by it (ascending), cluster the heads on their unit-norm sorted profiles
(Ward, ``head_groups`` clusters) and place each cluster's heads together, then split the sorted channel positions of
each head group into ``dim_groups`` contiguous runs by 1-D k-means on the group's mean profile. x then gets one
static scale per (SSD group, head group, dim group); B and C one per SSD group ("per-state-group").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Clustering:
    head_index: torch.Tensor  # [heads]: old head at each new position
    within: torch.Tensor  # [heads, head_dim]: channel order inside each (new-position) head
    head_group: torch.Tensor  # [heads]: head-group id of each new head position (unique across SSD groups)
    dim_bounds: list[list[int]]  # per head group: sorted-position boundaries [0, ..., head_dim]


def channel_stat(x: torch.Tensor) -> torch.Tensor:
    """``x`` [samples, tokens, channels] -> per-channel max over samples of the mean |x| over tokens."""
    return x.abs().mean(dim=1).amax(dim=0)


def _kmeans_1d(values: torch.Tensor, k: int, iters: int = 50) -> list[int]:
    """Boundaries of k contiguous runs of a sorted 1-D profile (Lloyd from evenly spaced starts; a CPU tensor here,
    so the loop's checks cost no device sync)."""
    n = len(values)
    centers = values[torch.linspace(0, n - 1, k, device=values.device).round().long()].clone()
    for _ in range(iters):
        labels = (values[:, None] - centers[None]).abs().argmin(1)
        labels = torch.cummax(labels, 0).values  # sorted input: runs must stay contiguous
        new = torch.stack([values[labels == c].mean() if (labels == c).any() else centers[c] for c in range(k)])
        if torch.allclose(new, centers):
            break
        centers = new
    bounds = [0] + [int((labels < c).sum()) for c in range(1, k)] + [n]
    return sorted(set(bounds))


def sort_and_cluster(stat: torch.Tensor, heads: int, head_dim: int, groups: int, head_groups: int = 4,
                     dim_groups: int = 4) -> Clustering:
    """The clustering runs on the CPU (scipy's Ward linkage, a few thousand floats per layer: the statistic is
    copied there once, so every device computes the same permutation); its tensors are returned on ``stat``'s
    device."""
    from scipy.cluster.hierarchy import fcluster, linkage

    per = heads // groups
    prof = stat.detach().float().cpu().reshape(heads, head_dim)
    order = prof.argsort(dim=1, stable=True)
    sorted_prof = prof.gather(1, order)
    head_index, head_group, dim_bounds = [], [], []
    for g in range(groups):
        ids = list(range(g * per, (g + 1) * per))
        feats = torch.nn.functional.normalize(sorted_prof[ids].double(), dim=1).cpu().numpy()
        k = min(head_groups, per)
        labels = fcluster(linkage(feats, method="ward"), t=k, criterion="maxclust") if per > 1 else [1]
        for cluster in sorted(set(labels)):
            members = [ids[i] for i, lab in enumerate(labels) if lab == cluster]
            head_index += members
            head_group += [len(dim_bounds)] * len(members)
            dim_bounds.append(_kmeans_1d(sorted_prof[members].mean(0), min(dim_groups, head_dim)))
    hi = torch.tensor(head_index, device=stat.device)
    return Clustering(hi, order.to(stat.device)[hi], torch.tensor(head_group, device=stat.device), dim_bounds)


def grouped_scales(absmax: torch.Tensor, c: Clustering, head_dim: int, state: int = 1) -> torch.Tensor:
    """Int8 scales for the *rearranged* x (``state=1``: per channel) or cached state (flattened ``[heads, head_dim,
    state]``) from its calibrated per-element max |.|: one value per (head group, dim group[, state index]), the max
    over the block / 127."""
    a = absmax.float().reshape(-1, head_dim, state)
    runs, start = [], 0  # per head group: the block id of each sorted channel position
    for bounds in c.dim_bounds:
        runs.append([start + j for j, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                     for _ in range(lo, hi)])
        start += len(bounds) - 1
    block = torch.tensor(runs, device=a.device)[c.head_group.to(a.device)].reshape(-1)  # [heads * head_dim]
    peak = a.new_zeros(start, state).scatter_reduce_(0, block[:, None].expand(-1, state), a.reshape(-1, state), "amax")
    return (peak[block] / 127).reshape(-1).clamp(min=1e-8)
