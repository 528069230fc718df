"""CLOVER's per-head orthogonalisation and pruning (arXiv 2411.17426, Sec. 3).

A pair of projections only matters through its product: per head, the attention logits depend on
``Q~_h^T K~_h`` and the head's output on ``O_h V~_h``, where ``~`` appends the bias as an extra input column. An SVD
of the product rewrites both factors with orthogonal vectors scaled by ``sqrt(s)``; the function is unchanged, and
dimension ``i`` then contributes exactly ``s_i``, so pruning the smallest singular values removes the least.

GQA: a K or V head is shared by ``heads / kv_heads`` query heads. The shared factor stays shared by stacking the
group's other factors before the SVD (``[Q~_h1^T; Q~_h2^T] K~_g`` and ``[O_h1; O_h2] V~_g``), which keeps every
per-head product exact. (The official fine-tuning code uses the QR of V under GQA, which ``finetune`` follows by
default; the official pruning code has no GQA model, and this generalises its SVD.)
"""

from __future__ import annotations

import torch

from llmx.plugins.clover.attention import head_counts, projections


def orthogonalize_pair(left: torch.Tensor, right: torch.Tensor, scaled: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``left @ right`` ([N, r] x [r, M]) -> (``U sqrt(s)``, ``sqrt(s) V^T``, ``s``) with the same product, the
    columns of the first and rows of the second orthogonal and sorted by ``s`` (descending). QR first, so the
    SVD is only r x r. ``scaled=False`` returns the orthonormal ``U`` and ``V^T``: the caller keeps ``diag(s)``
    (fine-tuning trains it, Sec. 3.3)."""
    q1, r1 = torch.linalg.qr(left.double())
    q2, r2 = torch.linalg.qr(right.double().T)
    u, s, vh = torch.linalg.svd(r1 @ r2.T)
    root = s.sqrt() if scaled else torch.ones_like(s)
    return (q1 @ u) * root, root[:, None] * (vh @ q2.T), s


def rows_of(layer: torch.nn.Module) -> torch.Tensor:
    """A projection's weight as ``[out, in]`` (``nn.Linear`` stores it so; GPT-2's ``Conv1D`` stores the transpose)."""
    return layer.weight.data if isinstance(layer, torch.nn.Linear) else layer.weight.data.T


def set_rows(layer: torch.nn.Module, value: torch.Tensor) -> None:
    rows_of(layer).copy_(value.to(layer.weight.dtype))


def qr_blocks(layer: torch.nn.Module, block: int) -> torch.Tensor:
    """Per block of ``block`` output rows, the bias folded in as a last input column: ``[W | b] = R^T Q^T`` with
    orthonormal ``Q`` (the official ``orthogonalize_qk_proj``). The rows become ``Q^T``; returns the ``R^T`` cores
    ``[blocks, block, block]`` that rebuild them (``core @ rows``)."""
    w = rows_of(layer).double()
    b = layer.bias.data.double()[:, None] if layer.bias is not None else torch.zeros(w.shape[0], 1, dtype=w.dtype,
                                                                                      device=w.device)
    full = torch.cat([w, b], dim=1).reshape(-1, block, w.shape[1] + 1)
    q, r = torch.linalg.qr(full.transpose(1, 2))
    rows = q.transpose(1, 2).reshape(-1, w.shape[1] + 1)
    set_rows(layer, rows[:, :-1])
    if layer.bias is not None:
        layer.bias.data.copy_(rows[:, -1].to(layer.bias.dtype))
    return r.transpose(1, 2)


def _with_bias(linear: torch.nn.Linear, rows: slice) -> torch.Tensor:
    w = linear.weight.data[rows].double()
    b = linear.bias.data[rows].double()[:, None] if linear.bias is not None else torch.zeros(w.shape[0], 1, dtype=w.dtype,
                                                                                             device=w.device)
    return torch.cat([w, b], dim=1)  # [dims, in + 1]


def _set_with_bias(linear: torch.nn.Linear, rows: slice, value: torch.Tensor) -> None:
    linear.weight.data[rows] = value[:, :-1].to(linear.weight.dtype)
    if linear.bias is not None:
        linear.bias.data[rows] = value[:, -1].to(linear.bias.dtype)


def _group_blocks(attn: torch.nn.Module, target: str, dim: int, g: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """KV group ``g``'s pair as (per-head factors stacked ``[n * heads_in_group, dim]``, shared factor
    ``[dim, in + 1]``): for ``qk`` the heads' ``Q~_h^T`` and the shared ``K~_g``; for ``vo`` the heads' ``O_h`` and
    the shared ``V~_g``. The product of the two is what the attention computes with."""
    heads, kv = head_counts(attn)
    per = heads // kv
    q, k, v, o = projections(attn)
    shared = _with_bias(k if target == "qk" else v, slice(g * dim, (g + 1) * dim))
    if target == "qk":
        blocks = [_with_bias(q, slice(h * dim, (h + 1) * dim)).T for h in range(g * per, (g + 1) * per)]
    else:
        blocks = [o.weight.data[:, h * dim:(h + 1) * dim].double() for h in range(g * per, (g + 1) * per)]
    return torch.cat(blocks, dim=0), shared


def _set_group(attn: torch.nn.Module, target: str, dim: int, g: int, stacked: torch.Tensor, shared: torch.Tensor) -> None:
    heads, kv = head_counts(attn)
    per = heads // kv
    q, k, v, o = projections(attn)
    _set_with_bias(k if target == "qk" else v, slice(g * dim, (g + 1) * dim), shared)
    n = stacked.shape[0] // per
    for i, h in enumerate(range(g * per, (g + 1) * per)):
        block = stacked[i * n:(i + 1) * n]
        if target == "qk":
            _set_with_bias(q, slice(h * dim, (h + 1) * dim), block.T)
        else:
            o.weight.data[:, h * dim:(h + 1) * dim] = block.to(o.weight.dtype)


def orthogonalize(attn: torch.nn.Module, target: str, dim: int, scaled: bool = True) -> list[torch.Tensor]:
    """Rewrite the ``qk`` (only valid without RoPE) or ``vo`` pair of every KV group in place; return each group's
    singular values (descending). ``scaled=False`` leaves both factors orthonormal: the function then needs
    ``diag(s)`` applied on the shared (K / V) side, which fine-tuning's core holds."""
    out = []
    for g in range(head_counts(attn)[1]):
        stacked, shared = _group_blocks(attn, target, dim, g)
        new_stacked, new_shared, s = orthogonalize_pair(stacked, shared, scaled)
        _set_group(attn, target, dim, g, new_stacked, new_shared)
        out.append(s)
    return out


