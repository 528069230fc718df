"""``LiftSparseAdamW``: Adam on a sparse support of each weight matrix, refreshed during training (LIFT, Liu et al.
2025, §3; the official ``src/sparseAdam.py``).

Per matrix ``W`` (m x n) the support holds ``k = min(r(m + n), mn)`` entries (``core.train.sparse.select``), and the
moments are 1-D tensors of length ``k`` gathered from the dense gradient; the update is added back at the support,
so every other entry stays bitwise unchanged. Adam as the official code (HF's AdamW): betas (0.9, 0.95), ``eps`` added
to ``sqrt(v)`` and the bias correction folded into the step size, counted by the tensor's step (an entry that enters
the support at a refresh starts with zero moments and the tensor's step count), weight decay 0.

Every ``update_interval`` optimiser steps the supports are selected again on the current weights; moments of
entries in both supports are kept, new entries start at zero. The official check ``(total_step + 1) % interval``
fires one step before each multiple; this one selects after steps ``interval, 2 interval, ...``, at the start of the
next step (so a run never refreshes after its last step). The supports are int32 where a matrix has fewer than 2^31
entries (12 bytes of state per trained entry with the two moments); under torchrun rank 0's supports are broadcast.

The dense ``.grad`` autograd builds is not sparsified by hooks: it exists from the backward to the step (freed there),
as in the official code.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from llmx.core.train import sparse


class LiftSparseAdamW(torch.optim.Optimizer):
    def __init__(self, params: Any, lr: float, rank: int, filter_rank: int, mask: sparse.MaskKind = "lift",
                 svd: sparse.SVDKind = "full", update_interval: int = 400, betas=(0.9, 0.95),
                 eps: float = 1e-6, seed: int = 0):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "steps_done": 0, "refreshes": 0, "refresh_due": False}
        super().__init__(params, defaults)
        self.rank, self.filter_rank, self.kind, self.svd = rank, filter_rank, mask, svd
        self.update_interval, self.seed = update_interval, seed
        for which, p in enumerate(self._params()):
            state = self.state[p]
            state["step"] = 0
            state["index"] = self._support(p, which, 0)
            state["exp_avg"] = torch.zeros(state["index"].numel(), device=p.device)
            state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    def _support(self, p: torch.Tensor, which: int, refresh: int) -> torch.Tensor:
        m, n = p.shape
        generator = None
        if self.kind == "random":
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + refresh * 10_007 + which)
        index = sparse.select(p, sparse.budget(m, n, self.rank), self.kind, self.filter_rank, self.svd, generator,
                              seed=self.seed + refresh)
        index = index.to(torch.int32 if p.numel() < 2**31 else torch.long)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(index, src=0)
        return index

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if self.param_groups[0]["refresh_due"]:
            self.refresh()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                index = state["index"]
                grad = p.grad.reshape(-1).index_select(0, index).float()
                p.grad = None
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                t = state["step"]
                size = group["lr"] * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
                p.view(-1).index_add_(0, index, (m / (v.sqrt() + group["eps"])).to(p.dtype), alpha=-size)
            group["steps_done"] += 1
        due = bool(self.update_interval) and self.param_groups[0]["steps_done"] % self.update_interval == 0
        for group in self.param_groups:
            group["refresh_due"] = due
        return loss

    @torch.no_grad()
    def refresh(self) -> None:
        """Select every support again on the current weights, carrying the moments of entries that stay."""
        count = self.param_groups[0]["refreshes"] + 1
        for which, p in enumerate(self._params()):
            state = self.state[p]
            old, new = state["index"], self._support(p, which, count)
            pos = torch.searchsorted(old, new).clamp(max=old.numel() - 1)
            kept = old[pos] == new
            for key in ("exp_avg", "exp_avg_sq"):
                moved = torch.zeros(new.numel(), device=p.device)
                moved[kept] = state[key][pos[kept]]
                state[key] = moved
            state["index"] = new
        for group in self.param_groups:
            group["refreshes"], group["refresh_due"] = count, False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, but the supports keep their integer dtype (torch casts every non-step state tensor to the
        weight's float dtype, which would round indices past 2^24)."""
        saved = {k: v["index"].clone() for k, v in state_dict["state"].items() if "index" in v}
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        for i, p in zip(ids, self._params(), strict=True):
            if i in saved:
                self.state[p]["index"] = saved[i].to(device=p.device)

    def supports(self) -> dict[torch.nn.Parameter, torch.Tensor]:
        return {p: self.state[p]["index"] for p in self._params()}
