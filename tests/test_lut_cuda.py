"""The LUT GEMM kernel against its reference (every index width, decode and prefill shapes, with timings against an
fp16 matmul) and LUTLinear on the device. CPU inputs never reach the kernel."""

from __future__ import annotations

import time

import pytest
import torch

from llmx.core import kernels
from llmx.core.kernels import lut
from llmx.core.quant.lut import LUTLinear
from llmx.core.quant.packing import pack

cupy = pytest.mark.skipif(not kernels.available(), reason="needs CuPy and a CUDA device")


def _case(n: int, k: int, bits: int, device: str):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 2**bits, (n, k), generator=g)
    return pack(idx, bits).to(device), torch.randn(n, 2**bits, generator=g).half().to(device)


def test_cpu_inputs_take_the_reference(monkeypatch):
    monkeypatch.setattr(kernels, "function", lambda *a: (_ for _ in ()).throw(AssertionError("kernel on a CPU tensor")))
    q, cb = _case(8, 40, 3, "cpu")
    x = torch.randn(2, 40)
    assert torch.equal(lut.lut_gemm(x, q, cb, None, 3), lut.lut_gemm_reference(x, q, cb, None, 3))


@pytest.mark.gpu
@cupy
@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (1, 4096, 11008), (17, 1000, 300)])
def test_lut_gemm_matches_its_reference_and_is_timed(bits, m, k, n):
    q, cb = _case(n, k, bits, "cuda")
    x = torch.randn(m, k, device="cuda")
    bias = torch.randn(n, device="cuda")
    got, ref = lut.lut_gemm(x, q, cb, bias, bits), lut.lut_gemm_reference(x, q, cb, bias, bits)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        lut.lut_gemm(x, q, cb, bias, bits)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    xh, wh = x.half(), torch.randn(n, k, device="cuda", dtype=torch.float16)
    for _ in range(20):
        xh @ wh.T
    torch.cuda.synchronize()
    print(f"lut_gemm b{bits} {m}x{k}x{n}: {(t1 - t0) * 50:.3f} ms, fp16 {(time.perf_counter() - t1) * 50:.3f} ms")


@pytest.mark.gpu
@cupy
def test_lut_linear_on_the_device_equals_its_dequantized_weight():
    lin = torch.nn.Linear(2048, 256, bias=True).cuda()
    idx = torch.randint(0, 4, (256, 2048), device="cuda")
    layer = LUTLinear.from_indices(lin, idx, torch.randn(256, 4, device="cuda"), 2)
    x = torch.randn(3, 5, 2048, device="cuda")
    with torch.no_grad():
        assert torch.allclose(layer(x), torch.nn.functional.linear(x, layer.dequantized_weight(), layer.bias),
                              rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["lnq", "gptq"])
def test_guidedquant_runs_on_the_device_with_real_widths(backend):
    """Hidden 2048, GQA, biases (Qwen2), one block: gradients, guided Hessians and the backend all on the GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import llmx

    cfg = Qwen2Config(vocab_size=512, hidden_size=2048, intermediate_size=4096, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=4)
    model = Qwen2ForCausalLM(cfg).cuda()
    _, tok = llmx.load("tiny:llama")
    model, m = llmx.quantize(model, tokenizer=tok, method="guidedquant", bits="w2a16", backend=backend,
                             calib_samples=4, calib_seq_len=32, iterations=2, device="cuda", save=False)
    assert all(b.device.type == "cuda" for b in model.buffers()) and m["objective"] <= m["objective_seed"] * 1.0001
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 512, (1, 16), device="cuda")).logits).all()
