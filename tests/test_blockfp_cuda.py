"""Block formats on CUDA: the fused quantizer and the integer-MAC GEMM against their references, the block linear's
integer path against its emulation, the full-path model on the device. The dispatch itself is checked on the CPU."""

from __future__ import annotations

import time

import pytest
import torch

from llmx.core import kernels
from llmx.core.kernels import blockfp as kops
from llmx.core.quant import blockapply
from llmx.core.quant import blockfp as bf
from llmx.core.quant.blocklinear import BlockQuantLinear
from llmx.plugins.blockdialect import formatbook

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cupy = pytest.mark.skipif(not kernels.available(), reason="needs CuPy and a CUDA device")
BD = bf.BlockFormat("blockdialect", formatbook.load("dialectfp4"), 32, select="two_stage")
FORMATS = {"mxfp4": bf.mxfp4(), "bd_two_stage": BD, "bd_mse": BD.with_(select="mse"),
           "bd_bump": BD.with_(overflow="bump")}


def test_only_integer_ready_formats_take_the_kernels():
    assert kops.integer_ready(bf.mxfp4()) and kops.integer_ready(BD)
    assert not any(kops.integer_ready(f) for f in (bf.nvfp4(), bf.int4(), bf.mxfp4(16), None))
    assert not kops.integer_path(torch.zeros(2, 32), bf.mxfp4(), bf.mxfp4())  # a CPU tensor never does


def _llm_like(rows: int, k: int, device: str) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, k, generator=g, device=device) * torch.exp(torch.randn(k, generator=g, device=device))
    return torch.where(torch.rand(x.shape, generator=g, device=device) < 0.01, 30 * x, x)


@pytest.mark.gpu
@cupy
@pytest.mark.parametrize("name", list(FORMATS))
def test_fused_quantizer_matches_its_reference(name):
    fmt = FORMATS[name]
    x = _llm_like(1000, 4096 + 96, "cuda")
    got, ref = kops.quantize(x, fmt), kops.quantize_reference(x, fmt)
    assert torch.equal(got.exps, ref.exps)
    # the kernel sums a block's squared errors in another order: a near tie between two dialects may flip
    same = (got.tids == ref.tids).float().mean().item()
    assert same > 0.999, same  # ... and then either choice must cost the same
    err = [((x - bf.dequantize(_blocks(p, x.shape[1]), fmt)) ** 2).sum().item() for p in (got, ref)]
    assert err[0] == pytest.approx(err[1], rel=1e-6)


def _blocks(p: kops.Packed, k: int) -> bf.Blocks:
    rows, nb = p.exps.shape
    codes = bf.unpack_codes(p.codes, nb * 32).reshape(rows, nb, 32)
    return bf.Blocks(codes, p.tids, p.exps, None, k)


@pytest.mark.gpu
@cupy
@pytest.mark.parametrize("m,k,n", [(1, 4096, 4096), (17, 2048, 512), (300, 96, 40)])
def test_integer_gemm_matches_its_reference_and_is_timed(m, k, n):
    x, w = _llm_like(m, k, "cuda"), torch.randn(n, k, device="cuda") * 0.02
    a, b = kops.quantize(x, BD), kops.quantize(w, FORMATS["bd_mse"])
    got = kops.gemm(a, BD, b, FORMATS["bd_mse"])
    ref = kops.gemm_reference(a, BD, b, FORMATS["bd_mse"])
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        kops.gemm(a, BD, b, FORMATS["bd_mse"])
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    xh, wh = x.half(), w.half()
    for _ in range(10):
        xh @ wh.T
    torch.cuda.synchronize()
    print(f"blockfp_gemm {m}x{k}x{n}: {(t1 - t0) * 100:.3f} ms, fp16 matmul {(time.perf_counter() - t1) * 100:.3f} ms")


@pytest.mark.gpu
@cupy
def test_block_linear_integer_path_equals_its_emulation():
    torch.manual_seed(0)
    lin = torch.nn.Linear(2048, 512, bias=True).cuda()
    q = BlockQuantLinear.from_linear(lin, FORMATS["bd_mse"], BD)
    x = torch.randn(4, 7, 2048, device="cuda")
    with torch.no_grad():
        fast = q(x)
        slow = torch.nn.functional.linear(bf.fake_quantize(x, BD), q.dequantized_weight(), q.bias)
    assert fast.device.type == "cuda" and torch.allclose(fast, slow, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fmt", [bf.nvfp4(), BD])
def test_full_path_model_runs_on_the_device_with_real_widths(fmt):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=256, hidden_size=2048, intermediate_size=4096, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=4)
    model = Qwen2ForCausalLM(cfg).cuda().eval()
    weight = fmt.with_(select="mse") if len(fmt.tables) > 1 else fmt
    blockapply.quantize_blocks_(model, weight, fmt, ("linear", "attn_qk", "attn_pv"))
    assert all(b.device.type == "cuda" for b in model.buffers())
    with torch.no_grad():
        logits = model(torch.randint(0, 256, (2, 40), device="cuda")).logits
    assert logits.device.type == "cuda" and torch.isfinite(logits).all()
