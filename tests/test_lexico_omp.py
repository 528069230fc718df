"""Lexico's building blocks: batched OMP equals scikit-learn's, its residual never grows with sparsity, it beats
plain matching pursuit, and a learned dictionary beats a random one on real KV vectors."""

from __future__ import annotations

import pytest
import torch

from llmx.plugins.lexico.dictionary import collect_kv, learn, random_dictionary, relative_error
from llmx.plugins.lexico.omp import matching_pursuit, omp, reconstruct


def problem(d=32, n=128, m=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    D = torch.randn(d, n, dtype=torch.float64, generator=gen)
    return D / D.norm(dim=0), torch.randn(m, d, dtype=torch.float64, generator=gen)


@pytest.mark.parametrize("s", [1, 3, 6])
def test_batched_omp_agrees_with_scikit_learn(s):
    sklearn = pytest.importorskip("sklearn.linear_model")
    D, x = problem(seed=s)
    idx, coef = omp(D, x, s)
    ref = torch.tensor(sklearn.OrthogonalMatchingPursuit(n_nonzero_coefs=s, fit_intercept=False)
                       .fit(D.numpy(), x.numpy().T).coef_)
    assert torch.allclose(reconstruct(D, idx, coef).double(), ref @ D.T, atol=1e-5)
    assert all(set(idx[i].tolist()) == set(torch.nonzero(ref[i]).flatten().tolist()) for i in range(len(x)))
    assert all(len(set(r.tolist())) == s for r in idx)  # no atom chosen twice


def test_residual_never_increases_with_sparsity_and_omp_beats_mp():
    D, x = problem(d=24, n=96, seed=3)
    errors = [float((reconstruct(D, *omp(D, x, s)) - x).norm(dim=1).max()) for s in range(1, 13)]
    per_signal = torch.stack([(reconstruct(D, *omp(D, x, s)) - x).norm(dim=1) for s in range(1, 13)])
    assert torch.all(per_signal[1:] <= per_signal[:-1] + 1e-6) and errors[-1] < errors[0]
    mp = (reconstruct(D, *matching_pursuit(D, x, 6)) - x).norm()
    assert (reconstruct(D, *omp(D, x, 6)) - x).norm() < mp


def test_complete_dictionary_is_exact_and_more_atoms_than_dimensions_stop_early():
    D = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))[0]
    x = torch.randn(50, 16, dtype=torch.float64)
    assert torch.allclose(reconstruct(D, *omp(D, x, 16)).double(), x, atol=1e-5)
    over = torch.nn.functional.normalize(torch.randn(16, 64, dtype=torch.float64), dim=0)
    idx, coef = omp(over, x, 24)  # s > head_dim: exact after 16 atoms, then nothing more to take
    assert torch.isfinite(coef).all() and (coef[:, 16:] == 0).all()
    assert torch.allclose(reconstruct(over, idx, coef).double(), x, atol=1e-4)


def test_tolerance_stops_each_signal_at_its_own_error_and_chunks_do_not_matter():
    D, x = problem(d=24, n=96, seed=5)
    idx, coef = omp(D, x, 12, tol=0.5)
    err = (reconstruct(D, idx, coef) - x).norm(dim=1) / x.norm(dim=1)
    used = (coef != 0).sum(1)
    assert (err <= 0.5 + 1e-6).all() and used.float().mean() < 12
    fewer = (reconstruct(D, *omp(D, x, 12)) - x).norm(dim=1)
    assert (fewer <= err * x.norm(dim=1) + 1e-6).all()
    a, b = omp(D, x, 6, chunk=7), omp(D, x, 6)
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1])


def test_learned_dictionary_beats_random_on_real_kv_vectors():
    from llmx.core import models
    from llmx.core.data import random_windows

    model, tok = models.load("ref:llama-test")
    keys, values = collect_kv(model, random_windows(tok, "stdlib", 24, 64, seed=0))[0]
    held_k, held_v = collect_kv(model, random_windows(tok, "stdlib", 8, 64, seed=1, split="validation"))[0]
    assert keys.shape[1] == model.config.hidden_size // model.config.num_attention_heads
    for train, held in ((keys, held_k), (values, held_v)):
        learned, losses = learn(train, atoms=64, sparsity=4, steps=150, lr=1e-2, seed=0)
        assert torch.allclose(learned.norm(dim=0), torch.ones(64), atol=1e-5)
        assert losses[-1] < losses[0]
        random = random_dictionary(train.shape[1], 64, seed=0)
        assert relative_error(learned, held, 4) < 0.8 * relative_error(random, held, 4)


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('llmx.core.kernels', fromlist=['available']).available()")
def test_omp_kernel_matches_reference():
    gen = torch.Generator().manual_seed(0)
    d = torch.nn.functional.normalize(torch.randn(64, 512, generator=gen), dim=0)
    x = torch.randn(300, 64, generator=gen)
    idx_ref, coef_ref = omp(d, x, 8)
    idx, coef = omp(d.cuda(), x.cuda(), 8)
    rec_ref, rec = reconstruct(d, idx_ref, coef_ref), reconstruct(d, idx.cpu(), coef.cpu())
    assert torch.allclose(rec, rec_ref, atol=1e-3)
    assert (idx.cpu().sort(1).values == idx_ref.sort(1).values).all(1).float().mean() > 0.98
