"""Lexico's CUDA OMP kernel, the real ``kernels/omp.cu``, compiled as host C++ with g++ and run on the CPU: a shim
header maps CUDA's block model onto fibers (``ucontext``, one OS thread), each of a block's threads running until its
next ``__syncthreads()``; a barrier round ends when every thread has reached it, and a block whose threads split
between a barrier and a return fails the run (a hang or undefined behaviour on a GPU). ``__shared__`` becomes
``static``: shared by the block's threads, left over from the block before (as uninitialised as on a GPU).

The kernel is checked against the reference (``omp._omp_qr``: the dense coefficient vectors, so the atoms, their
coefficients and every early stop) and against its PyTorch transcription (``kernel_in_torch``, which the CUDA path's
CPU tests run), on random inputs and on the corner cases: atoms not a multiple of the 256 threads, fewer atoms than
s, s above the dimension, duplicate atoms, atoms spanning a subspace, zero signals, the GPU test's early-stop data. A
kernel with a planted sign error, and the kernel with its old stop (an absolute 1e-6 on the pivot, no rank bound),
fail the same checks."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys

import pytest
import torch

from llmx.plugins.lexico import omp as omp_mod
from llmx.plugins.lexico.omp import KERNEL, KERNEL_DEAD, KERNEL_DEGENERATE, THREADS, reconstruct

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
              pytest.mark.skipif(sys.platform != "linux", reason="the shim's fibers are glibc's ucontext")]

SHIM = r"""
#include <math.h>
#include <ucontext.h>
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockIdx, blockDim, gridDim;
static ucontext_t scheduler, fibers[1024];
static int state[1024];  // 0 running, 1 waiting at a barrier, 2 returned
static void syncthreads_() { state[threadIdx.x] = 1; swapcontext(&fibers[threadIdx.x], &scheduler); }
#define __global__
#define __shared__ static
#define __syncthreads() syncthreads_()
#include KERNEL
#define omp_gram omp_gram_planted
#include PLANTED
#undef omp_gram

typedef void (*Kernel)(const float*, const float*, long long*, float*, int, int, int, int, float, float);
static Kernel kernel;
static const float *a_b, *a_G;
static long long* a_idx;
static float* a_coef;
static int a_M, a_N, a_s, a_d;
static float a_deg, a_dead;
static void entry(int t) { kernel(a_b, a_G, a_idx, a_coef, a_M, a_N, a_s, a_d, a_deg, a_dead); state[t] = 2; }

