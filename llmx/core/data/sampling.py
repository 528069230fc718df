"""Seeded, resumable visiting orders: item ``k`` of an endless stream over ``n`` items is a pure function of ``k``
(epoch ``k // n`` visits its own seeded permutation), so a batch is chosen by its number alone."""

from __future__ import annotations


class EpochOrder:
    def __init__(self, n: int, seed: int):
        self.n, self.seed = n, seed
        self._perms: dict[int, list[int]] = {}

    def perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            import torch

            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=gen).tolist()
        return self._perms[epoch]

    def __getitem__(self, k: int) -> int:
        epoch, at = divmod(k, self.n)
        return self.perm(epoch)[at]

    def batch(self, i: int, size: int, skip: int = 0) -> list[int]:
        """The items of micro-batch ``i`` of ``size`` items, after the first ``skip`` items of the order."""
        return [self[k] for k in range(skip + i * size, skip + (i + 1) * size)]
