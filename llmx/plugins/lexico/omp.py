"""Batched orthogonal matching pursuit over a dictionary of unit-norm atoms (Lexico, arXiv 2412.08890, Sec. 3).

CPU reference (``omp``): OMP by incremental QR in signal space, vectorised over the signals. Iteration ``k`` takes
the atom ``j`` most correlated with the residual (one GEMM ``r D`` and an argmax), orthonormalises it against the
atoms already chosen (``q_k``, Gram-Schmidt applied twice), records ``R[:, k] = Q^T d_j`` and ``z_k = q_k . x``, and
removes ``z_k q_k`` from the residual. The coefficients are the least-squares refit on the whole support,
``R gamma = z`` (one batched back-substitution at the end): the refit is what makes it OMP rather than matching
pursuit. The residual is orthogonal to the chosen atoms, so no mask over the atoms is needed.

Early stop per signal, as the official ``omp_v0``'s ``tol``: once ``||r||^2 <= tol^2 ||x||^2``, or when the picked
atom lies in the span already chosen (``s >= head_dim`` on an exactly represented signal), the signal takes no
further atoms (their coefficients are 0).

CUDA tensors go to the CuPy kernel (``kernels/omp.cu``: Gram-based with Cholesky updates as the official ``omp_v0``,
one block per signal) when a call has at least as many signals as atoms (``takes_kernel``); smaller calls (a cache
compressing a few tokens at a decode step) run the reference on the device, which needs no Gram. The kernel's early
stop is its own (``KERNEL_DEGENERATE``, ``KERNEL_DEAD``): it sees pivots and correlations through fp32 cancellations.

Device memory, all of it freed on return (nothing outlives a call; one Gram kept per dictionary would instead hold 2L
of them, the dictionaries being per layer: 4 GiB at 32 layers and 4096 atoms, outside every memory figure):

- a kernel call holds the Gram ``D^T D``: ``4 N^2`` bytes (64 MiB at 4096 atoms, 1 GiB at 16384, 4.0 GiB at 32767),
  on top of its passes; it has at least N signals, so the Gram is no larger than the ``4 M N`` bytes of correlations
  the call computes, though those are held one pass at a time;
- either path holds an fp32 copy of the dictionary (``4 d N`` bytes) and one pass at a time: a pass (a launch or a
  reference chunk) holds at most ``PASS_BYTES`` of per-signal workspace, ``pass_floats`` per signal: its correlations
  (N) and its fp32 signal (d); the reference adds ``Q`` [s, d], the largest Gram-Schmidt temporary [s, d], ``R``
  [s, s] and a few [d] vectors (at 1024 atoms, s = 32, d = 128: 11 times the correlations alone). A 2k-token
  prefill of 8 KV heads at 4096 atoms is 4 launches;
- the outputs (``12 M s`` bytes) and the caller's signals are the caller's.
"""

from __future__ import annotations

from pathlib import Path

import torch

KERNEL = Path(__file__).parent / "kernels" / "omp.cu"
MAX_S, THREADS = 32, 256  # the kernel's MAX_S and THREADS: sparsity it handles, threads per signal
PASS_BYTES = 64 << 20  # CUDA: per-pass workspace (``pass_floats`` per signal): 4096 signals' correlations at 4096 atoms
DEGENERATE = 1e-6  # reference: squared norm of an atom's part outside the chosen span below which it adds nothing
# The kernel's stops, relative, as it gets pivots (G_jj - |w|^2) and correlations (b_j - G[S, j] g) by fp32
# cancellation. Measured (the kernel's steps in fp32 against the same steps in fp64; d = 8..128, N = 4d..64d, s up to
# min(d, 32), 200 to 1000 signals each): while the residual lived, a pivot was off by at most 1.5e-6 G_jj and a
# correlation by 1e-6 of the first pick's |c|, and the picked atoms' pivots were at least 0.1 G_jj (a pick's pivot is
# at least (c_j / |r|)^2, r being orthogonal to the chosen span). The compiled kernel on tests/test_lexico_kernel_cpu.py's
# corner cases agrees: either test alone stops them all at 3e-6 (pivot) or 1e-6 (dead), not at 1e-6 or 3e-7. The old
# absolute 1e-6 on the pivot sat in that noise: on 100 signals at d = 16, s = 24 a 17th atom, its pivot 0 in exact
# arithmetic and ~1e-6 in fp32, came in with coefficient -1.49. Besides these, a signal stops at min(s, d) atoms
# (rank) and when every atom is taken. Each test backs the other up.
KERNEL_DEGENERATE = 1e-4  # pivot <= this * G_jj: the pick lies in the chosen span (~60x the pivots' rounding)
# best |c| <= this * the first pick's: the residual is rounding (10x the correlations' rounding). It can also drop a
# genuine atom that small (the GPU test's data has a 16th at 1.4e-5), changing the reconstruction by about 3e-5 of the
# signal at most (pivot >= 0.1), under fp16's resolution.
KERNEL_DEAD = 1e-5

