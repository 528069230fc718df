"""Chunked label log-probs (``llmx.core.logprobs``): the full ``log_softmax(x.float()).gather`` in value and gradient
(fp32 to float32 rounding, bf16 logits too), and a peak memory and saved-for-backward size the full computation
exceeds."""

from __future__ import annotations

import pytest
import torch

from llmx.core.logprobs import selective_log_softmax
from llmx.core.preference import token_logps


def full(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def case(dtype: torch.dtype, shape=(3, 37, 500), scale: float = 4.0):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(shape, generator=g) * scale).to(dtype)
    ids = torch.randint(shape[2], shape[:2], generator=g)
    weight = torch.randn(shape[0], shape[1] - 1, generator=g)
    return logits, ids, weight


def value_and_grad(fn, logits, ids, weight):
    x = logits.clone().requires_grad_()
    out = fn(x, ids)
    (out * weight).sum().backward()
    return out.detach(), x.grad


def chunked(rows):
    def fn(logits, ids):
        labels = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)
        return selective_log_softmax(logits, labels, rows)[:, :-1]
    return fn


@pytest.mark.parametrize("rows", [None, 1, 7, 111])  # 3 x 37 = 111 rows: 7 does not divide them
def test_fp32_values_and_gradients_equal_the_full_log_softmax(rows):
    logits, ids, weight = case(torch.float32)
    want, want_grad = value_and_grad(full, logits, ids, weight)
    got, grad = value_and_grad(chunked(rows), logits, ids, weight)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=1e-6)


def test_token_logps_is_the_full_computation_on_contiguous_and_strided_logits():
    logits, ids, weight = case(torch.float32)
    want, want_grad = value_and_grad(full, logits, ids, weight)
    got, grad = value_and_grad(token_logps, logits, ids, weight)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=1e-6)
    strided = torch.cat([logits, logits], dim=-1)[..., :logits.shape[-1]]  # a view that reshape must copy
    torch.testing.assert_close(token_logps(strided, ids), want, atol=1e-6, rtol=1e-6)
    with torch.inference_mode():
        torch.testing.assert_close(token_logps(logits, ids), want, atol=1e-6, rtol=1e-6)


def test_a_rows_log_prob_does_not_depend_on_the_batch_or_chunk_it_is_in():
    """A reference scored in other batches than the policy must still give a zero margin at the start."""
    logits, ids, _ = case(torch.float32)
    alone = torch.stack([token_logps(logits[b:b + 1], ids[b:b + 1])[0] for b in range(len(ids))])
    assert torch.equal(token_logps(logits, ids), alone)
    assert torch.equal(chunked(5)(logits, ids), alone)


def test_bf16_logits_match_to_float32_rounding_and_one_bf16_step_in_the_gradient():
    """The upcast of bf16 is exact, so values agree as in fp32; both gradients are float32 rounded to bf16 at the
    end, so an element may land one bf16 step (2^-8 relative) apart."""
    logits, ids, weight = case(torch.bfloat16)
    want, want_grad = value_and_grad(full, logits, ids, weight)
    got, grad = value_and_grad(chunked(7), logits, ids, weight)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), want_grad.float(), atol=1e-6, rtol=2 ** -7)


def measure(fn, dtype, shape):
    """(peak bytes of forward + backward above the leaf logits, bytes autograd saved, by storage)."""
    from llmx.core.memory import PeakMemory

    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with PeakMemory("cpu") as pm:
        logits, ids, weight = case(dtype, shape)
        logits.requires_grad_()
        with pm.section():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = fn(logits, ids)
            (out * weight).sum().backward()
    return pm.peak_bytes, sum(saved.values())


def test_no_full_vocabulary_float32_tensor_is_held_or_saved_for_the_backward():
    shape = (2, 64, 4096)
    fp32_btv = 2 * 63 * 4096 * 4  # one float32 [B, T-1, V]
    full_peak, full_saved = measure(full, torch.bfloat16, shape)
    assert full_peak >= 2 * fp32_btv and full_saved >= fp32_btv  # what the bounds below rule out
    for dtype, held, kept in ((torch.bfloat16, 0.75, 0.55), (torch.float32, 1.25, 1.05)):
        peak, saved = measure(chunked(8), dtype, shape)
        assert peak < held * fp32_btv, (dtype, peak / fp32_btv)  # the gradient alone is 0.5 (bf16) or 1
        assert saved < kept * fp32_btv, (dtype, saved / fp32_btv)  # the logits it was given, and [N] vectors
