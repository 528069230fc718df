"""Lexico's batched OMP against scikit-learn on one thread (d 64, 1024 and 4096 atoms, s 8): vectors per second.

    python benchmarks/bench_lexico_omp.py

Writes benchmarks/results/lexico_omp.json and .md.

Stays a script: a kernel microbenchmark (vectors per second), not a comparison of arms on held-out items; ``llmx
compare lexico`` covers Lexico's quality against KIVI and eviction.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402


def omp_throughput(atoms: int, vectors: int = 8192, dim: int = 64, s: int = 8, sklearn_vectors: int = 1000) -> dict:
    """Vectors per second on one thread (NumPy's BLAS held to one thread too): llmx's batched OMP, scikit-learn's
    estimator as users call it (``precompute='auto'``, here no Gram matrix) and its Gram form
    (``orthogonal_mp_gram`` with ``D^T D`` and ``D^T x`` given, their cost not counted)."""
    from sklearn.linear_model import OrthogonalMatchingPursuit, orthogonal_mp_gram
    from threadpoolctl import threadpool_limits

    from llmx.plugins.lexico.omp import omp

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d = torch.nn.functional.normalize(torch.randn(dim, atoms, generator=gen), dim=0)
    x = torch.randn(vectors, dim, generator=gen)
    omp(d, x[:256], s)
    t0 = time.perf_counter()
    omp(d, x, s)
    ours = vectors / (time.perf_counter() - t0)
    dn, xn = d.numpy(), x[:sklearn_vectors].numpy().T  # float32, as a user passes them
    gram, cov = dn.T @ dn, dn.T @ xn
    with threadpool_limits(1):
        t0 = time.perf_counter()
        OrthogonalMatchingPursuit(n_nonzero_coefs=s, fit_intercept=False).fit(dn, xn)
        estimator = sklearn_vectors / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        orthogonal_mp_gram(gram, cov, n_nonzero_coefs=s)
        gram_form = sklearn_vectors / (time.perf_counter() - t0)
    return {"atoms": atoms, "dim": dim, "sparsity": s, "llmx_vectors_per_s": round(ours),
            "sklearn_vectors_per_s": round(estimator), "speedup": round(ours / estimator, 1),
            "sklearn_gram_vectors_per_s": round(gram_form), "speedup_vs_gram": round(ours / gram_form, 1),
            "threads": 1}


def main() -> None:
    rows = [omp_throughput(n) for n in (1024, 4096)]
    publish("lexico_omp", rows)


if __name__ == "__main__":
    main()
