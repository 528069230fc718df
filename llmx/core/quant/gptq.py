"""GPTQ (Frantar et al., 2023): column-by-column quantization with second-order error compensation.

Minimises ``||W X - Q X||^2 = tr((W - Q) H (W - Q)^T)`` with ``H = X X^T`` from calibration inputs. The Hessian is an
argument, so other methods (GuidedQuant) can pass their own. Steps as in the paper / reference code: dead inputs
zeroed, optional activation order, dampening ``percdamp * mean(diag H)``, the upper Cholesky factor of ``H^-1``, and
lazy block updates (Algorithm 1, ``block_size`` columns at a time).

A group's range (non-static groups) is found when its first column comes up. ``group_scale="block_start"`` (the
reference code, ``static_groups=False``) reads the group's columns of ``W`` as they stood when the current block began:
the earlier blocks' error feedback in, the current block's own updates not yet. ``"updated"`` reads them as updated
so far, the current block's updates included. The two agree whenever every group starts a block (group size a
multiple of ``block_size``, as at the defaults 128 and 128); with ``block_start`` a group that starts mid-block makes
the result depend on ``block_size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from llmx.core.quant.formats import IntFormat, range_to_scale


@dataclass
class GPTQResult:
    codes: torch.Tensor  # int16, shape of W, original column order
    scale: torch.Tensor  # [rows, groups, 1]
    zero: torch.Tensor
    weight: torch.Tensor  # the dequantized weight

    def objective(self, w: torch.Tensor, h: torch.Tensor) -> float:
        return layer_objective(w, self.weight, h)


def layer_objective(w: torch.Tensor, q: torch.Tensor, h: torch.Tensor) -> float:
    """``tr((W - Q) H (W - Q)^T)``: the layer output error summed over calibration tokens (float32 products, summed
    in float64; no copy of ``H``)."""
    d = (w - q).to(h.dtype)
    return float(((d @ h) * d).double().sum())


def _group_range(cols: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero for a block of columns, one per row (``[rows, 1]``), or one overall for per-tensor."""
    if fmt.group_size == 0:
        lo, hi = cols.min().reshape(1, 1), cols.max().reshape(1, 1)
    else:
        lo, hi = cols.amin(dim=1, keepdim=True), cols.amax(dim=1, keepdim=True)
    return range_to_scale(lo, hi, fmt)


def _updated_columns(W: torch.Tensor, W1: torch.Tensor, i: int, i2: int, g: int) -> torch.Tensor:
    """``group_scale="updated"``: the ``g`` columns of a group starting at column ``i`` of the current block ``W1``
    (which ends at ``i2`` in ``W``): the block's own columns as updated so far, continued from ``W`` when the group
    runs past the block. Only the group's columns are read (``[rows, g]``), never the whole remaining weight."""
    inside = W1.shape[1] - i
    if g <= inside:
        return W1[:, i:i + g]
    return torch.cat([W1[:, i:], W[:, i2:i2 + g - inside]], dim=1)


def _cholesky_inverse_upper(h: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp I)^-1``; the damping grows tenfold until the factorisation succeeds.
    At most two ``H``-sized temporaries exist at once (an 8192-wide Hessian is 256 MiB in float32)."""
    damp = float(percdamp * torch.mean(torch.diag(h)))
    for _ in range(8):
        a = h.clone()
        a.diagonal().add_(damp)
        lower, info = torch.linalg.cholesky_ex(a)
        del a
        if int(info) == 0:
            inverse = torch.cholesky_inverse(lower)
            del lower
            return torch.linalg.cholesky(inverse, upper=True)
        damp = damp * 10 if damp > 0 else 1e-6
    raise torch.linalg.LinAlgError("Hessian is not positive definite even after damping")


def gptq(w: torch.Tensor, h: torch.Tensor, fmt: IntFormat, block_size: int = 128, percdamp: float = 0.01,
         actorder: bool = False, static_groups: bool = False,
         group_scale: Literal["block_start", "updated"] = "block_start") -> GPTQResult:
    """Quantize ``w`` ([out, in]) against the Hessian ``h`` ([in, in]).

    With ``actorder`` and groups, scales are fixed before the permutation (``static_groups``), so every group stays
    a contiguous run of input channels in storage (llm-compressor's ``actorder: static``).
    """
    rows, cols = w.shape
    g = fmt.group_size
    if actorder and g:
        static_groups = True
    W = w.detach().clone().float()
    H = h.detach().to(torch.float32, copy=True)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    n_groups = 1 if not g else -(-cols // g)
    scale_rows = 1 if g == 0 else rows
    scale = torch.empty(scale_rows, n_groups, 1, device=W.device)
    zero = torch.empty(scale_rows, n_groups, 1, device=W.device)
    if not g:  # per-channel or per-tensor: one range for the whole row / tensor, from the original weights
        scale[:, 0], zero[:, 0] = _group_range(W, fmt)
    elif static_groups:
        for k in range(n_groups):
            scale[:, k], zero[:, k] = _group_range(W[:, k * g:(k + 1) * g], fmt)

    perm = torch.argsort(torch.diag(H), descending=True) if actorder else torch.arange(cols, device=W.device)
    if actorder:  # without it the order is the identity: no gather copies of W and H
        W = W[:, perm]
        H = H[perm][:, perm]
    U = _cholesky_inverse_upper(H, percdamp)
    del H

    order = perm.tolist()  # host copy: one read per column would synchronise a GPU every column
    Q = torch.zeros_like(W)
    codes = torch.zeros(rows, cols, dtype=torch.int16, device=W.device)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1, U1 = W[:, i1:i2].clone(), U[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col = i1 + i
            group = order[col] // g if g else 0
            if g and not static_groups and col % g == 0:  # W[:, i1:i2] is never written: as at the block's start
                span = W[:, col:col + g] if group_scale == "block_start" else _updated_columns(W, W1, i, i2, g)
                scale[:, group], zero[:, group] = _group_range(span, fmt)
            s, z = scale[:, group], zero[:, group]
            c = torch.clamp(torch.round(W1[:, i:i + 1] / s) + z, fmt.qmin, fmt.qmax)
            q = ((c - z) * s).flatten()
            codes[:, col] = c.flatten().to(torch.int16)
            Q[:, col] = q
            err = (W1[:, i] - q) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]

    if actorder:
        inv = torch.argsort(perm)
        Q, codes = Q[:, inv], codes[:, inv]
    return GPTQResult(codes=codes, scale=scale, zero=zero, weight=Q.to(w.dtype))