// Launches grid (M), block (threads) like a CUDA launch of omp_gram; 0, or -1 when a block's threads split between
// a barrier and a return.
extern "C" int launch(int planted, int threads, const float* b, const float* G, long long* idx, float* coef, int M,
                      int N, int s, int d, float degenerate, float dead) {
    static char stacks[1024][16384];
    kernel = planted ? omp_gram_planted : omp_gram;
    a_b = b; a_G = G; a_idx = idx; a_coef = coef; a_M = M; a_N = N; a_s = s; a_d = d; a_deg = degenerate;
    a_dead = dead;
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = {(unsigned)M, 1, 1};
    for (int m = 0; m < M; ++m) {
        blockIdx = {(unsigned)m, 0, 0};
        for (int t = 0; t < threads; ++t) {
            getcontext(&fibers[t]);
            fibers[t].uc_stack.ss_sp = stacks[t];
            fibers[t].uc_stack.ss_size = sizeof stacks[t];
            fibers[t].uc_link = &scheduler;
            makecontext(&fibers[t], (void (*)())entry, 1, t);
            state[t] = 0;
        }
        for (;;) {
            int done = 0;
            for (int t = 0; t < threads; ++t) {
                threadIdx = {(unsigned)t, 0, 0};
                swapcontext(&scheduler, &fibers[t]);
                done += state[t] == 2;
            }
            if (done == threads) break;
            if (done) return -1;
            for (int t = 0; t < threads; ++t) state[t] = 0;
        }
    }
    return 0;
}
"""

# A planted bug (the correlation update's sign flipped): the checks below must reject it.
PLANT = ("c -= G[(long long)support[i] * N + j] * gamma[i];", "c += G[(long long)support[i] * N + j] * gamma[i];")


@pytest.fixture(scope="module")
def cuda_on_cpu(tmp_path_factory):
    """``run(D, x, s, threads=32, planted=False, degenerate=..., dead=..., rank=d)`` -> (idx, coef): the compiled
    kernel on ``b = x D``, ``G = D^T D`` (the host's inputs), with the host's thresholds unless given."""
    tmp = tmp_path_factory.mktemp("omp_cu")
    source = KERNEL.read_text()
    assert source.count(PLANT[0]) == 1
    (tmp / "planted.cu").write_text(source.replace(*PLANT))
    (tmp / "shim.cpp").write_text(SHIM)
    proc = subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", f'-DKERNEL="{KERNEL}"',
                           f'-DPLANTED="{tmp / "planted.cu"}"', "-o", str(tmp / "omp.so"), str(tmp / "shim.cpp")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(tmp / "omp.so"))
    lib.launch.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [ctypes.c_float] * 2

    def run(D, x, s, threads=32, planted=False, degenerate=KERNEL_DEGENERATE, dead=KERNEL_DEAD, rank=None):
        D, x = D.float().contiguous(), x.float().contiguous()
        b, G = (x @ D).contiguous(), (D.T @ D).contiguous()
        (m, n), d = b.shape, D.shape[0]
        idx = torch.full((m, s), -7, dtype=torch.long)  # every slot must be written
        coef = torch.full((m, s), float("nan"))
        rc = lib.launch(planted, threads, b.data_ptr(), G.data_ptr(), idx.data_ptr(), coef.data_ptr(), m, n, s,
                        rank or d, degenerate, dead)
        assert rc == 0, "a block's threads split between a barrier and a return"
        return idx, coef
    return run


def dense(idx, coef, atoms):
    """Each signal's coefficients over the whole dictionary [M, N] (a repeated atom's coefficients add up)."""
    return torch.zeros(len(idx), atoms, dtype=torch.float64).scatter_add_(1, idx, coef.double())


def assert_matches_reference(D, x, s, idx, coef):
    """The kernel's codes against ``_omp_qr``'s: the same coefficient on every atom (so the same atoms and early
    stops; the reference's picks of pure rounding, coefficients ~1e-7, are within the tolerance), none past the rank
    or the atoms, finite; and the same reconstruction."""
    D, x = D.float(), x.float()
    ref_idx, ref_coef = omp_mod._omp_qr(D.T.contiguous(), x, s, None)
    scale = 1e-4 * (1 + x.norm(dim=1, keepdim=True).double())
    assert torch.isfinite(coef).all()
    assert (idx >= 0).all() and (idx < D.shape[1]).all()
    assert (coef[:, min(s, *D.shape):] == 0).all()
    diff = (dense(idx, coef, D.shape[1]) - dense(ref_idx, ref_coef, D.shape[1])).abs()
    assert (diff <= scale).all(), f"rows {torch.nonzero((diff > scale).any(1)).flatten().tolist()} differ"
    rec, ref = reconstruct(D, idx, coef).double(), reconstruct(D, ref_idx, ref_coef).double()
    assert ((rec - ref).abs() <= scale).all()


def assert_matches_transcription(D, x, s, idx, coef):
    """The kernel's codes against ``kernel_in_torch`` (the PyTorch transcription the CUDA path's CPU tests run):
    the same ids, coefficients within fp32 rounding."""
    from test_lexico_omp import kernel_in_torch

    D, x = D.float(), x.float()
    b, G = x @ D, D.T @ D
    (m, n), d = b.shape, D.shape[0]
    t_idx, t_coef = torch.zeros(m, s, dtype=torch.long), torch.zeros(m, s)
    kernel_in_torch(b, G, t_idx, t_coef, m, n, s, d, KERNEL_DEGENERATE, KERNEL_DEAD)
    assert torch.equal(idx, t_idx)
    assert torch.allclose(coef, t_coef, atol=1e-5 * (1 + float(x.norm(dim=1).max())))


def unit(t):
    return torch.nn.functional.normalize(t, dim=0)


def cases():
    """(name, dictionary [d, N], signals [M, d], s, threads per block)."""
    g = torch.Generator().manual_seed(0)
    early = unit(torch.randn(16, 64, generator=g)), torch.randn(100, 16, generator=g)  # test_lexico_cuda's data
    g = torch.Generator().manual_seed(11)
    wide = unit(torch.randn(32, 300, generator=g))
    few = unit(torch.randn(16, 12, generator=g))
    dup = unit(torch.randn(16, 48, generator=g))
    dup[:, 40:] = dup[:, :8]  # 8 atoms twice
    dup_x = torch.cat([torch.randn(30, 16, generator=g), dup[:, :4].T.clone(), 0.5 * dup[:, 1:3].T - dup[:, 5:7].T])
    basis = torch.linalg.qr(torch.randn(16, 8, generator=g))[0]
    sub = unit(basis @ torch.randn(8, 64, generator=g))  # 64 atoms spanning 8 of 16 dimensions
    zero_x = torch.randn(24, 32, generator=g)
    zero_x[::5] = 0
    full = unit(torch.randn(64, 512, generator=g))
    return [
        ("atoms not a multiple of the threads", wide, torch.randn(24, 32, generator=g), 8, THREADS),
        ("the gpu test's early stop: s > d", *early, 24, 32),
        ("fewer atoms than s", few, torch.randn(20, 16, generator=g), 14, 32),
        ("duplicate atoms", dup, dup_x, 8, 32),
        ("atoms spanning a subspace", sub, torch.randn(40, 16, generator=g), 12, 32),
        ("zero signals", wide, zero_x, 6, 32),
        ("s = MAX_S", full, torch.randn(6, 64, generator=g), 32, THREADS),
    ]


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_the_compiled_kernel_matches_the_reference_and_its_transcription(cuda_on_cpu, case):
    _, D, x, s, threads = case
    idx, coef = cuda_on_cpu(D, x, s, threads)
    assert_matches_reference(D, x, s, idx, coef)
    assert_matches_transcription(D, x, s, idx, coef)


@pytest.mark.parametrize("alone", ["degenerate", "dead"])
def test_either_threshold_alone_stops_every_case_like_the_reference(cuda_on_cpu, alone):
    """The pivot test and the dead-residual test back each other up: each alone (the other off, no rank bound) still
    stops the s > d, subspace, duplicate and exhausted cases where the reference does, at the host's value. (Each
    also passes here at a tenth of it, and fails at 1e-6 for the pivot or 3e-7 for the dead test: the rounding they
    clear.)"""
    limits = {"degenerate": KERNEL_DEGENERATE if alone == "degenerate" else 0.0,
              "dead": KERNEL_DEAD if alone == "dead" else 0.0}
    for _, D, x, s, threads in cases()[1:5]:
        idx, coef = cuda_on_cpu(D, x, s, threads, rank=s, **limits)
        assert_matches_reference(D, x, s, idx, coef)


def test_threads_per_block_do_not_change_the_codes(cuda_on_cpu):
    """The emulation runs most cases with 32 threads per block (8x fewer fiber switches): the kernel reads blockDim,
    and 32 or 256 give the same codes (the same argmax, lowest index on ties)."""
    _, D, x, s, _ = cases()[0]
    a, b = cuda_on_cpu(D, x[:8], s, 32), cuda_on_cpu(D, x[:8], s, THREADS)
    assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], atol=1e-6)


def test_early_stop_gives_exactly_d_atoms_where_the_old_threshold_took_more(cuda_on_cpu):
    """The GPU test's data (tests/test_lexico_cuda.py): every signal stops at d = 16 atoms with the host's stops; the
    kernel's old stop (an absolute 1e-6 on the pivot, no rank bound, no dead-residual test) took a 17th atom on row
    40 from a pivot of fp32 rounding, with coefficient -1.49, and the check rejects that."""
    _, D, x, s, threads = cases()[1]
    idx, coef = cuda_on_cpu(D, x, s, threads)
    assert (coef[:, :16] != 0).all() and (coef[:, 16:] == 0).all()
    assert (idx[:, 16:] == idx[:, :1]).all()
    old = cuda_on_cpu(D, x, s, threads, degenerate=1e-6, dead=0.0, rank=s)
    assert (old[1][:, 16:] != 0).any(1).sum() >= 1
    with pytest.raises(AssertionError):
        assert_matches_reference(D, x, s, *old)


def test_a_planted_sign_error_is_caught(cuda_on_cpu):
    """The same source with the correlation update's sign flipped (``c += G g``): the checks fail."""
    _, D, x, s, threads = cases()[0]
    idx, coef = cuda_on_cpu(D, x[:8], s, 32, planted=True)
    with pytest.raises(AssertionError):
        assert_matches_reference(D, x[:8], s, idx, coef)
