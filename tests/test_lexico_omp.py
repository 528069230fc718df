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
    x = torch.randn(600, 64, generator=gen)  # at least as many signals as atoms: the kernel's call
    idx_ref, coef_ref = omp(d, x, 8)
    idx, coef = omp(d.cuda(), x.cuda(), 8)
    rec_ref, rec = reconstruct(d, idx_ref, coef_ref), reconstruct(d, idx.cpu(), coef.cpu())
    assert torch.allclose(rec, rec_ref, atol=1e-3)
    assert (idx.cpu().sort(1).values == idx_ref.sort(1).values).all(1).float().mean() > 0.98


def kernel_in_torch(b, G, idx, coef, m, n, s, d, degenerate, dead):
    """``kernels/omp.cu``'s ``omp_gram`` in PyTorch, vectorised over its blocks (one per signal): from ``b = D^T x``
    and ``G = D^T D``, per iteration the argmax of ``|b - G[S]^T g|`` over atoms not chosen (the lowest index on a
    tie), a Cholesky row for the new atom, the refit ``L L^T g = b_S``; at most ``min(s, d)`` atoms, and a signal stops
    when every atom is taken, when the best correlation is at most ``dead`` times its first, or when the pick's pivot
    is at most ``degenerate`` times ``G_jj``. Writes ``idx`` and ``coef`` in place."""
    support = torch.zeros(m, s, dtype=torch.long)
    gamma, L = torch.zeros(m, s), torch.zeros(m, s, s)
    used, live = torch.full((m,), min(s, d)), torch.ones(m, dtype=torch.bool)
    first = None
    for k in range(min(s, d)):
        c = b - torch.einsum("mk,mkn->mn", gamma[:, :k], G[support[:, :k]])
        a = c.abs().scatter(1, support[:, :k], -1.0)
        j = a.argmax(1)
        best = a.gather(1, j[:, None])[:, 0]
        first = best if first is None else first
        support[:, k] = torch.where(live, j, support[:, k])
        w = torch.linalg.solve_triangular(L[:, :k, :k], G[support[:, :k], j[:, None]][..., None], upper=False)[..., 0]
        pivot = G[j, j] - (w * w).sum(1)
        stop = (best < 0) | (best <= dead * first) | (pivot <= degenerate * G[j, j])
        used = torch.where(live & stop, k, used)
        live &= ~stop
        L[:, k, :k] = torch.where(live[:, None], w, L[:, k, :k])
        L[:, k, k] = torch.where(live, pivot.clamp(min=1e-30).sqrt(), 1.0)  # a stopped signal's rows: never read
        Lk = L[:, :k + 1, :k + 1]
        z = torch.linalg.solve_triangular(Lk, b.gather(1, support[:, :k + 1])[..., None], upper=False)
        g = torch.linalg.solve_triangular(Lk.transpose(1, 2), z, upper=True)[..., 0]
        gamma[:, :k + 1] = torch.where(live[:, None], g, gamma[:, :k + 1])
    kept = torch.arange(s) < used[:, None]
    idx.copy_(torch.where(kept, support, support[:, :1]))
    coef.copy_(torch.where(kept, gamma, torch.zeros_like(gamma)))


@pytest.fixture
def kernel_on_cpu(monkeypatch):
    """The CUDA path of ``omp`` run on the CPU: CuPy stands in as identity wrappers and the launch runs
    ``kernel_in_torch``. Yields the launches: (grid, block, shared memory, id of the Gram's storage, signals)."""
    import sys
    import types

    from llmx.core import kernels

    launches = []

    def launch(path, name, grid, block, args, like, shared_mem=0):
        b, G, idx, coef, m, n, s, d, degenerate, dead = args
        assert name == "omp_gram" and b.shape == (m, n) and G.shape == (n, n) and idx.shape == coef.shape == (m, s)
        launches.append((grid, block, shared_mem, G.untyped_storage().data_ptr(), m))
        kernel_in_torch(b, G, idx, coef, m, n, s, d, degenerate, dead)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=lambda t: t, int32=int, float32=float))
    monkeypatch.setattr(kernels, "use_kernel", lambda *tensors: True)
    monkeypatch.setattr(kernels, "launch", launch)
    return launches


