"""Batched orthogonal matching pursuit over a dictionary of unit-norm atoms (Lexico, arXiv 2412.08890, Sec. 3).

Gram-based, as the official ``omp_v0``: with ``G = D^T D`` and ``b = D^T x`` precomputed, iteration ``k`` picks the
atom most correlated with the residual, extends the Cholesky factor of ``G_SS`` by one row (an incremental update,
no refactorisation), and refits the coefficients on the whole support by least squares (the refit is what makes it
OMP rather than matching pursuit). Everything is vectorised over the signals; the correlations come from one GEMM of
the residual with the dictionary per iteration (cheaper than gathering Gram rows when ``d < N``).
"""

from __future__ import annotations

from pathlib import Path

import torch

KERNEL = Path(__file__).parent / "kernels" / "omp.cu"


def omp(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """``dictionary`` [d, N] (unit-norm columns), ``x`` [M, d] -> (atom indices [M, s] int64, coefficients [M, s]).
    CUDA tensors go to the CuPy kernel (one block per signal), everything else to this PyTorch reference."""
    from llmx.core import kernels

    if kernels.use_kernel(dictionary, x) and sparsity <= 32:
        return omp_cuda(dictionary, x, sparsity)
    if x.shape[0] > chunk:
        parts = [omp(dictionary, x[i:i + chunk], sparsity, chunk) for i in range(0, x.shape[0], chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    D = dictionary.float()
    G = D.T @ D
    b = x.float() @ D  # [M, N], D^T x per signal
    m, n = b.shape
    s = min(sparsity, n)
    idx = torch.zeros(m, s, dtype=torch.long, device=x.device)
    L = torch.zeros(m, s, s, device=x.device)
    coef = torch.zeros(m, 0, device=x.device)
    rows = torch.arange(m, device=x.device)
    taken = torch.zeros(m, n, dtype=torch.bool, device=x.device)
    atoms = D.T  # [N, d]
    x = x.float()
    for k in range(s):
        corr = b if k == 0 else (x - torch.einsum("mk,mkd->md", coef, atoms[idx[:, :k]])) @ D
        j = corr.abs().masked_fill(taken, -1.0).argmax(dim=1)
        taken[rows, j] = True
        idx[:, k] = j
        if k == 0:
            L[:, 0, 0] = G[j, j].sqrt()
        else:
            g = G[idx[:, :k], j[:, None]]  # G[S, j]: [M, k]
            w = torch.linalg.solve_triangular(L[:, :k, :k], g[..., None], upper=False).squeeze(-1)
            L[:, k, :k] = w
            L[:, k, k] = (G[j, j] - (w * w).sum(-1)).clamp(min=1e-10).sqrt()
        rhs = b.gather(1, idx[:, :k + 1])[..., None]
        z = torch.linalg.solve_triangular(L[:, :k + 1, :k + 1], rhs, upper=False)
        coef = torch.linalg.solve_triangular(L[:, :k + 1, :k + 1].transpose(1, 2), z, upper=True).squeeze(-1)
    return idx, coef


def omp_cuda(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int) -> tuple[torch.Tensor, torch.Tensor]:
    import cupy

    from llmx.core import kernels

    D = dictionary.float().contiguous()
    b = (x.float() @ D).contiguous()
    G = (D.T @ D).contiguous()
    m, n = b.shape
    idx = torch.empty(m, sparsity, dtype=torch.long, device=x.device)
    coef = torch.empty(m, sparsity, dtype=torch.float32, device=x.device)
    kernels.launch(KERNEL, "omp_gram", (m,), (256,), (cupy.asarray(b), cupy.asarray(G), cupy.asarray(idx), cupy.asarray(coef),
                                                      cupy.int32(m), cupy.int32(n), cupy.int32(sparsity)), x, shared_mem=4 * n)
    return idx, coef


def matching_pursuit(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain matching pursuit (no refit): the naive baseline OMP must beat."""
    D = dictionary.float()
    r = x.float().clone()
    idx = torch.zeros(x.shape[0], sparsity, dtype=torch.long)
    coef = torch.zeros(x.shape[0], sparsity)
    for k in range(sparsity):
        c = r @ D
        j = c.abs().argmax(dim=1)
        a = c.gather(1, j[:, None]).squeeze(1)
        idx[:, k], coef[:, k] = j, a
        r -= a[:, None] * D[:, j].T
    return idx, coef


def reconstruct(dictionary: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``sum_j coef_j D[:, idx_j]`` for every row: [M, d]."""
    return torch.einsum("ms,msd->md", coef.float(), dictionary.float().T[idx])


def to_fp8(coef: torch.Tensor) -> torch.Tensor:
    """Coefficients as stored: float8 e4m3 (the method's storage format, part of its error)."""
    return coef.to(torch.float8_e4m3fn)
