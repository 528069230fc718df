"""The log-probability of one label per row without a full-vocabulary float32 tensor.

``log p(y) = log_softmax(x)_y`` computed a chunk of rows at a time in float32 and only the label's kept; the
backward recomputes each chunk's softmax from the saved logits (in their own dtype), since
``d/dx_j log_softmax(x)_y = 1[j = y] - softmax(x)_j``. So at most a chunk's float32 copies live at once, and autograd
keeps no float32 ``[N, V]`` tensor, where ``log_softmax(x.float()).gather(...)`` keeps its whole float32 output for
the backward. Each row goes through the same row-wise kernel as that full computation, so the values are the same,
and independent of the batch a row is in; the gradient agrees to float32 rounding (bf16 logits: both round it to
bf16 last, so an element may land one bf16 step apart).
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 24  # 64 MiB per float32 copy of a chunk (two live at once)


def _chunks(n: int, vocab: int, rows: int | None):
    step = rows or max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return ((s, min(s + step, n)) for s in range(0, n, step))


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, rows: int | None) -> torch.Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for s, e in _chunks(logits.shape[0], logits.shape[1], rows):
            out[s:e] = torch.log_softmax(logits[s:e].float(), -1).gather(-1, labels[s:e, None]).squeeze(-1)
        ctx.save_for_backward(logits, labels)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, labels = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for s, e in _chunks(logits.shape[0], logits.shape[1], ctx.rows):
            g = grad[s:e, None].float()
            p = torch.softmax(logits[s:e].float(), -1)
            grad_logits[s:e].copy_(p.mul_(-g).scatter_add_(-1, labels[s:e, None], g))
            del p  # before the next chunk's
        return grad_logits, None, None


def selective_log_softmax(logits: torch.Tensor, labels: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """``log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)``, float32, shape of ``labels``,
    ``rows`` rows of ``logits [..., V]`` at a time (default: 64 MiB of float32 per chunk). Contiguous ``logits``
    are not copied (a strided view is, once, in its own dtype)."""
    vocab = logits.shape[-1]
    out = _SelectiveLogSoftmax.apply(logits.reshape(-1, vocab), labels.reshape(-1), rows)
    return out.view(labels.shape)
