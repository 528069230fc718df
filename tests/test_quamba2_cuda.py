"""Quamba2 on CUDA against the CPU.

Same inputs, same result: sort-and-cluster (computed on the CPU for every device) returns the CPU's permutation on
the statistic's device; max, k-th value and the int8 points' division and rounding are exact on both devices, while
scales ``v / 127`` may differ by an ulp (CUDA divides by a Python scalar as a multiplication by its reciprocal) and
the mean over tokens in the last bits; the rearrangement writes the same weights. End to end, each smoke recipe's
method (Mamba2: quamba2 W4A8; Mamba1: quamba1 W8A8) runs on CUDA with every tensor of the quantized model there and a
perplexity within 2% of the CPU run's (calibration statistics differ in the last bits, cuDNN's conv1d runs in TF32,
so a few codes move: a TF32-sized perturbation of the conv moved the CPU's perplexity by 0.3%). The CPU-quantized
model reloaded on CUDA gives the CPU's logits, prefill and one cached decoding step, within 2% in relative Frobenius
norm (CPU side on its exact float32 path, TF32 off; an int8 code flipped by a last-bit difference moves the logits by
up to ~1% of their largest magnitude, 0.2% in norm, and the quantization error itself is 2-8%).
"""

from __future__ import annotations

import math

import pytest
import torch

import llmx
from llmx.core import models
from llmx.core.data import random_windows
from llmx.plugins.quamba2 import mixers, reorder
from llmx.plugins.quamba2.cluster import grouped_scales, sort_and_cluster
from llmx.plugins.quamba2.points import Int8Point, Observer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

G, HEADS_PER, HD, N = 4, 4, 32, 16
ULP = 2.5e-7  # two float32 ulps, relative
HEADS = G * HEADS_PER
RECIPES = {  # configs/smoke/quamba2.yaml and quamba2_mamba1.yaml
    "quamba2": ("ref:mamba2-test", {"bits": "w4a8", "calib_samples": 8, "calib_seq_len": 64}),
    "quamba2_mamba1": ("ref:mamba-test", {"bits": "w8a8", "calib_samples": 4, "calib_seq_len": 64}),
}
DATA = {"source": "stdlib", "seq_len": 64}


def test_sort_and_cluster_and_grouped_scales_are_the_cpus():
    gen = torch.Generator().manual_seed(0)
    stat = torch.exp(torch.randn(HEADS * HD, generator=gen))
    cpu, gpu = sort_and_cluster(stat, HEADS, HD, G), sort_and_cluster(stat.cuda(), HEADS, HD, G)
    for name in ("head_index", "within", "head_group"):
        assert getattr(gpu, name).is_cuda and torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
    assert gpu.dim_bounds == cpu.dim_bounds
    for state in (1, N):  # x (per channel) and the cached state (per channel x state index)
        absmax = torch.rand(HEADS * HD * state, generator=gen)
        scales = grouped_scales(absmax.cuda(), gpu, HD, state)
        assert scales.is_cuda and torch.allclose(scales.cpu(), grouped_scales(absmax, cpu, HD, state), rtol=ULP, atol=0)


def test_observer_statistics_and_int8_points_are_the_cpus():
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 50, 64, generator=gen) * torch.exp(torch.randn(64, generator=gen)) for _ in range(3)]
    cpu, gpu = Observer(percentile=0.9995), Observer(percentile=0.9995)
    for x in batches:
        cpu(x)
        gpu(x.cuda())
    assert gpu.absmax.is_cuda and torch.equal(gpu.absmax.cpu(), cpu.absmax)
    assert gpu.meanabs.is_cuda and torch.allclose(gpu.meanabs.cpu(), cpu.meanabs, rtol=1e-5, atol=0)
    assert gpu.pct.is_cuda and torch.allclose(gpu.pct.cpu(), cpu.pct, rtol=1e-15, atol=0)  # k-th value, float64 EMA
    for scale_cpu, scale_gpu in ((cpu.percentile_scale(), gpu.percentile_scale()), (cpu.group_scale(4), gpu.group_scale(4)),
                                 (cpu.tensor_scale(), gpu.tensor_scale())):
        assert scale_gpu.is_cuda and torch.allclose(scale_gpu.cpu(), scale_cpu, rtol=ULP, atol=0)
        point = Int8Point(scale_gpu)
        assert all(b.is_cuda for b in point.buffers())  # the same scales give the same int8 values on both devices
        assert torch.equal(point(batches[0].cuda()).cpu(), Int8Point(scale_gpu.cpu())(batches[0]))