def test_kernel_path_matches_the_reference_in_one_or_many_launches(kernel_on_cpu):
    """The CUDA path's host side (one Gram per call, correlations per launch, outputs written in place) with the
    kernel's algorithm run on the CPU: the reference's codes, however many launches; a call with fewer signals than
    atoms runs the reference (no Gram)."""
    from llmx.plugins.lexico import omp as omp_mod

    D, x = problem(d=32, n=256, m=300, seed=7)
    D, x = D.float(), x.float()
    ref_idx, ref_coef = omp_mod._omp_qr(D.T.contiguous(), x, 6, None)
    one = omp(D, x, 6)
    assert kernel_on_cpu == [((300,), (256,), 0, kernel_on_cpu[0][3], 300)]  # no dynamic shared memory asked for
    kernel_on_cpu.clear()
    many = omp(D, x, 6, chunk=37)
    assert [m for *_, m in kernel_on_cpu] == [37] * 8 + [4]
    assert len({g for *_, g, _ in kernel_on_cpu}) == 1  # one Gram for the whole call
    for idx, coef in (one, many):
        assert torch.equal(idx.sort(1).values, ref_idx.sort(1).values)
        assert torch.allclose(reconstruct(D, idx, coef), reconstruct(D, ref_idx, ref_coef), atol=1e-4)
    assert torch.equal(one[0], many[0])
    kernel_on_cpu.clear()
    few = omp(D, x[:255], 6)
    assert kernel_on_cpu == [] and torch.equal(few[0], ref_idx[:255])
    over = torch.nn.functional.normalize(torch.randn(16, 64, generator=torch.Generator().manual_seed(0)), dim=0)
    idx, coef = omp(over, x[:100, :16], 24)  # s > head_dim: the kernel's early stop, like the reference's
    assert len(kernel_on_cpu) == 1 and torch.isfinite(coef).all() and (coef[:, 16:] == 0).all()
    assert torch.allclose(reconstruct(over, idx, coef), x[:100, :16], atol=1e-3)


def test_kernel_path_stops_early_on_the_gpu_tests_data(kernel_on_cpu):
    """tests/test_lexico_cuda.py's early-stop data (seed 0, d = 16, 64 atoms, 100 signals, s = 24): every signal
    keeps exactly 16 atoms, the reference's, with its coefficients. The kernel's old stop (an absolute 1e-6 on a pivot
    that fp32 gets by cancelling ~1 against ~1) gave row 40 a 17th atom with coefficient -1.49; the same stop without
    the rank bound still does here."""
    from llmx.plugins.lexico import omp as omp_mod

    gen = torch.Generator().manual_seed(0)
    d = torch.nn.functional.normalize(torch.randn(16, 64, generator=gen), dim=0)
    x = torch.randn(100, 16, generator=gen)
    idx, coef = omp(d, x, 24)
    assert len(kernel_on_cpu) == 1
    assert torch.isfinite(coef).all() and (coef[:, :16] != 0).all() and (coef[:, 16:] == 0).all()
    ref_idx, ref_coef = omp_mod._omp_qr(d.T.contiguous(), x, 24, None)
    assert torch.equal(idx[:, :16].sort(1).values, ref_idx[:, :16].sort(1).values)
    assert torch.allclose(reconstruct(d, idx, coef), x, atol=1e-4)
    ref = torch.zeros(100, 64).scatter_add_(1, ref_idx, ref_coef)
    assert torch.allclose(torch.zeros(100, 64).scatter_add_(1, idx, coef), ref, atol=1e-4)
    b, G = x @ d, d.T @ d
    old_idx, old_coef = torch.zeros(100, 24, dtype=torch.long), torch.zeros(100, 24)
    kernel_in_torch(b, G, old_idx, old_coef, 100, 64, 24, 24, 1e-6, 0.0)
    assert (old_coef[:, 16:] != 0).any()


@pytest.mark.parametrize("atoms", [64, 4096, 16384, 32767])
def test_cuda_passes_stay_within_their_memory_budget_at_any_dictionary_size(atoms):
    from llmx.plugins.lexico.omp import PASS_BYTES, cuda_chunk

    step = cuda_chunk(atoms)
    assert step * atoms * 4 <= PASS_BYTES < (step + 1) * atoms * 4
    assert step >= 512  # int16 ids cap atoms at 32767: a pass still takes hundreds of signals


