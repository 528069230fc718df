"""End-loss saliency for layer-wise quantization (GuidedQuant, arXiv 2505.07004 Sec. 3): per token, the squared
gradient of the LM loss at each Linear's output, averaged over contiguous groups of output channels, and the
saliency-weighted Hessians ``H_g = sum_n s_ng x_n x_n^T`` that replace ``X X^T``.

Gradients come from one backward per calibration window through the FP model (official: one sequence at a time),
scaled by ``saliency_scale`` before squaring (official 1e3, against bf16 underflow). The same pass gives the
empirical Fisher diagonal (each window's weight gradient squared, summed), SqueezeLLM's k-means weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmx.core.quant.calibration import LinearStats


@dataclass
class Saliency:
    """Per layer: ``tokens`` ``[N, g]`` (float32, in window order) and ``fisher`` ``[out, in]`` (float32)."""

    tokens: dict[str, torch.Tensor]
    fisher: dict[str, torch.Tensor]
    groups: int


def group_bounds(out_features: int, groups: int) -> list[tuple[int, int]]:
    """``groups`` contiguous slices of the output channels (sizes differ by at most one)."""
    if not 1 <= groups <= out_features:
        raise ValueError(f"num_groups {groups} must be between 1 and the layer's {out_features} outputs")
    edges = [round(i * out_features / groups) for i in range(groups + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def collect(model: torch.nn.Module, layers: dict[str, torch.nn.Linear], batches: torch.Tensor, groups: int,
            scale: float = 1e3, fisher: bool = True, progress=None) -> Saliency:
    """One LM-loss backward per window of ``batches`` ``[n, T]`` through ``model`` (its parameters' gradients are
    restored afterwards)."""
    device = next(model.parameters()).device
    tokens: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    fish = {n: torch.zeros_like(m.weight, dtype=torch.float32) for n, m in layers.items()} if fisher else {}
    bounds = {n: group_bounds(m.out_features, groups) for n, m in layers.items()}

    def keep(name):
        def on_grad(g):
            s = (scale * g.detach().float()) ** 2
            s = s.reshape(-1, s.shape[-1])
            tokens[name].append(torch.stack([s[:, a:b].mean(-1) for a, b in bounds[name]], dim=-1))

        def hook(_module, _args, out):
            if out.requires_grad:
                out.register_hook(on_grad)
        return hook

    saved = {p: p.requires_grad for p in model.parameters()}
    for m in layers.values():
        m.weight.requires_grad_(True)
    hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    was_training = model.training
    model.eval()
    try:
        rows = range(batches.shape[0])
        for i in progress(rows, description="end-loss gradients") if progress else rows:
            ids = batches[i:i + 1].to(device)
            for m in layers.values():
                m.weight.grad = None
            with torch.enable_grad():
                model(input_ids=ids, labels=ids).loss.backward()
            for n, m in layers.items():
                if fisher:
                    fish[n].add_(m.weight.grad.float() ** 2)
    finally:
        for h in hooks:
            h.remove()
        for p, flag in saved.items():
            p.requires_grad_(flag)
            p.grad = None
        model.train(was_training)
    return Saliency({n: torch.cat(t) for n, t in tokens.items() if t}, fish, groups)


class GuidedStats(LinearStats):
    """``LinearStats`` whose Hessian is ``[g, d, d]`` float64: each token's ``x x^T`` weighted by its group saliency,
    tokens taken in the order the calibration calls see them (window order, as the saliency was collected)."""

    def __init__(self, saliency: torch.Tensor):
        super().__init__()
        self.saliency = saliency
        self.offset = 0

    def add(self, x: torch.Tensor, with_hessian: bool) -> None:
        x2 = x.detach().reshape(-1, x.shape[-1]).double()
        s = self.saliency[self.offset:self.offset + x2.shape[0]].to(x2.device, torch.float64)
        if s.shape[0] != x2.shape[0]:
            raise RuntimeError("saliency and calibration tokens are out of step")
        self.offset += x2.shape[0]
        h = torch.stack([(x2 * s[:, g, None]).T @ x2 for g in range(s.shape[1])])
        self.hessian = h if self.hessian is None else self.hessian.add_(h)
        self.tokens += x2.shape[0]
        self.absmax = max(self.absmax, float(x2.abs().max()))
