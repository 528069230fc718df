"""CuPy kernels: every .cu compiles (no GPU needed), and on a GPU each kernel matches its PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from llmx.core import kernels
from llmx.core.kernels import ops


def test_kernels_are_shipped():
    names = {p.name for p in kernels.sources()}
    assert {"int4_gemm.cu", "int8_quant.cu"} <= names


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
