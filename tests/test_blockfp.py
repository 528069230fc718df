"""Block formats (core/quant/blockfp): one rounding rule checked against ml_dtypes' casts, MXFP4/NVFP4/INT4 recipes,
per-block tables, the integer-MAC identity, and the layer and attention that run them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from llmx.core.kernels import blockfp as kops
from llmx.core.quant import blockfp as bf


def _e2m1(v: np.ndarray) -> np.ndarray:
    return v.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)


def _grid_and_midpoints(top: float) -> torch.Tensor:
    mags = torch.tensor(bf.E2M1)
    mids = (mags[1:] + mags[:-1]) / 2
    vals = torch.cat([mags, mids, torch.rand(4000) * top])
    return torch.cat([vals, -vals])


def test_e2m1_rounding_is_the_ml_dtypes_cast_including_every_tie():
    v = _grid_and_midpoints(6.0)
    idx = bf.nearest(v.abs()[None], torch.tensor(bf.E2M1))[0]
    ours = torch.tensor(bf.E2M1)[idx] * torch.sign(v)
    assert np.array_equal(ours.numpy(), _e2m1(v.numpy()))


def test_mxfp4_is_the_ocp_recipe_on_ml_dtypes_casts():
    torch.manual_seed(0)
    x = torch.randn(64, 96) * torch.logspace(-3, 3, 96)
    b = bf.quantize(x, bf.mxfp4())
    xb = x.reshape(64, 3, 32).double().numpy()
    amax = np.abs(xb).max(-1)
    e = np.floor(np.log2(amax)) - 2
    ref = _e2m1(np.clip(xb / 2.0**e[..., None], -6, 6).astype(np.float32)) * 2.0**e[..., None]
    assert np.array_equal(bf.dequantize(b, bf.mxfp4()).numpy(), ref.reshape(64, 96).astype(np.float32))
    e8m0 = (2.0**e).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    assert np.array_equal(b.scale_code.numpy(), e8m0)


def test_nvfp4_scales_are_e4m3_casts_and_elements_e2m1():
    torch.manual_seed(1)
    x = torch.randn(32, 64) * 3
    fmt = bf.nvfp4()
    b = bf.quantize(x, fmt)
    xb = x.reshape(32, 4, 16).numpy().astype(np.float32)
    ts = np.float32(np.abs(xb).max() / (448 * 6))
    sb = np.clip(np.abs(xb).max(-1) / (6 * ts), bf.E4M3_MIN, 448).astype(np.float32)
    sb = sb.astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(b.scale_code.numpy(), sb.view(np.uint8))
    scale = sb.astype(np.float32) * ts
    ref = _e2m1(np.clip(xb / scale[..., None], -6, 6)) * scale[..., None]
    assert np.allclose(bf.dequantize(b, fmt).numpy(), ref.reshape(32, 64), rtol=0, atol=1e-6)
    assert fmt.bits == 4.5


def test_e4m3_ties_round_to_even_as_ml_dtypes():
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.unique(grid[np.isfinite(grid) & (grid >= 0)])
    mids = (grid[1:] + grid[:-1]) / 2
    t = torch.from_numpy(mids).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(t, mids.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def test_int4_blocks_are_absmax_over_seven():
    torch.manual_seed(2)
    x = torch.randn(8, 64)
    fmt = bf.int4()
    q = bf.fake_quantize(x, fmt)
    s = (x.reshape(8, 2, 32).abs().amax(-1, keepdim=True) / 7).half().float()
    ref = (torch.round(x.reshape(8, 2, 32) / s).clamp(-7, 7) * s).reshape(8, 64)
    assert torch.equal(q, ref) and fmt.bits == 4.5


def test_bits_per_element_are_the_stored_ones():
    book = bf.BlockFormat("bd", tuple((0, .5, 1, 1.5, 2, 3, 4, m) for m in (6, 6.5, 7, 7.5)) * 4, 32)
    assert (bf.mxfp4().bits, bf.mxfp4(16).bits, bf.nvfp4().bits, bf.int4().bits, book.bits) == (4.25, 4.5, 4.5, 4.5,
                                                                                                4.375)


def test_ragged_rows_and_zero_blocks():
    x = torch.zeros(3, 40)
    x[1, 35], x[2, 39] = 3.0, 2.5  # scaled to 6 (exact) and to 5, a tie between 4 and 6: to even, 4
    q = bf.fake_quantize(x, bf.mxfp4())
    assert q.shape == x.shape and q[0].abs().sum() == 0 and q[1, 35] == 3.0 and q[2, 39] == 2.0


def test_fake_quantize_along_another_axis_blocks_that_axis():
    torch.manual_seed(3)
    v = torch.randn(2, 3, 64, 8)
    along = bf.fake_quantize(v, bf.mxfp4(), dim=-2)
    assert torch.equal(along, bf.fake_quantize(v.transpose(-1, -2), bf.mxfp4()).transpose(-1, -2))


def test_integer_block_dot_equals_the_float64_dot_of_dequantized_blocks_exactly():
    torch.manual_seed(4)
    fmt = bf.mxfp4()
    a, b = torch.randn(16, 32) * 10, torch.randn(8, 32) * 0.01
    pa, pb = kops.quantize_reference(a, fmt), kops.quantize_reference(b, fmt)
    ints = kops.gemm_reference(pa, fmt, pb, fmt).double()
    exact = bf.fake_quantize(a, fmt).double() @ bf.fake_quantize(b, fmt).double().T
    assert torch.equal(ints, exact)


def test_gemm_reference_sums_blocks_as_the_dequantized_matmul():
    torch.manual_seed(5)
    fmt = bf.mxfp4()
    a, b = torch.randn(5, 200), torch.randn(7, 200)
    out = kops.gemm_reference(kops.quantize_reference(a, fmt), fmt, kops.quantize_reference(b, fmt), fmt)
    ref = bf.fake_quantize(a, fmt).double() @ bf.fake_quantize(b, fmt).double().T
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-6)


def test_two_stage_never_leaves_the_pair_of_the_rounded_max():
    tables = tuple((0, .5, 1, 1.5, 2, 3, a, b) for a, b in ((5, 6), (4, 6), (6, 7.5), (5, 7.5)))
    fmt = bf.BlockFormat("t", tables, 32, select="two_stage")
    torch.manual_seed(6)
    x = torch.randn(500, 32)
    b = bf.quantize(x, fmt)
    h = torch.round(2 * x.abs().amax(-1) / bf.block_scale(b, fmt)[:, 0])
    chosen_max = torch.tensor([t[-1] for t in tables])[b.table[:, 0].long()]
    expect = torch.where(h <= 12, 6.0, 7.5)  # the smallest available max at or above the rounded one
    assert torch.equal(chosen_max, expect)


def test_overflow_clamp_saturates_and_bump_takes_the_next_exponent():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 7.9, 1.0
    book = (bf.E2M1[:-1] + (7.5,),)
    clamp = bf.BlockFormat("c", book, 32)
    bump = clamp.with_(overflow="bump")
    assert bf.fake_quantize(x, clamp)[0, 0] == 7.5
    qb = bf.quantize(x, bump)
    assert int(qb.scale_code[0, 0]) - 127 == 1 and bf.dequantize(qb, bump)[0, 0] == 8.0


def test_bad_formats_are_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        bf.BlockFormat("x", block=12)
    with pytest.raises(ValueError, match="e8m0"):
        bf.BlockFormat("x", scale="e4m3", select="two_stage")
    with pytest.raises(ValueError, match="8 sorted"):
        bf.BlockFormat("x", tables=((0, 1, 2),))


def test_nvfp4_row_tensor_scales_make_a_row_independent_of_its_batch():
    torch.manual_seed(7)
    x = torch.randn(4, 64)
    loud = torch.cat([x, 1000 * torch.randn(1, 64)])
    per_row = bf.nvfp4().with_(tensor_scale="row")
    assert torch.equal(bf.fake_quantize(loud, per_row)[:4], bf.fake_quantize(x, per_row))
    assert not torch.equal(bf.fake_quantize(loud, bf.nvfp4())[:4], bf.fake_quantize(x, bf.nvfp4()))