@pytest.mark.parametrize(("atoms", "dim", "s"), [(1024, 128, 32), (4096, 128, 8), (128, 16, 24)])
def test_a_reference_pass_holds_what_pass_floats_counts(atoms, dim, s):
    """CUDA sizes a pass by ``pass_floats`` per signal, not by the correlations alone (a tenth of the reference's
    workspace at 1024 atoms, s = 32, d = 128: Q, a Gram-Schmidt temporary, R): a 256-signal reference pass, measured
    on the CPU, peaks at 90-100% of the count."""
    from llmx.core.memory import PeakMemory
    from llmx.plugins.lexico import omp as omp_mod

    with PeakMemory("cpu") as pm:
        atoms_t = torch.nn.functional.normalize(torch.randn(dim, atoms), dim=0).T.contiguous()
        x = torch.randn(256, dim)
        with pm.section():
            omp_mod._omp_qr(atoms_t, x, s, None)
    counted = 256 * omp_mod.pass_floats(atoms, dim, s, kernel=False) * 4
    assert 0.9 * counted <= pm.peak_bytes <= counted
    assert omp_mod.cuda_chunk(omp_mod.pass_floats(atoms, dim, s, kernel=False)) * counted // 256 <= omp_mod.PASS_BYTES


def test_the_kernel_needs_no_dynamic_shared_memory():
    """The compiled kernel's shared memory is static and small (ptxas' report), and its source asks for none per
    atom: any dictionary size (16384, 32767 atoms) launches under the 48 KiB default, no opt-in needed."""
    import re
    import shutil
    import subprocess
    import tempfile

    from llmx.plugins.lexico.omp import KERNEL, MAX_S, THREADS

    source = KERNEL.read_text()
    assert "extern __shared__" not in source
    assert f"#define MAX_S {MAX_S}\n" in source and f"#define THREADS {THREADS}\n" in source  # the host's copies
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([nvcc, "-arch=sm_80", "-std=c++17", "--cubin", "-Xptxas", "-v", "-o", f"{tmp}/k.cubin",
                               str(KERNEL)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    smem = [int(v) for v in re.findall(r"(\d+) bytes smem", proc.stderr)]
    assert smem and max(smem) < 8 * 1024


def test_a_cache_on_the_kernel_path_keeps_nothing_uncounted_and_decode_steps_build_no_gram(kernel_on_cpu):
    """A cache on the CUDA path (run on the CPU): the codecs keep only what ``dictionary_bytes`` counts (they used to
    keep ``D^T D`` per dictionary, N^2 fp32 each, counted nowhere). The prefill, compressing as many vectors as atoms,
    runs the kernel with a Gram of its own; the decode steps, two vectors each, run the reference: no Gram in their
    measured peak; the prefill's peak holds its Gram."""
    from llmx.core import models
    from llmx.plugins.lexico.cache import CompressedCache
    from llmx.plugins.lexico.codecs import ENCODE_CHUNK, LexicoCodec
    from llmx.plugins.lexico.measure import decode_peak, prefill_peak

    model, _ = models.load("ref:llama-test")
    cfg, atoms = model.config, 1024
    gen = torch.Generator().manual_seed(0)
    d = torch.nn.functional.normalize(torch.randn(cfg.head_dim, atoms, generator=gen), dim=0)
    ids = torch.randint(3, cfg.vocab_size, (1, 520), generator=gen)
    def make():
        return CompressedCache(lambda i: LexicoCodec(d, d, 4), cfg.num_hidden_layers, buffer_length=4, chunk=1)

    with torch.no_grad():
        assert prefill_peak(model, ids, 516, make()) >= (atoms + ENCODE_CHUNK) * atoms * 4  # Gram, correlations
        kernel_on_cpu.clear()
        stored, peak = decode_peak(model, ids, 516, cache := make())  # 512 x 2 heads compressed, 3 steps of 1 x 2
    assert len(kernel_on_cpu) == 2 * cfg.num_hidden_layers * (512 * cfg.num_key_value_heads // ENCODE_CHUNK)
    assert peak < atoms * atoms * 4
    assert cache.dictionary_bytes() == d.numel() * 4 + 256 * 4  # one dictionary tensor, and the fp8 decoding table
    for layer in cache.layers:
        assert {id(t) for t in tensors_in(vars(layer.codec))} <= {id(t) for t in layer.codec.held()}


def tensors_in(obj) -> list[torch.Tensor]:
    """Every tensor inside nested dicts, tuples and lists."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, tuple | list) else ()
    return [t for item in items for t in tensors_in(item)]
