"""LNQ, layer-wise non-uniform quantization (GuidedQuant, arXiv 2505.07004 Sec. 4, Alg. 1): per output row a codebook
``c_i`` of ``2^b`` values and one-hot assignments ``P_i``, minimising ``sum_i (P_i c_i - w_i)^T H (P_i c_i - w_i)``
with one ``H`` per group of rows, by alternating

- the C step, closed form per row: ``c = (P^T H P + ridge I)^-1 P^T H w``;
- the P step, cyclic coordinate descent: for coordinate j the exact minimiser with the others fixed is
  ``t = w_j - sum_{k != j} H_kj (q_k - w_k) / H_jj`` and, the objective being ``H_jj (q_j - t)^2 + const`` in q_j,
  the codebook entry nearest ``t`` is optimal among the entries: the objective never rises. The cross terms
  ``r = (Q - W) H`` are updated exactly inside a block of ``cd_block`` columns and for the rest after the block.

Seeded by SqueezeLLM: per row, 1-D k-means weighted by the Fisher diagonal (official: flash1dkmeans; here Lloyd's on
the sorted row from several starts, within 0.1% of scikit-learn's ``KMeans`` with ``sample_weight`` in the tests).
``H`` is damped only when its Cholesky factorisation fails (``damp_start * mean diag``, tenfold until it succeeds), as
the official code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def kmeans_1d(x: torch.Tensor, weight: torch.Tensor, k: int, iters: int = 100, n_init: int = 8,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted 1-D k-means per row: Lloyd's from the weighted quantiles and from ``n_init - 1`` weighted random
    draws of k points, the best run kept per row. Returns ``(centroids [R, k] sorted, idx [R, d])``.

    Each row is sorted once: a cluster is then a run of the sorted values between two centroid midpoints, and a
    Lloyd step costs a search of the ``k - 1`` midpoints and prefix sums (as flash1dkmeans), not a pass over the row.
    """
    x, weight = x.double(), weight.double()
    xs, order = x.sort(dim=1)
    ws = weight.gather(1, order)
    cum = ws.cumsum(1)
    zero = cum.new_zeros(x.shape[0], 1)
    prefix = torch.cat([zero, cum], 1), torch.cat([zero, (ws * xs).cumsum(1)], 1)
    q = (torch.arange(k, dtype=x.dtype, device=x.device) + 0.5) / k
    pos = torch.searchsorted((cum / cum[:, -1:]).contiguous(), q.expand(x.shape[0], -1).contiguous())
    starts = [xs.gather(1, pos.clamp(max=x.shape[1] - 1))]
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(n_init - 1):
        pick = torch.multinomial(weight.cpu().float() + 1e-30, k, replacement=False, generator=g).to(x.device)
        starts.append(x.gather(1, pick).sort(dim=1).values)
    best_c, best_labels, best_cost = None, None, None
    for c in starts:
        c, labels = _lloyd(xs, ws, prefix, c, iters)
        cost = (ws * (xs - c.gather(1, labels)) ** 2).sum(1)
        if best_cost is None:
            best_c, best_labels, best_cost = c, labels, cost
            continue
        better = cost < best_cost
        best_c = torch.where(better[:, None], c, best_c)
        best_labels = torch.where(better[:, None], labels, best_labels)
        best_cost = torch.minimum(cost, best_cost)
    return best_c, torch.empty_like(best_labels).scatter_(1, order, best_labels)