def vanilla_scores(attn: torch.nn.Module, target: str, dim: int) -> list[torch.Tensor]:
    """The baseline's importance of each original dim: the norm of its shared row times the norm of its
    per-head vectors over the group (``||k_i|| ||q_i||`` or ``||v_i|| ||o_i||``), no SVD."""
    out = []
    for g in range(head_counts(attn)[1]):
        stacked, shared = _group_blocks(attn, target, dim, g)
        out.append(shared.norm(dim=1) * stacked.norm(dim=0))
    return out


def activation_scores(attn: torch.nn.Module, target: str, dim: int, norms: dict[str, torch.Tensor]
                      ) -> list[torch.Tensor]:
    """The activation baseline (official ``activation_pruning``): each original dim by the norm of its activations
    on calibration tokens, ``||q_i|| ||k_i||`` for Q-K and ``||v_i|| ||o_i||`` (output weight column) for V-O; a
    group's query heads (or output blocks) are pooled in quadrature."""
    heads, kv = head_counts(attn)
    per = heads // kv
    out = []
    for g in range(kv):
        stacked, _ = _group_blocks(attn, target, dim, g)
        if target == "qk":
            q = norms["q"].reshape(heads, dim)[g * per:(g + 1) * per]
            out.append(norms["k"].reshape(kv, dim)[g] * q.square().sum(0).sqrt())
        else:
            out.append(norms["v"].reshape(kv, dim)[g] * stacked.norm(dim=0))
    return out


def global_counts(scores: list[list[torch.Tensor]], keep: int) -> list[list[int]]:
    """Global pruning (the paper's quantile over every head and layer): how many dims of each layer's groups are
    among the ``keep`` highest scores overall (exactly ``keep`` in total)."""
    flat = torch.cat([s.double().flatten() for layer in scores for s in layer])
    chosen = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    chosen[torch.topk(flat, keep).indices] = True
    counts, i = [], 0
    for layer in scores:
        counts.append([int(chosen[i + j * s.numel():i + (j + 1) * s.numel()].sum()) for j, s in enumerate(layer)])
        i += sum(s.numel() for s in layer)
    return counts


def zero_dims(attn: torch.nn.Module, target: str, dim: int, drop: list[torch.Tensor]) -> None:
    """Zero the given dims of every KV group's pair (both factors), keeping shapes: a layer sliced to its widest
    group keeps its other groups' pruned dims this way."""
    for g, idx in enumerate(drop):
        if idx.numel():
            stacked, shared = _group_blocks(attn, target, dim, g)
            stacked[:, idx] = 0
            shared[idx] = 0
            _set_group(attn, target, dim, g, stacked, shared)


def prune(attn, qk_keep: list[torch.Tensor] | None, vo_keep: list[torch.Tensor] | None) -> None:
    """Slice the kept dims out into a smaller module (real parameter and KV-cache reduction)."""
    heads, kv = head_counts(attn)
    per = heads // kv
    q, k, v, o = (p.weight.data.clone() for p in projections(attn))
    qb, kb, vb = (p.bias.data.clone() if p.bias is not None else None for p in projections(attn)[:3])
    ob = projections(attn)[3].bias
    ob = ob.data.clone() if ob is not None else None
    dim_qk, dim_vo = attn.qk_dim, attn.vo_dim

    def rows(group_keep, dim, per_group):  # kept rows of a [groups * per_group * dim, ...] weight
        return torch.cat([h * dim + group_keep[h // per_group] for h in range(len(group_keep) * per_group)])

    qk_rows_k = rows(qk_keep, dim_qk, 1) if qk_keep else torch.arange(kv * dim_qk, device=k.device)
    qk_rows_q = rows(qk_keep, dim_qk, per) if qk_keep else torch.arange(heads * dim_qk, device=q.device)
    vo_rows_v = rows(vo_keep, dim_vo, 1) if vo_keep else torch.arange(kv * dim_vo, device=v.device)
    vo_cols_o = rows(vo_keep, dim_vo, per) if vo_keep else torch.arange(heads * dim_vo, device=o.device)
    attn.resize(len(qk_keep[0]) if qk_keep else dim_qk, len(vo_keep[0]) if vo_keep else dim_vo)
    nq, nk, nv, no = projections(attn)
    for lin, w, b, idx in ((nq, q, qb, qk_rows_q), (nk, k, kb, qk_rows_k), (nv, v, vb, vo_rows_v)):
        lin.weight.data.copy_(w[idx])
        if b is not None:
            lin.bias.data.copy_(b[idx])
    no.weight.data.copy_(o[:, vo_cols_o])
    if ob is not None:
        no.bias.data.copy_(ob)
