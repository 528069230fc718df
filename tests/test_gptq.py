"""GPTQ: below RTN on every layer of a trained model, equal to a plain unoptimised GPTQ, block-size invariant."""

from __future__ import annotations

import pytest
import torch

from llmx.core import models
from llmx.core.data import random_windows
from llmx.core.quant.calibration import collect
from llmx.core.quant.formats import IntFormat, fake_quantize
from llmx.core.quant.gptq import gptq, layer_objective


def plain_gptq(w: torch.Tensor, h: torch.Tensor, fmt: IntFormat, percdamp: float = 0.01) -> torch.Tensor:
    """Textbook GPTQ/OBQ: quantize columns left to right, spread each error with the current inverse Hessian,
    then remove the column from the inverse by Gaussian elimination. No Cholesky, no blocks, float64."""
    from llmx.core.quant.formats import range_to_scale

    W, H = w.double().clone(), h.double().clone()
    H += percdamp * torch.mean(torch.diag(H)) * torch.eye(H.shape[0], dtype=torch.float64)
    Hinv = torch.linalg.inv(H)
    Q = torch.zeros_like(W)
    g = fmt.group_size
    for j in range(W.shape[1]):
        if j % g == 0:
            cols = W[:, j:j + g]
            scale, zero = range_to_scale(cols.amin(1, keepdim=True), cols.amax(1, keepdim=True), fmt)
        q = (torch.clamp(torch.round(W[:, j:j + 1] / scale) + zero, fmt.qmin, fmt.qmax) - zero) * scale
        Q[:, j] = q.flatten()
        err = (W[:, j] - Q[:, j]) / Hinv[j, j]
        W[:, j:] -= err[:, None] * Hinv[j, j:][None, :]
        Hinv -= Hinv[:, j:j + 1] @ Hinv[j:j + 1, :] / Hinv[j, j]
    return Q


def random_problem(rows=32, cols=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(512, cols, generator=gen) @ torch.randn(cols, cols, generator=gen) * 0.3  # correlated inputs
    x[:, :3] *= 8  # a few outlier channels
    return torch.randn(rows, cols, generator=gen), (x.T @ x).double()


@pytest.mark.parametrize("full_range", [False, True])
def test_matches_plain_unoptimised_gptq(full_range):
    w, h = random_problem()
    fmt = IntFormat(4, 16, full_range=full_range)
    fast = gptq(w, h.float(), fmt, block_size=32)
    plain = plain_gptq(w, h, fmt)
    agree = (fast.weight.double() - plain).abs() < 1e-4
    # float32 vs float64 may break a rounding tie the other way. On the full grid every group's most negative weight
    # sits on one (-7.5 steps: -8 or -7, the same error), so there the check is the objective, not every code.
    assert agree.float().mean() > (0.995 if not full_range else 0.95)
    assert layer_objective(w, fast.weight, h) == pytest.approx(layer_objective(w, plain, h), rel=1e-3 if not full_range else 2e-2)


@pytest.mark.parametrize("block", [1, 7, 32, 128])
def test_block_size_does_not_change_the_result(block):
    w, h = random_problem(seed=1)
    ref = gptq(w, h.float(), IntFormat(3, None), block_size=64)
    other = gptq(w, h.float(), IntFormat(3, None), block_size=block)
    assert torch.allclose(ref.weight, other.weight, atol=1e-5)


@pytest.mark.parametrize("fmt,actorder", [(IntFormat(4, 16), False), (IntFormat(3, None), False),
                                          (IntFormat(4, 16), True), (IntFormat(2, 0), False), (IntFormat(4, 16, False), False)])
def test_codes_scales_and_weight_agree(fmt, actorder):
    from llmx.core.quant.formats import dequantize

    w, h = random_problem(seed=2)
    res = gptq(w, h.float(), fmt, actorder=actorder)
    assert res.codes.min() >= fmt.qmin and res.codes.max() <= fmt.qmax
    assert torch.allclose(dequantize(res.codes, res.scale, res.zero, fmt.group_size), res.weight, atol=1e-5)
    assert res.objective(w, h) < layer_objective(w, fake_quantize(w, fmt), h)


def test_dead_inputs_are_zeroed():
    w, h = random_problem(seed=3)
    h[5, :] = 0
    h[:, 5] = 0
    res = gptq(w, h.float(), IntFormat(4, 16))
    assert torch.all(res.weight[:, 5] == 0)


@pytest.mark.parametrize("fmt", [IntFormat(4, 32), IntFormat(3, None)])
def test_below_rtn_on_every_layer_of_a_trained_model(fmt):
    model, tok = models.load("ref:llama-test")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    stats = collect(model, layers, random_windows(tok, "stdlib", 16, 128))
    for name, layer in layers.items():
        w, h = layer.weight.data, stats[name].hessian
        assert gptq(w, h.float(), fmt).objective(w, h) < layer_objective(w, fake_quantize(w, fmt), h), name
