"""CuPy kernels: every .cu compiles (no GPU needed), and on a GPU each kernel matches its PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from llmx.core import kernels
from llmx.core.kernels import ops
from llmx.core.quant.formats import IntFormat, quantize
from llmx.core.quant.qlinear import QuantLinear
from llmx.plugins.quamba2 import ops as quamba2_ops


def test_kernels_are_shipped():
    names = {p.name for p in kernels.sources()}
    assert {"int4_gemm.cu", "int8_quant.cu", "w4a8_gemm.cu", "conv_quant.cu", "blockfp_quant.cu", "blockfp_gemm.cu"} <= names


@pytest.mark.parametrize("source", kernels.sources(), ids=lambda p: p.name)
def test_every_kernel_compiles(source):
    try:
        kernels.compile_check(source)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_a_broken_kernel_fails_to_compile(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void f(float* x) { x[0] = undefined_symbol; }\n')
    try:
        with pytest.raises(RuntimeError, match="undefined_symbol"):
            kernels.compile_check(bad)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_cpu_tensors_take_the_reference_path():
    x = torch.randn(4, 64)
    q, s = ops.quantize_rows_int8(x)
    assert torch.equal((q, s)[0], ops.quantize_rows_int8_reference(x)[0])


def test_w4a8_and_conv_cpu_tensors_never_reach_a_kernel(monkeypatch):
    def no_kernel(*args):
        raise AssertionError("a CPU tensor reached a CUDA kernel")

    monkeypatch.setattr(kernels, "function", no_kernel)
    q, xq, xs = _w4a8_case(3, 200, 16, 64, True, True)
    assert torch.equal(ops.w4a8_gemm(xq, xs, q.qweight, q.scales, q.bias, 64),
                       ops.w4a8_gemm_reference(xq, xs, q.qweight, q.scales, q.bias, 64))
    xbc, w, b, scale = _conv_case(2, 9, 12, 4, True)
    assert torch.equal(quamba2_ops.conv_silu_quant(xbc, w, b, scale), quamba2_ops.conv_silu_quant_reference(xbc, w, b, scale))


def _w4a8_case(m, k, n, group, per_row, bias, device="cpu"):
    """A W4A8 layer through the real storage path (quantize -> QuantLinear.from_codes), int8 codes and their scale."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=bias)
    fmt = IntFormat(4, group, True)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt).to(device)
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=device)
    xs = torch.rand(m, device=device) * 0.05 + 1e-3 if per_row else torch.tensor(0.02, device=device)
    return q, xq, xs


def _conv_case(b, t, c, k, bias, device="cpu"):
    torch.manual_seed(0)
    xbc = torch.randn(b, t, c, device=device)
    w = torch.randn(c, 1, k, device=device) * 0.5
    return (xbc, w, torch.randn(c, device=device) * 0.1 if bias else None,
            torch.linspace(0.005, 0.03, c, device=device))


@pytest.mark.parametrize("m,k,n,group,per_row,bias", [(5, 200, 48, 64, True, True), (3, 200, 48, 64, False, False),
                                                      (17, 256, 32, 128, True, True), (4, 203, 24, 36, False, True)])
def test_w4a8_reference_matches_float_dequantized_matmul(m, k, n, group, per_row, bias):
    q, xq, xs = _w4a8_case(m, k, n, group, per_row, bias)
    with torch.no_grad():
        expected = (xq.float() * xs.reshape(-1, 1)) @ q.dequantized_weight().T
        expected = expected + q.bias if bias else expected
        out = ops.w4a8_gemm_reference(xq, xs, q.qweight, q.scales, q.bias, group)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert (out - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_w4a8_rejects_a_wrong_activation_scale_length():
    q, xq, _ = _w4a8_case(4, 64, 8, 32, True, False)
    with pytest.raises(ValueError, match="x_scale"):
        ops.w4a8_gemm(xq, torch.ones(3), q.qweight, q.scales, q.bias, 32)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_silu_quant_reference_matches_a_loop_over_time(bias):
    xbc, w, b, s = _conv_case(2, 11, 6, 4, bias)
    k = w.shape[-1]
    expected = torch.empty(2, 11, 6, dtype=torch.int8)
    for t in range(11):
        y = (b if bias else torch.zeros(6)).expand(2, 6).clone()
        for j in range(k):
            if t - (k - 1) + j >= 0:
                y += w[:, 0, j] * xbc[:, t - (k - 1) + j]
        expected[:, t] = torch.clamp(torch.round(y * torch.sigmoid(y) / s), -128, 127).to(torch.int8)
    out = quamba2_ops.conv_silu_quant_reference(xbc, w, b, s)
    assert out.dtype == torch.int8 and torch.equal(out, expected)
    assert (out.abs() == 127).any() and (out.abs() < 127).any()


gpu = pytest.mark.skipif(not kernels.available(), reason="needs CuPy and a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m,k,n,group,sym", [(1, 256, 512, 128, True), (7, 200, 96, 64, False), (33, 4096, 1024, 128, True)])
def test_int4_gemm_kernel_matches_reference(m, k, n, group, sym):
    from llmx.core.quant.formats import IntFormat, quantize
    from llmx.core.quant.qlinear import QuantLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n)
    fmt = IntFormat(4, group, sym)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt).cuda()
    x = torch.randn(m, k, device="cuda")
    ref = ops.int4_gemm_reference(x, q.qweight, q.scales, q.zeros, q.bias, group, q.offset)
    out = ops.int4_gemm(x, q.qweight, q.scales, q.zeros, q.bias, group, q.offset)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@gpu
def test_int8_quantizer_kernel_matches_reference():
    x = torch.randn(37, 1000, device="cuda") * torch.linspace(0.1, 10, 1000, device="cuda")
    q, s = ops.quantize_rows_int8(x)
    q_ref, s_ref = ops.quantize_rows_int8_reference(x)
    assert torch.allclose(s, s_ref) and (q.int() - q_ref.int()).abs().max() <= 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m,k,n,group,per_row,bias", [(1, 256, 512, 128, False, True), (7, 200, 96, 64, True, False),
                                                      (33, 4096, 1024, 128, True, True), (5, 203, 40, 36, False, True),
                                                      (4, 204, 17, 64, True, True)])
def test_w4a8_gemm_kernel_matches_reference(m, k, n, group, per_row, bias):
    q, xq, xs = _w4a8_case(m, k, n, group, per_row, bias, device="cuda")
    with torch.no_grad():
        ref = ops.w4a8_gemm_reference(xq, xs, q.qweight, q.scales, q.bias, group)
        out = ops.w4a8_gemm(xq, xs, q.qweight, q.scales, q.bias, group)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("b,t,c,k,bias", [(2, 37, 96, 4, True), (1, 1, 64, 4, False), (3, 130, 200, 3, True), (1, 5, 7, 6, True)])
def test_conv_silu_quant_kernel_matches_reference(b, t, c, k, bias):
    xbc, w, bb, s = _conv_case(b, t, c, k, bias, device="cuda")
    q = quamba2_ops.conv_silu_quant(xbc, w, bb, s)
    q_ref = quamba2_ops.conv_silu_quant_reference(xbc, w, bb, s)
    assert q.dtype == torch.int8 and (q.int() - q_ref.int()).abs().max() <= 1
