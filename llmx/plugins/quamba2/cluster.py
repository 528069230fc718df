"""Quamba2's sort-and-cluster of the SSM input x (Sec. 4.1) and its grouped int8 scales.

From calibration: a statistic per channel of x (mean |x| over a sample's tokens, running max over samples). Inside
each SSD group: sort every head's channels by it (ascending), cluster the heads on their unit-norm sorted profiles
(Ward, ``head_groups`` clusters) and place each cluster's heads together, then split the sorted channel positions of
each head group into ``dim_groups`` contiguous runs by k-means. Its features (``features``): ``heads``, as the
official code, each sorted position's unit-norm values in every head of the group, from the centres at every
``head_dim / dim_groups``-th position; ``mean_profile``, the group's mean sorted profile (1-D), from evenly spaced
positions including both ends. x then gets one static scale per (SSD group, head group, dim group); B and C one per
SSD group ("per-state-group").
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


def _kmeans_runs(points: torch.Tensor, starts: torch.Tensor, iters: int = 50) -> list[int]:
    """Boundaries of contiguous runs of sorted channel positions: Lloyd's over ``points`` [positions, features] from
    the centres at ``starts``. Labels are made monotone, so that runs stay contiguous (the official code asserts it
    of scikit-learn's labels); a CPU tensor here, so the loop's checks cost no device sync."""
    centers = points[starts].clone()
    k = len(starts)
    for _ in range(iters):
        labels = torch.cdist(points, centers, compute_mode="donot_use_mm_for_euclid_dist").argmin(1)  # exact
        labels = torch.cummax(labels, 0).values
        new = torch.stack([points[labels == c].mean(0) if (labels == c).any() else centers[c] for c in range(k)])
        if torch.allclose(new, centers):
            break
        centers = new
    bounds = [0] + [int((labels < c).sum()) for c in range(1, k)] + [len(points)]
    return sorted(set(bounds))


def _dim_bounds(sorted_prof: torch.Tensor, feats: torch.Tensor, k: int, features: str) -> list[int]:
    """One head group's dim groups from its heads' sorted profiles (raw and unit-norm), by ``features``."""
    n = sorted_prof.shape[1]
    if features == "heads":
        return _kmeans_runs(feats.T, torch.arange(k, device=feats.device) * (n // k))
    return _kmeans_runs(sorted_prof.mean(0)[:, None],
                        torch.linspace(0, n - 1, k, device=sorted_prof.device).round().long())


def sort_and_cluster(stat: torch.Tensor, heads: int, head_dim: int, groups: int, head_groups: int = 4,
                     dim_groups: int = 4, features: str = "heads") -> Clustering:
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
        feats = torch.nn.functional.normalize(sorted_prof[ids].double(), dim=1)
        k = min(head_groups, per)
        labels = fcluster(linkage(feats.cpu().numpy(), method="ward"), t=k, criterion="maxclust") if per > 1 else [1]
        for cluster in sorted(set(labels)):
            members = [i for i, lab in enumerate(labels) if lab == cluster]
            head_index += [ids[i] for i in members]
            head_group += [len(dim_bounds)] * len(members)
            dim_bounds.append(_dim_bounds(sorted_prof[[ids[i] for i in members]], feats[members],
                                          min(dim_groups, head_dim), features))
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