def _grouped_mamba2(device: str):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, state_size=16, expand=2, head_dim=16,
                       num_heads=8, n_groups=2, conv_kernel=4, chunk_size=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(cfg).eval()
    mixers.convert(model)
    return model.to(device)


def test_rearrangement_on_cuda_writes_the_cpus_weights_and_keeps_the_output():
    cpu, gpu = _grouped_mamba2("cpu"), _grouped_mamba2("cuda")
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = gpu(input_ids=ids.cuda()).logits
    gen = torch.Generator().manual_seed(1)
    heads = torch.cat([torch.randperm(4, generator=gen), 4 + torch.randperm(4, generator=gen)])
    within = torch.stack([torch.randperm(16, generator=gen) for _ in range(8)])
    reorder.apply(cpu.backbone.layers[0].mixer, heads, within)
    ch = reorder.apply(gpu.backbone.layers[0].mixer, heads, within)  # CPU indices, CUDA weights
    assert ch.is_cuda
    for (name, p_cpu), p_gpu in zip(cpu.state_dict().items(), gpu.state_dict().values(), strict=True):
        assert p_gpu.is_cuda and torch.equal(p_gpu.cpu(), p_cpu), name
    with torch.no_grad():
        assert (gpu(input_ids=ids.cuda()).logits - base).abs().max() < 1e-4
    with pytest.raises(ValueError, match="across SSD group 0"):
        reorder.apply(gpu.backbone.layers[0].mixer, torch.tensor([4, 1, 2, 3, 0, 5, 6, 7], device="cuda"), within.cuda())


def _nll(model, ids: torch.Tensor) -> float:
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=ids.to(device)).logits[:, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten().to(device)))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_smoke_recipe_quantizes_on_cuda_like_on_the_cpu(recipe, monkeypatch):
    monkeypatch.setenv("LLMX_CPU_KERNELS", "0")  # the CPU side on the exact path (its int4 kernel computes in bf16)
    name, params = RECIPES[recipe]
    cpu, cpu_metrics = llmx.quantize(name, method="quamba2", device="cpu", data=DATA, save=False, **params)
    gpu, gpu_metrics = llmx.quantize(name, method="quamba2", device="cuda", data=DATA, save=False, **params)
    for key in ("recipe", "activations", "arch", "rotated", "calib_tokens", "layers", "quantized_params", "quantized_bytes"):
        assert gpu_metrics[key] == cpu_metrics[key], key
    assert all(t.is_cuda for t in (*gpu.parameters(), *gpu.buffers()))
    points = [p for layer in gpu.backbone.layers for p in layer.mixer.points.values()]
    assert points and all(isinstance(p, Int8Point) and p.table.is_cuda for p in points)
    _, tok = models.load(name)
    ids = random_windows(tok, "stdlib", 8, 64, seed=9, split="validation")
    nll_cpu, nll_gpu = _nll(cpu, ids), _nll(gpu, ids)
    assert abs(math.exp(nll_gpu - nll_cpu) - 1) <= 0.02, (math.exp(nll_cpu), math.exp(nll_gpu))


def _logits_and_step(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill logits, and the logits of one cached decoding step after ``ids[:, :-1]`` (int8 state in the cache)."""
    with torch.no_grad():
        full = model(input_ids=ids).logits
        out = model(input_ids=ids[:, :-1], use_cache=True)
        key = "cache" if "cache" in out else "cache_params"  # "cache_params" in older transformers
        step = model(input_ids=ids[:, -1:], use_cache=True, **{key: out[key]}).logits[:, -1]
    return full, step


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_cpu_quantized_model_reloaded_on_cuda_gives_the_cpus_logits(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMX_CPU_KERNELS", "0")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    name, params = RECIPES[recipe]
    _, metrics = llmx.quantize(name, method="quamba2", device="cpu", data=DATA, output_dir=tmp_path, **params)
    cpu, tok = models.load(metrics["model_dir"])
    gpu, _ = models.load(metrics["model_dir"], device="cuda")
    assert all(t.is_cuda for t in (*gpu.parameters(), *gpu.buffers()))
    ids = random_windows(tok, "stdlib", 4, 48, seed=9, split="validation")
    for ref, got in zip(_logits_and_step(cpu, ids), _logits_and_step(gpu, ids.cuda()), strict=True):
        assert got.is_cuda and (got.cpu() - ref).norm() <= 2e-2 * ref.norm()
