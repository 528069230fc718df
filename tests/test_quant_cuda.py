"""Quantization on CUDA: every tensor on the weights' device, integer matmuls at decode shapes, kernel grids past
CUDA's limits, kernels on torch's stream. The padding and the empty-grid guard are checked on the CPU too."""

from __future__ import annotations

import pytest
import torch

from llmx.core import kernels
from llmx.core.kernels import ops
from llmx.core.quant import cpu_kernels
from llmx.core.quant.formats import IntFormat, quantize
from llmx.core.quant.gptq import gptq
from llmx.core.quant.packing import pack, unpack
from llmx.core.quant.qlinear import QuantLinear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cupy = pytest.mark.skipif(not kernels.available(), reason="needs CuPy and a CUDA device")


@pytest.mark.parametrize("m,k,n", [(1, 100, 36), (16, 64, 64), (3, 7, 5), (40, 24, 16)])
def test_padded_int_mm_equals_the_plain_one(m, k, n, monkeypatch):
    torch.manual_seed(0)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
    shapes, real = [], torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda x, y: (shapes.append((*x.shape, y.shape[1])), real(x, y))[1])
    out = ops.int_mm(a, b, pad=True)
    assert out.dtype == torch.int32 and torch.equal(out, a.int() @ b.int())
    (mp, kp, np_), = shapes  # what CUDA's _int_mm accepts: M > 16, K and N multiples of 8
    assert mp > 16 and kp % 8 == 0 and np_ % 8 == 0 and (mp, kp, np_) >= (m, k, n)


def test_an_empty_grid_launches_nothing(monkeypatch):
    monkeypatch.setattr(kernels, "function", lambda *a: (_ for _ in ()).throw(AssertionError("launched")))
    kernels.launch("k.cu", "f", (0, 4), (128,), (), like=None)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fmt,actorder", [(IntFormat(4, 32, full_range=True), True), (IntFormat(3, None, False), False)])
def test_gptq_on_cuda_stays_there_and_matches_the_cpu(fmt, actorder):
    torch.manual_seed(0)
    w, x = torch.randn(64, 128), torch.randn(512, 128)
    h = x.T @ x
    ref = gptq(w, h, fmt, actorder=actorder)
    res = gptq(w.cuda(), h.cuda(), fmt, actorder=actorder)
    for t in (res.codes, res.scale, res.zero, res.weight):
        assert t.is_cuda
    assert (res.codes.cpu() != ref.codes).float().mean() < 0.01  # float sums differ across devices: rare other roundings
    assert res.objective(w.cuda(), h.cuda()) <= 1.01 * ref.objective(w, h)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("bits", [3, 4])
def test_pack_on_cuda(bits):
    codes = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (6, 37), device="cuda")
    packed = pack(codes, bits, 2 ** (bits - 1))
    assert packed.is_cuda and torch.equal(packed.cpu(), pack(codes.cpu(), bits, 2 ** (bits - 1)))
    assert torch.equal(unpack(packed, bits, 37, 2 ** (bits - 1)).cpu(), codes.cpu().to(torch.int16))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("m,k,n", [(1, 128, 64), (1, 100, 36), (5, 256, 40), (33, 64, 64)])
def test_w8a8_layer_at_decode_shapes_on_cuda(m, k, n):
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n)
    fmt = IntFormat(8, None, full_range=True)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act_bits=8)
    x = torch.randn(m, k)
    with torch.no_grad():
        with cpu_kernels.exact():  # the integer sums exactly (a CPU without VNNI rounds them to bf16 otherwise)
            ref = q(x)
        out = q.cuda()(x.cuda())
    assert out.is_cuda and torch.allclose(out.cpu(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@cupy
@pytest.mark.parametrize("m", [0, 70_000])
def test_int4_gemm_beyond_the_grid_limit_and_with_no_rows(m):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 16)
    fmt = IntFormat(4, 32, full_range=True)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt).cuda()
    x = torch.randn(m, 64, device="cuda")
    out = ops.int4_gemm(x, q.qweight, q.scales, q.zeros, q.bias, 32, q.offset)
    ref = ops.int4_gemm_reference(x, q.qweight, q.scales, q.zeros, q.bias, 32, q.offset)
    assert out.shape == (m, 16) and torch.allclose(out, ref, rtol=1e-4, atol=1e-3)
    xq = torch.randint(-128, 128, (m, 64), dtype=torch.int8, device="cuda")
    sx = torch.full((m,), 0.01, device="cuda") if m else torch.tensor(0.01, device="cuda")
    out8 = ops.w4a8_gemm(xq, sx, q.qweight, q.scales, q.bias, 32)
    assert out8.shape == (m, 16) and torch.allclose(out8, ops.w4a8_gemm_reference(xq, sx, q.qweight, q.scales, q.bias, 32),
                                                     rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@cupy
def test_kernels_run_on_torchs_current_stream(monkeypatch):
    seen = []
    real = kernels.function

    def spy(path, name):
        f = real(path, name)
        return lambda *a, **kw: (seen.append(kw["stream"].ptr), f(*a, **kw))

    monkeypatch.setattr(kernels, "function", spy)
    x = torch.randn(300, 500, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = x @ x.T  # queued on the side stream; the kernel must wait for it
        q, s = ops.quantize_rows_int8(y)
    side.synchronize()
    assert seen == [side.cuda_stream]
    q_ref, s_ref = ops.quantize_rows_int8_reference(y)
    assert torch.allclose(s, s_ref) and (q.int() - q_ref.int()).abs().max() <= 1


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("method,bits", [("gptq", "w4a16"), ("rtn", "w8a8")])
def test_quantize_and_export_end_to_end_on_cuda(method, bits, tmp_path):
    """The whole path on a GPU: calibration, the solver, install, a forward, then the export check on that model."""
    import llmx
    from llmx.core import export

    model, tok = llmx.load("tiny:llama", device="cuda")
    q, metrics = llmx.quantize(model, tokenizer=tok, method=method, bits=bits, device="cuda", calib_samples=4,
                               calib_seq_len=32, save=False)
    ids = torch.randint(3, 200, (2, 16), device="cuda")
    with torch.no_grad():
        logits = q(input_ids=ids).logits
    assert logits.is_cuda and torch.isfinite(logits).all() and metrics["layers"] > 0
    out = export.write(export.prepare(q), q, tok, tmp_path / "ct", verify=True)
    assert out["max_abs_logit_diff"] < 1e-2


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fmt", [IntFormat(4, 64), IntFormat(8, None), IntFormat(4, 128, symmetric=False),
                                 IntFormat(3, 32, full_range=False)])
def test_round_to_nearest_codes_and_scales_are_bit_exact_on_cuda(fmt):
    """Scales divide by a device tensor, not a Python number (which CUDA turns into a reciprocal multiply)."""
    torch.manual_seed(0)
    w = torch.randn(512, 1024) * torch.rand(512, 1)
    cpu, gpu = quantize(w, fmt), quantize(w.cuda(), fmt)
    for a, b in zip(cpu, gpu, strict=True):
        assert torch.equal(a, b.cpu())
