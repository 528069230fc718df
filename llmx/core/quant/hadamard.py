"""Walsh-Hadamard rotations for quantization (QuaRot / Quamba2 style).

Power-of-two sizes use the fast transform (``n log n`` butterflies). Other sizes ``n = m * 2^k`` use a Kronecker
product ``H_m (x) H_{2^k}`` where ``H_m`` comes from a Paley construction (Paley I: ``m = q + 1`` for a prime
``q = 3 mod 4``; Paley II: ``m = 2(q + 1)`` for a prime ``q = 1 mod 4``), e.g. 12 = 11 + 1, 20 = 19 + 1,
28 = 2(13 + 1); Mamba2's 1536 = 12 * 128 and 5120 = 20 * 256. All transforms are orthonormal (scaled by 1/sqrt(n)).
"""

from __future__ import annotations

import functools
import math

import torch


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % d for d in range(2, int(math.isqrt(q)) + 1))


def _jacobsthal(q: int) -> torch.Tensor:
    residues = {(x * x) % q for x in range(1, q)}
    chi = torch.tensor([0] + [1 if a in residues else -1 for a in range(1, q)], dtype=torch.float64)
    idx = (torch.arange(q)[None, :] - torch.arange(q)[:, None]) % q
    return chi[idx]


def _paley_kind(m: int) -> str | None:
    """Which Paley construction gives order ``m`` (I: ``m - 1`` a prime 3 mod 4; II: ``m / 2 - 1`` a prime 1 mod 4)."""
    if _is_prime(m - 1) and (m - 1) % 4 == 3:
        return "I"
    if m % 2 == 0 and _is_prime(m // 2 - 1) and (m // 2 - 1) % 4 == 1:
        return "II"
    return None


def _paley(m: int) -> torch.Tensor:
    """A Hadamard matrix of order ``m`` by Paley I or II (``_paley_kind(m)`` must name one)."""
    if _paley_kind(m) == "I":
        q = m - 1
        S = torch.zeros(m, m, dtype=torch.float64)
        S[0, 1:], S[1:, 0], S[1:, 1:] = 1, -1, _jacobsthal(q)
        return S + torch.eye(m, dtype=torch.float64)
    q = m // 2 - 1
    C = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    C[0, 1:], C[1:, 0], C[1:, 1:] = 1, 1, _jacobsthal(q)
    A = torch.tensor([[1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64)
    B = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    return torch.kron(C, A) + torch.kron(torch.eye(q + 1, dtype=torch.float64), B)


@functools.lru_cache(maxsize=64)
def _split(n: int) -> tuple[int, int]:
    """``n = m * 2^k`` with the largest power of two such that a base of order ``m`` exists (decided by arithmetic:
    no matrix is built to find out)."""
    if n < 1:
        raise ValueError("size must be positive")
    p = n & -n
    while p >= 1:
        m = n // p
        if m == 1 or _paley_kind(m) is not None:
            return m, p
        p //= 2
    raise ValueError(f"no Hadamard construction known here for size {n} (need m * 2^k with a Paley order m)")


@functools.lru_cache(maxsize=32)
def _base(m: int) -> torch.Tensor:
    return torch.ones(1, 1, dtype=torch.float64) if m == 1 else _paley(m)


@functools.lru_cache(maxsize=32)
def _base_on(m: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The base matrix converted once per dtype and device (an online rotation runs every forward)."""
    return _base(m).to(device=device, dtype=dtype)


def hadamard_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The (unnormalised, +-1) float64 Hadamard matrix used for size ``n`` on ``device``: ``H H^T = n I``."""
    m, p = _split(n)
    sylvester = torch.ones(1, 1, dtype=torch.float64, device=device)
    while sylvester.shape[0] < p:
        sylvester = torch.cat([torch.cat([sylvester, sylvester], 1), torch.cat([sylvester, -sylvester], 1)], 0)
    return torch.kron(_base_on(m, torch.float64, str(torch.device(device))), sylvester)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh-Hadamard transform along the last dim (power-of-two length): ``x @ H^T``."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two length, got {n}")
    shape, h = x.shape, 1
    y = x.reshape(-1, n)
    while h < n:
        y = y.reshape(-1, n // (2 * h), 2, h)
        y = torch.cat([y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]], dim=-1)
        h *= 2
    return y.reshape(shape)


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal rotation of the last dim: ``x @ H^T / sqrt(n)`` for any size :func:`hadamard_matrix` supports."""
    n = x.shape[-1]
    m, p = _split(n)
    y = fwht(x.reshape(*x.shape[:-1], m, p))
    if m > 1:
        y = torch.einsum("ij,...jk->...ik", _base_on(m, x.dtype, str(x.device)), y)
    return y.reshape(x.shape) / math.sqrt(n)