@torch.no_grad()
def omp(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int, tol: float | None = None,
        chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``dictionary`` [d, N] (unit-norm columns), ``x`` [M, d] -> (atom indices [M, s] int64, coefficients [M, s]).
    ``tol``: stop a signal once its relative residual is at most ``tol``. ``chunk``: signals per pass (default
    ``cuda_chunk(pass_floats(...))`` on CUDA, 512 on the CPU)."""
    if sparsity < 1:
        raise ValueError(f"sparsity must be at least 1, got {sparsity}")
    (d, n), m = dictionary.shape, x.shape[0]
    kernel = takes_kernel(dictionary, x, sparsity, tol)
    chunk = chunk or (cuda_chunk(pass_floats(n, d, sparsity, kernel)) if x.is_cuda else 512)
    idx = torch.zeros(m, sparsity, dtype=torch.long, device=x.device)
    coef = torch.zeros(m, sparsity, device=x.device)
    if kernel:
        D = dictionary.float().contiguous()
        G = D.T @ D  # this call's Gram, shared by its launches, freed on return
        for i in range(0, m, chunk):
            _omp_gram(D, G, x[i:i + chunk], idx[i:i + chunk], coef[i:i + chunk])
        return idx, coef
    atoms = dictionary.T.float().contiguous()  # [N, d]: the one copy OMP makes (rows gather fast; D = atoms.T)
    for i in range(0, m, chunk):
        idx[i:i + chunk], coef[i:i + chunk] = _omp_qr(atoms, x[i:i + chunk].float(), sparsity, tol)
    return idx, coef


def kernel_shape(signals: int, atoms: int, sparsity: int, tol: float | None = None) -> bool:
    """Whether a call of this shape runs the CUDA kernel (given CUDA tensors and CuPy): at least as many signals as
    atoms (else the Gram would outweigh the call's correlations), s <= MAX_S, no tolerance."""
    return signals >= atoms and sparsity <= MAX_S and tol is None


def takes_kernel(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int, tol: float | None = None) -> bool:
    """Whether ``omp(dictionary, x, sparsity, tol)`` runs the CUDA kernel."""
    from llmx.core import kernels

    return kernel_shape(x.shape[0], dictionary.shape[1], sparsity, tol) and kernels.use_kernel(dictionary, x)


def pass_floats(atoms: int, dim: int, sparsity: int, kernel: bool) -> int:
    """4-byte words one signal holds in a CUDA pass: its correlations and its fp32 copy; the reference adds ``Q``
    [s, d], its largest Gram-Schmidt temporary [s, d], ``R`` [s, s], ``z`` and the ids [3 s], and its [d] vectors
    (residual before and after an update, atom, q twice)."""
    ref = 2 * sparsity * dim + sparsity * sparsity + 3 * sparsity + 5 * dim
    return atoms + dim + (0 if kernel else ref)


def cuda_chunk(floats: int) -> int:
    """Signals per pass on CUDA: as many as ``PASS_BYTES`` hold at ``floats`` 4-byte words per signal (``pass_floats``;
    ``cuda_chunk(N)``: N correlations alone)."""
    return max(1, PASS_BYTES // (4 * floats))


def _omp_gram(D: torch.Tensor, G: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor) -> None:
    """One launch of the CUDA kernel on ``x`` [m, d]; writes ``idx`` and ``coef`` [m, s] (views of the outputs)."""
    import cupy

    from llmx.core import kernels

    b = x.float() @ D  # [m, N]: the launch's correlations
    m, n = b.shape
    kernels.launch(KERNEL, "omp_gram", (m,), (THREADS,),
                   (cupy.asarray(b), cupy.asarray(G), cupy.asarray(idx), cupy.asarray(coef), cupy.int32(m),
                    cupy.int32(n), cupy.int32(idx.shape[1]), cupy.int32(D.shape[0]), cupy.float32(KERNEL_DEGENERATE),
                    cupy.float32(KERNEL_DEAD)), x)


def _omp_qr(atoms: torch.Tensor, x: torch.Tensor, s: int, tol: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    m, d = x.shape
    D = atoms.T
    idx = torch.zeros(m, s, dtype=torch.long, device=x.device)
    R = torch.zeros(m, s, s, device=x.device)
    z = torch.zeros(m, s, device=x.device)
    Q = torch.zeros(m, s, d, device=x.device)
    r = x.clone()
    floor = (tol * tol) * (x * x).sum(1) if tol is not None else None
    active = torch.ones(m, dtype=torch.bool, device=x.device)
    c = torch.empty(m, D.shape[1], device=x.device)
    for k in range(s):
        j = _argmax_abs(torch.mm(r, D, out=c))
        a = atoms.index_select(0, j)  # [M, d]: the chosen atoms
        q, proj = a, None
        if k:
            Qk = Q[:, :k]
            proj = (Qk * a[:, None]).sum(2)  # R[:k, k] = Q^T a
            q = a - (proj[:, :, None] * Qk).sum(1)
            q = q - ((Qk * q[:, None]).sum(2)[:, :, None] * Qk).sum(1)  # Gram-Schmidt again: Q stays orthonormal
        nu2 = (q * q).sum(1)
        if floor is not None:
            active &= (r * r).sum(1) > floor
        keep = active & (nu2 > DEGENERATE)
        nu = torch.where(keep, nu2.clamp(min=DEGENERATE).sqrt(), torch.ones_like(nu2))
        q = torch.where(keep[:, None], q / nu[:, None], torch.zeros_like(q))
        zk = (q * r).sum(1)
        r = r - zk[:, None] * q
        Q[:, k], z[:, k], idx[:, k] = q, zk, j
        if k:
            R[:, :k, k] = torch.where(keep[:, None], proj, torch.zeros_like(proj))
        R[:, k, k] = nu
    return idx, _back_substitute(R, z)


def _argmax_abs(c: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Row-wise argmax of ``|c|`` (``c`` is overwritten): the largest of each block of atoms, then the winning block's
    position. Exact, and several times faster on the CPU than ``argmax`` over the whole row."""
    m, n = c.shape
    c.abs_()
    if n % block:
        return c.argmax(1)
    blocks = c.view(m, n // block, block)
    best = blocks.amax(2).max(1).indices  # [M]
    inner = blocks[torch.arange(m, device=c.device), best].max(1).indices
    return best * block + inner


def _back_substitute(R: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Solve the upper-triangular ``R gamma = z`` for every signal at once (a loop over the s rows)."""
    s = z.shape[1]
    gamma = torch.zeros_like(z)
    for k in range(s - 1, -1, -1):
        acc = z[:, k] - (R[:, k, k + 1:] * gamma[:, k + 1:]).sum(1)
        gamma[:, k] = acc / R[:, k, k]
    return gamma


def matching_pursuit(dictionary: torch.Tensor, x: torch.Tensor, sparsity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain matching pursuit (no refit): the naive baseline OMP must beat."""
    D = dictionary.float()
    r = x.float().clone()
    idx = torch.zeros(x.shape[0], sparsity, dtype=torch.long, device=x.device)
    coef = torch.zeros(x.shape[0], sparsity, device=x.device)
    for k in range(sparsity):
        c = r @ D
        j = c.abs().argmax(dim=1)
        a = c.gather(1, j[:, None]).squeeze(1)
        idx[:, k], coef[:, k] = j, a
        r -= a[:, None] * D[:, j].T
    return idx, coef


def reconstruct(dictionary: torch.Tensor, idx: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``sum_j coef_j D[:, idx_j]`` for every row: [M, d]."""
    return torch.einsum("ms,msd->md", coef.float(), dictionary.float().T[idx.long()])


def to_fp8(coef: torch.Tensor) -> torch.Tensor:
    """Coefficients as stored: float8 e4m3 (the method's storage format, part of its error)."""
    return coef.to(torch.float8_e4m3fn)


_FP8_TABLES: dict[torch.device, torch.Tensor] = {}


def to_float(coef: torch.Tensor) -> torch.Tensor:
    """Stored coefficients as float32. float8 on the CPU goes through a 256-entry table (kept, 1 KiB: see
    ``held_tables``): the same values as ``.float()``, several times faster there, where the cast is scalar."""
    if coef.dtype != torch.float8_e4m3fn or coef.device.type != "cpu":
        return coef.float()
    table = _FP8_TABLES.get(coef.device)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8, device=coef.device).view(torch.float8_e4m3fn).float()
        _FP8_TABLES[coef.device] = table
    return table.index_select(0, coef.reshape(-1).view(torch.uint8).int()).view(coef.shape)


def held_tables(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tensors ``to_float`` keeps on ``device`` between calls (shared by every codec there), for the memory
    figures."""
    return tuple(t for d, t in _FP8_TABLES.items() if d == device)