def _lloyd(xs: torch.Tensor, ws: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor], c: torch.Tensor,
           iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's on sorted rows ``xs`` (weights ``ws``, prefix sums of ``ws`` and ``ws * xs`` with a leading 0) from
    sorted ``c``; the last update uses exact sums (a prefix-sum difference loses a light cluster's digits). Returns
    the sorted centroids and the cluster of each sorted position."""
    ends = _ends(xs, c)
    for _ in range(iters):
        lo = torch.cat([torch.zeros_like(ends[:, :1]), ends], 1)
        hi = torch.cat([ends, torch.full_like(ends[:, :1], xs.shape[1])], 1)
        den = prefix[0].gather(1, hi) - prefix[0].gather(1, lo)
        c = _update(c, prefix[1].gather(1, hi) - prefix[1].gather(1, lo), den)
        new = _ends(xs, c)
        if torch.equal(new, ends):
            break
        ends = new
    labels = _labels(ends, xs.shape[1])
    num = torch.zeros_like(c).scatter_add_(1, labels, ws * xs)
    c = _update(c, num, torch.zeros_like(c).scatter_add_(1, labels, ws))
    return c, _labels(_ends(xs, c), xs.shape[1])


def _update(c: torch.Tensor, num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """Each cluster's weighted mean (an empty one keeps its centroid), sorted."""
    return torch.where(den > 0, num / den.clamp(min=1e-300), c).sort(dim=1).values


def _ends(xs: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Per sorted row, how many values are at or below each midpoint of ``c``: where each cluster ends (a value on a
    midpoint joins the lower cluster)."""
    return torch.searchsorted(xs, ((c[:, 1:] + c[:, :-1]) / 2).contiguous(), right=True)


def _labels(ends: torch.Tensor, d: int) -> torch.Tensor:
    """The cluster of each sorted position: how many cluster ends lie at or before it."""
    marks = torch.zeros(ends.shape[0], d + 1, dtype=ends.dtype, device=ends.device)
    return marks.scatter_add_(1, ends, torch.ones_like(ends)).cumsum(1)[:, :d]


def nearest_entry(t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Index of the entry of each row's codebook ``c`` ``[R, k]`` (any order) nearest ``t`` ``[R]``."""
    return (c - t[:, None]).abs().argmin(1)


def objective(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    d = (q - w).double()
    return float(((d @ h) * d).sum())


def damped(h: torch.Tensor, start: float) -> torch.Tensor:
    """``H`` itself when it factorises, else ``H + damp I`` with damp from ``start * mean diag`` up tenfold."""
    if int(torch.linalg.cholesky_ex(h)[1]) == 0:
        return h
    damp = start * float(h.diagonal().mean())
    for _ in range(12):
        a = h + damp * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
        if int(torch.linalg.cholesky_ex(a)[1]) == 0:
            return a
        damp *= 10
    raise RuntimeError("the Hessian stays singular after damping")


def c_step(w: torch.Tensor, idx: torch.Tensor, h: torch.Tensor, k: int, ridge: float, rows: int = 64) -> torch.Tensor:
    """The optimal codebook for fixed assignments, per row: ``(P^T H P + ridge I)^-1 P^T H w`` (``rows`` at a time:
    the one-hot ``P`` is ``[rows, d, k]``); an entry no weight uses is 0, with any ridge.

    ``P^T H`` is one ``[rows k, d] x [d, d]`` product: on the CPU it beats adding H's rows into each row's k sums
    (``index_add_``, memory-bound: ``H`` is read once per row), benchmarks/results/lnq_step.md."""
    out = torch.empty(w.shape[0], k, dtype=torch.float64, device=w.device)
    eye = ridge * torch.eye(k, dtype=torch.float64, device=w.device)
    for a in range(0, w.shape[0], rows):
        p = torch.nn.functional.one_hot(idx[a:a + rows], k).double()  # [r, d, k]
        ph = torch.einsum("rdk,de->rke", p, h)
        unused = torch.diag_embed((p.sum(1) == 0).double())  # its row and column of P^T H P are 0
        out[a:a + rows] = torch.linalg.solve(torch.einsum("rke,rel->rkl", ph, p) + eye + unused,
                                             torch.einsum("rke,re->rk", ph, w[a:a + rows].double()))
    return out


def p_step(w: torch.Tensor, idx: torch.Tensor, c: torch.Tensor, h: torch.Tensor, cycles: int,
           block: int) -> torch.Tensor:
    """``cycles`` passes of cyclic coordinate descent over the input coordinates, all rows at once."""
    w = w.double()
    idx = idx.clone()
    delta = c.gather(1, idx) - w
    r = delta @ h  # r_j = sum_k H_kj delta_k
    diag = h.diagonal()
    dead = (diag <= 0).tolist()  # read once: a per-coordinate test of a device tensor would sync every step
    d = w.shape[1]
    for _ in range(cycles):
        for b0 in range(0, d, block):
            b1 = min(b0 + block, d)
            moved = torch.zeros(w.shape[0], b1 - b0, dtype=w.dtype, device=w.device)
            for j in range(b0, b1):
                if dead[j]:  # a dead input: any entry costs the same; keep the one nearest the weight
                    t = w[:, j]
                else:
                    hjj = diag[j]
                    t = w[:, j] - (r[:, j] - hjj * delta[:, j]) / hjj
                new = nearest_entry(t, c)
                step = c.gather(1, new[:, None]).squeeze(1) - w[:, j] - delta[:, j]
                idx[:, j] = new
                delta[:, j] += step
                r[:, b0:b1] += step[:, None] * h[j, b0:b1]
                moved[:, j - b0] = step
            if b0 > 0:
                r[:, :b0] += moved @ h[b0:b1, :b0]
            if b1 < d:
                r[:, b1:] += moved @ h[b0:b1, b1:]
    return idx


@dataclass
class LNQResult:
    idx: torch.Tensor  # [rows, d]
    codebook: torch.Tensor  # [rows, k] float64
    trace: list[float] = field(default_factory=list)  # the objective after the seed and after every half-step

    def weight(self) -> torch.Tensor:
        return self.codebook.gather(1, self.idx)


def lnq(w: torch.Tensor, h: torch.Tensor, seed: tuple[torch.Tensor, torch.Tensor], iterations: int = 3,
        cd_cycles: int = 4, cd_block: int = 128, ridge: float = 1e-7) -> LNQResult:
    """Alternate C and P steps on rows ``w`` sharing ``h`` (already damped) from ``seed = (codebook, idx)``, as the
    official ``train_least_squares``: iteration 1 is a C step, each later one a P step then a C step; a C step that
    does not improve on the best (the seed, or the best C step so far) ends the loop and the best pair is returned."""
    h = h.double()
    w64 = w.double()
    c, idx = seed[0].double(), seed[1]
    k = c.shape[1]
    best = LNQResult(idx, c, [objective(w64, c.gather(1, idx), h)])
    best_value = best.trace[0]
    for it in range(iterations):
        if it > 0:
            idx = p_step(w64, idx, c, h, cd_cycles, cd_block)
            best.trace.append(objective(w64, c.gather(1, idx), h))
        c = c_step(w64, idx, h, k, ridge)
        value = objective(w64, c.gather(1, idx), h)
        best.trace.append(value)
        if value >= best_value:
            break
        best.idx, best.codebook, best_value = idx, c, value
    return best
