"""Universal dictionaries for Lexico (arXiv 2412.08890, Sec. 3.2): per layer, one for keys and one for values,
learned from KV vectors the frozen model produces on a corpus.

Keys are taken after RoPE, as the cache holds them; every (token, KV head) pair is one vector of size head_dim.
Training step (official defaults: 4096 atoms, sparsity 8, Adam lr 1e-4 annealed to 0 by a cosine): encode a batch
with OMP (no gradient), decode ``x^ = D y``, MSE, remove from each atom's gradient its component along the atom,
Adam, renormalise atoms.
"""

from __future__ import annotations

import torch

from llmx.plugins.lexico.omp import omp, reconstruct


@torch.no_grad()
def collect_kv(model, windows: torch.Tensor, batch_size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (keys, values) as ``[tokens * kv_heads, head_dim]`` from the cache a forward pass fills."""
    per_layer: list[tuple[list, list]] = []
    windows = windows.to(next(model.parameters()).device)
    for i in range(0, len(windows), batch_size):
        cache = model(input_ids=windows[i:i + batch_size], use_cache=True).past_key_values
        for layer_idx, layer in enumerate(cache.layers):
            if len(per_layer) <= layer_idx:
                per_layer.append(([], []))
            per_layer[layer_idx][0].append(layer.keys.reshape(-1, layer.keys.shape[-1]).float())
            per_layer[layer_idx][1].append(layer.values.reshape(-1, layer.values.shape[-1]).float())
    return [(torch.cat(k), torch.cat(v)) for k, v in per_layer]


def normalize_atoms(d: torch.Tensor) -> torch.Tensor:
    return d / d.norm(dim=0, keepdim=True).clamp(min=1e-12)


def random_dictionary(dim: int, atoms: int, seed: int = 0) -> torch.Tensor:
    """Kaiming-uniform atoms scaled to unit norm (the official initialisation), drawn on the CPU: one seed gives one
    dictionary on every device."""
    gen = torch.Generator().manual_seed(seed)
    bound = (6.0 / atoms) ** 0.5
    return normalize_atoms((torch.rand(dim, atoms, generator=gen, device="cpu") * 2 - 1) * bound)


def learn(vectors: torch.Tensor, atoms: int, sparsity: int, steps: int, lr: float = 1e-3, batch: int = 256,
          seed: int = 0, progress=lambda x, **_: x) -> tuple[torch.Tensor, list[float]]:
    """A dictionary ``[head_dim, atoms]`` with unit-norm atoms, and the training loss per step."""
    D = torch.nn.Parameter(random_dictionary(vectors.shape[1], atoms, seed).to(vectors.device))
    opt = torch.optim.Adam([D], lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)  # to 0 over training, as the official code
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in progress(range(steps), description="dictionary"):
        pick = torch.randint(0, len(vectors), (batch,), generator=gen, device="cpu")  # the same batches on every device
        x = vectors[pick.to(vectors.device)]
        idx, coef = omp(D.detach(), x, sparsity)
        loss = torch.nn.functional.mse_loss(reconstruct(D, idx, coef), x)
        opt.zero_grad()
        loss.backward()
        with torch.no_grad():
            D.grad -= D * (D.grad * D).sum(0, keepdim=True)  # keep the update tangent to the unit sphere
        opt.step()
        schedule.step()
        with torch.no_grad():
            D.copy_(normalize_atoms(D))
        losses.append(float(loss.detach()))
    return D.detach(), losses


def relative_error(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int, fp8: bool = True) -> float:
    """``||x - x^|| / ||x||`` over all vectors, with coefficients rounded to fp8 as stored."""
    from llmx.plugins.lexico.omp import to_fp8

    idx, coef = omp(dictionary.to(x.device), x, sparsity)
    if fp8:
        coef = to_fp8(coef).float()
    return float((reconstruct(dictionary.to(x.device), idx, coef) - x).norm() / x.norm())
