"""Lexico on CUDA: dictionaries learned and used where the model runs, the cache exact with a complete dictionary on
the device through both attention paths, OMP's kernel and its early stop against the PyTorch reference."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import DynamicCache

from llmx.core import kernels, models
from llmx.plugins.lexico.attention import over_codes
from llmx.plugins.lexico.cache import CompressedCache
from llmx.plugins.lexico.codecs import KIVICodec, LexicoCodec
from llmx.plugins.lexico.dictionary import collect_kv, learn
from llmx.plugins.lexico.omp import omp, reconstruct

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def model_on_cuda():
    model, tok = models.load("ref:llama-test", device="cuda")
    return model, tok, tok("def main(argv):\n    parser = argparse.ArgumentParser(", return_tensors="pt")["input_ids"].cuda()


def test_dictionary_learning_runs_on_the_models_device(model_on_cuda):
    model, _, ids = model_on_cuda
    keys, values = collect_kv(model, ids.repeat(4, 1))[0]
    assert keys.is_cuda
    d, losses = learn(keys, atoms=32, sparsity=4, steps=5, lr=1e-2)
    assert d.is_cuda and losses[-1] <= losses[0] * 1.5


@pytest.mark.parametrize("attention", ["dense", "codes"])
def test_complete_dictionary_on_cuda_reproduces_greedy_and_beam_search(model_on_cuda, attention):
    model, _, ids = model_on_cuda
    hd = model.config.hidden_size // model.config.num_attention_heads
    q = torch.linalg.qr(torch.randn(hd, hd, generator=torch.Generator().manual_seed(0)))[0]  # on the CPU on purpose
    for beams in (1, 3):
        ref = model.generate(ids, max_new_tokens=12, num_beams=beams, do_sample=False, pad_token_id=0,
                             past_key_values=DynamicCache())
        cache = CompressedCache(lambda i: LexicoCodec(q, q, hd, fp8=False), model.config.num_hidden_layers,
                                buffer_length=4, chunk=2, buffer_dtype=None, attention=attention)
        with over_codes(model) if attention == "codes" else contextlib.nullcontext():
            out = model.generate(ids, max_new_tokens=12, num_beams=beams, do_sample=False, pad_token_id=0,
                                 past_key_values=cache)
        assert torch.equal(ref, out)
        assert all(c.is_cuda for layer in cache.layers for c in layer.codes)


def test_kivi_cache_on_cuda(model_on_cuda):
    model, _, ids = model_on_cuda
    cache = CompressedCache(lambda i: KIVICodec(4, 8), model.config.num_hidden_layers, buffer_length=4, chunk=8)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    assert torch.isfinite(out.logits).all() and all(c.is_cuda for c in cache.layers[0].codes)


@pytest.mark.skipif(not kernels.available(), reason="needs CuPy")
def test_omp_kernel_stops_early_like_the_reference_when_atoms_exceed_dimensions():
    gen = torch.Generator().manual_seed(0)
    d = torch.nn.functional.normalize(torch.randn(16, 64, generator=gen), dim=0)
    x = torch.randn(50, 16, generator=gen)
    idx, coef = omp(d.cuda(), x.cuda(), 24)
    assert torch.isfinite(coef).all()
    assert torch.allclose(reconstruct(d, idx.cpu(), coef.cpu()), x, atol=1e-3)
