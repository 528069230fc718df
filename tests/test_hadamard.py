"""Hadamard rotations: orthogonality for power-of-two and Paley-based sizes, fast = dense, and folding invariance."""

from __future__ import annotations

import pytest
import torch

from llmx.core.quant.hadamard import fwht, hadamard_matrix, hadamard_transform


@pytest.mark.parametrize("n", [1, 2, 8, 12, 20, 28, 40, 64, 96, 192, 1536, 5120])
def test_h_ht_is_n_identity_and_fast_equals_dense(n):
    h = hadamard_matrix(n)
    assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))
    x = torch.randn(3, n, dtype=torch.float64)
    assert torch.allclose(hadamard_transform(x), x @ h.T / n**0.5, atol=1e-10)


def test_unsupported_size_is_a_clear_error():
    with pytest.raises(ValueError, match="no Hadamard construction"):
        hadamard_matrix(7)
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.zeros(3, 12))


def test_folding_a_rotation_into_a_linear_leaves_outputs_unchanged():
    torch.manual_seed(0)
    w, x = torch.randn(16, 96, dtype=torch.float64), torch.randn(5, 96, dtype=torch.float64)
    w_rot = hadamard_transform(w)  # W H^T / sqrt(n)
    assert torch.allclose(hadamard_transform(x) @ w_rot.T, x @ w.T, atol=1e-10)


def test_rotation_spreads_an_outlier_channel():
    x = torch.zeros(1, 64)
    x[0, 3] = 64.0
    y = hadamard_transform(x)
    assert torch.allclose(y.abs(), torch.full_like(y, 8.0)) and torch.isclose(y.norm(), x.norm())


def test_the_factorisation_is_found_by_arithmetic_and_the_base_built_once(monkeypatch):
    """An online rotation runs every forward: 11008 = 5504 x 2 (Paley I, 5503 prime) must not rebuild its base."""
    from llmx.core.quant import hadamard

    hadamard._split.cache_clear()
    monkeypatch.setattr(hadamard, "_jacobsthal", lambda q: (_ for _ in ()).throw(AssertionError("built a matrix")))
    assert hadamard._split(11008) == (5504, 2) and hadamard._split(1536) == (12, 128)
    monkeypatch.undo()
    hadamard._base.cache_clear()
    hadamard._base_on.cache_clear()
    x = torch.randn(2, 704)  # 704 = 44 x 16, Paley I (43 prime)
    first = hadamard.hadamard_transform(x)
    monkeypatch.setattr(hadamard, "_jacobsthal", lambda q: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert torch.equal(hadamard.hadamard_transform(x), first)
    assert torch.allclose(first.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
