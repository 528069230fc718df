"""Lexico's cache: exact with a complete dictionary, real memory accounting, KIVI baseline, dictionary file errors."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from llmx.core import models
from llmx.plugins.lexico.cache import CompressedCache, KIVICodec, LexicoCodec


def setup():
    model, tok = models.load("ref:llama-test")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    ids = tok("def main(argv):\n    parser = argparse.ArgumentParser(description=", return_tensors="pt")["input_ids"]
    return model, tok, head_dim, ids


def test_complete_dictionary_reproduces_greedy_generation_exactly():
    model, _, hd, ids = setup()
    q = torch.linalg.qr(torch.randn(hd, hd, generator=torch.Generator().manual_seed(0)))[0]
    ref = model.generate(ids, max_new_tokens=24, do_sample=False, past_key_values=DynamicCache(), pad_token_id=0)
    cache = CompressedCache(lambda i: LexicoCodec(q, q, hd, fp8=False), model.config.num_hidden_layers,
                            buffer_length=4, chunk=2, buffer_dtype=None)
    out = model.generate(ids, max_new_tokens=24, do_sample=False, past_key_values=cache, pad_token_id=0)
    assert torch.equal(ref, out)
    assert cache.get_seq_length() == out.shape[1] - 1
    assert all(layer.keys.shape[-2] < 4 + 2 for layer in cache.layers)  # only the buffer stays exact


def test_stored_bytes_count_ids_coefficients_and_buffer():
    model, _, hd, ids = setup()
    d = torch.nn.functional.normalize(torch.randn(hd, 64), dim=0)
    cache = CompressedCache(lambda i: LexicoCodec(d, d, 4), model.config.num_hidden_layers, buffer_length=8, chunk=1)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    cfg, t = model.config, ids.shape[1]
    vectors = cfg.num_hidden_layers * cfg.num_key_value_heads * 2
    expected = vectors * ((t - 8) * 3 * 4 + 8 * hd * 2)  # 3s bytes per compressed vector, fp16 buffer
    assert cache.stored_bytes() == expected


def test_kivi_codec_round_trip_error_shrinks_with_bits():
    x = torch.randn(1, 2, 64, 16)
    errs = [float((KIVICodec(b).decode(KIVICodec(b).encode(x, w), w, torch.float32) - x).norm() / x.norm())
            for b in (2, 4, 8) for w in (0, 1)]
    assert errs[0] > errs[2] > errs[4] and errs[1] > errs[3] > errs[5] and errs[4] < 0.01


def test_dictionary_for_another_model_or_damaged_file_is_exit_2(cli, tmp_path):
    r = cli("--json", "train", "--method", "lexico", "--model", "ref:llama-test", "--set", "atoms=32", "--set", "steps=3",
            "--set", "windows=4", "-o", tmp_path / "t")
    assert r.code == 0, r.err
    path = r.json()["stages"][0]["metrics"]["dictionary"]
    ok = cli("--json", "decode", "--method", "lexico", "--model", "ref:llama-test", "--set", f"dictionary={path}",
             "--set", "windows=1", "--set", "context_len=48", "--set", "continuation_len=8", "--set", "generate_tokens=4",
             "-o", tmp_path / "d")
    assert ok.code == 0, ok.err
    assert 0 < ok.json()["stages"][0]["metrics"]["kv_memory_fraction"] < 1.5
    other = cli("decode", "--method", "lexico", "--model", "ref:opt-test", "--set", f"dictionary={path}", "-o", tmp_path / "x")
    assert other.code == 2 and "learned for another model" in other.err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    broken = cli("decode", "--method", "lexico", "--model", "ref:llama-test", "--set", f"dictionary={bad}", "-o", tmp_path / "x")
    assert broken.code == 2 and "not a readable Lexico dictionary" in broken.err
    assert not (tmp_path / "x").exists() or list((tmp_path / "x").iterdir()) == []


def test_window_eviction_keeps_sinks_and_recent_tokens_with_absolute_positions():
    from llmx.plugins.lexico.cache import WindowCache

    model, _, hd, ids = setup()
    cache = WindowCache(model.config.num_hidden_layers, window=6, sinks=2)
    out = model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=cache, pad_token_id=0)
    assert cache.get_seq_length() == out.shape[1] - 1
    assert all(layer.keys.shape[-2] == 8 for layer in cache.layers)
    big = WindowCache(model.config.num_hidden_layers, window=1000, store_dtype=None)  # nothing evicted: the full cache
    ref = model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=DynamicCache(), pad_token_id=0)
    assert torch.equal(model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=big, pad_token_id=0), ref)
