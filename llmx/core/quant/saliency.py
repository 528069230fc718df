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
    """Per layer: ``tokens`` ``[N, g]`` (float32, in window order) and ``fisher`` ``[out, in]`` (float32), both on
    the CPU (at 7B the Fisher alone is 26 GB)."""

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
            scale: float = 1e3, fisher: bool = True, per_token: bool = True, progress=None) -> Saliency:
    """One LM-loss backward per window of ``batches`` ``[n, T]`` through ``model`` (its parameters' gradients are
    restored afterwards): the per-token saliencies (``per_token``) and the Fisher diagonal (``fisher``)."""
    device = next(model.parameters()).device
    tokens: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    fish = {n: torch.zeros(m.weight.shape, dtype=torch.float32) for n, m in layers.items()} if fisher else {}
    bounds = {n: group_bounds(m.out_features, groups) for n, m in layers.items()}

    def keep(name):
        def on_grad(g):
            s = (scale * g.detach().float()) ** 2
            s = s.reshape(-1, s.shape[-1])
            tokens[name].append(torch.stack([s[:, a:b].mean(-1) for a, b in bounds[name]], dim=-1).cpu())

        def hook(_module, _args, out):
            if out.requires_grad:
                out.register_hook(on_grad)
        return hook

    saved = {p: p.requires_grad for p in model.parameters()}
    targets = {id(m.weight) for m in layers.values()}
    for p in model.parameters():  # gradients for the target weights only (the Fisher); activations carry the rest
        p.requires_grad_(id(p) in targets)
    hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()] if per_token else []
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
                    fish[n].add_((m.weight.grad.float() ** 2).cpu())
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
    tokens taken in the order the calibration calls see them (window order, as the saliency was collected),
    accumulated in place ``chunk`` tokens at a time."""

    def __init__(self, saliency: torch.Tensor, chunk: int = 4096):
        super().__init__()
        self.saliency, self.chunk = saliency, chunk
        self.offset = 0

    def add(self, x: torch.Tensor, with_hessian: bool) -> None:
        x = x.detach().reshape(-1, x.shape[-1])
        n, d = x.shape
        if self.offset + n > self.saliency.shape[0]:
            raise RuntimeError("more calibration tokens than saliencies: the two are out of step")
        if self.hessian is None:
            self.hessian = torch.zeros(self.saliency.shape[1], d, d, dtype=torch.float64, device=x.device)
        for a in range(0, n, self.chunk):
            xc = x[a:a + self.chunk].double()
            s = self.saliency[self.offset + a:self.offset + a + xc.shape[0]].to(x.device, torch.float64)
            for g in range(s.shape[1]):
                self.hessian[g].addmm_((xc * s[:, g, None]).T, xc)
        self.offset += n
        self.tokens += n
        self.absmax = max(self.absmax, float(x.abs().max()))

    def check_complete(self) -> None:
        if self.offset != self.saliency.shape[0]:
            raise RuntimeError(f"{self.offset} calibration tokens for {self.saliency.shape[0]} saliencies: out of step")
