"""Lexico's cache: exact with a complete dictionary (greedy and beam search, both attention paths), codes that follow
the batch, storage that is what is counted, attention over codes equal to the dense rebuild, packed KIVI, and
dictionary file errors."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import DynamicCache

from llmx.core import models
from llmx.plugins.lexico.attention import over_codes
from llmx.plugins.lexico.cache import CompressedCache, WindowCache
from llmx.plugins.lexico.codecs import KIVICodec, LexicoCodec

PROMPT = "def main(argv):\n    parser = argparse.ArgumentParser(description="


@pytest.fixture(scope="module")
def setup():
    model, tok = models.load("ref:llama-test")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    return model, tok, head_dim, tok(PROMPT, return_tensors="pt")["input_ids"]


def scope(model, attention):
    return over_codes(model) if attention == "codes" else contextlib.nullcontext()


def complete(model, hd, attention, buffer_length=4, chunk=2):
    q = torch.linalg.qr(torch.randn(hd, hd, generator=torch.Generator().manual_seed(0)))[0]
    return CompressedCache(lambda i: LexicoCodec(q, q, hd, fp8=False), model.config.num_hidden_layers,
                           buffer_length=buffer_length, chunk=chunk, buffer_dtype=None, attention=attention)


def codes(layer) -> tuple[torch.Tensor, ...]:
    return (*layer.key_codes, *layer.value_codes)


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``: what they really keep alive."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


@pytest.mark.parametrize("attention", ["dense", "codes"])
def test_complete_dictionary_reproduces_greedy_and_beam_search_exactly(setup, attention):
    model, _, hd, ids = setup
    for beams in (1, 3):
        ref = model.generate(ids, max_new_tokens=16, num_beams=beams, do_sample=False, pad_token_id=0)
        cache = complete(model, hd, attention, buffer_length=1, chunk=1)  # generated tokens get compressed too
        with scope(model, attention):
            out = model.generate(ids, max_new_tokens=16, num_beams=beams, do_sample=False, past_key_values=cache,
                                 pad_token_id=0)
        assert torch.equal(ref, out), (attention, beams)
        assert all(layer.compressed_keys == out.shape[1] - 2 and layer.keys.shape[-2] == 1 for layer in cache.layers)
    assert model.config._attn_implementation == "sdpa"  # restored after the block


def beam_scores(model, ids, cache=None) -> torch.Tensor:
    out = model.generate(ids, max_new_tokens=16, num_beams=4, do_sample=False, pad_token_id=0, output_scores=True,
                         return_dict_in_generate=True, **({"past_key_values": cache} if cache is not None else {}))
    return torch.stack(out.scores)


@pytest.mark.parametrize("reorder_codes", [True, False])
def test_beam_scores_follow_the_full_cache_only_when_codes_are_reordered(setup, monkeypatch, reorder_codes):
    """Every beam's step scores equal the full cache's; with the codes left in place at each reorder (the bug this
    guards against) the beams read each other's past and the scores part."""
    from llmx.plugins.lexico.cache import CompressedLayer

    model, _, hd, ids = setup
    ref = beam_scores(model, ids)
    if not reorder_codes:
        monkeypatch.setattr(CompressedLayer, "_batch", lambda self, op: setattr(self, "keys", op(self.keys))
                            or setattr(self, "values", op(self.values)))
    ours = beam_scores(model, ids, complete(model, hd, "dense", buffer_length=1, chunk=1))
    finite = torch.isfinite(ref) & torch.isfinite(ours)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(ours)) or not reorder_codes
    assert torch.allclose(ref[finite], ours[finite], atol=1e-4) == reorder_codes


def test_codes_lost_before_attention_is_an_error(setup, monkeypatch):
    from llmx.plugins.lexico import cache as cache_mod

    model, _, hd, ids = setup
    cache = complete(model, hd, "codes")
    monkeypatch.setattr(cache_mod, "CODES_ATTR", "elsewhere")  # the tag no longer reaches the attention function
    with torch.no_grad(), over_codes(model), pytest.raises(RuntimeError, match="never read"):
        model(input_ids=ids, past_key_values=cache)
        model(input_ids=ids[:, -1:], past_key_values=cache)


def test_a_codes_cache_outside_the_codes_attention_is_an_error(setup):
    model, _, hd, ids = setup
    cache = complete(model, hd, "codes")
    with torch.no_grad(), pytest.raises(RuntimeError, match="never read"):
        model(input_ids=ids, past_key_values=cache)
        for _ in range(2):
            model(input_ids=ids[:, -1:], past_key_values=cache)


def test_batch_selection_and_reordering_keep_codes_with_their_sequence(setup):
    model, tok, hd, _ = setup
    d = torch.nn.functional.normalize(torch.randn(hd, 48, generator=torch.Generator().manual_seed(1)), dim=0)
    texts = ["import os\nimport sys\n\ndef run(path):\n    return os.path.join(path, 'x')\n",
             "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"]
    batch = torch.stack([tok(t, return_tensors="pt")["input_ids"][0, :24] for t in texts])
    make = lambda: CompressedCache(lambda i: LexicoCodec(d, d, 3), model.config.num_hidden_layers, buffer_length=5)  # noqa: E731
    both, alone = make(), make()
    model(input_ids=batch, past_key_values=both, use_cache=True)
    model(input_ids=batch[1:], past_key_values=alone, use_cache=True)
    both.reorder_cache(torch.tensor([1, 0]))
    for a, b in zip(both.layers, alone.layers, strict=True):
        assert all(torch.equal(x[:1].float(), y.float()) for x, y in zip(codes(a), codes(b), strict=True))
        assert torch.equal(a.keys[:1], b.keys)
    both.batch_select_indices(torch.tensor([0]))
    repeated = make()
    model(input_ids=batch[1:], past_key_values=repeated, use_cache=True)
    repeated.batch_repeat_interleave(2)
    for a, b, r in zip(both.layers, alone.layers, repeated.layers, strict=True):
        assert all(torch.equal(x.float(), y.float()) for x, y in zip(codes(a), codes(b), strict=True))
        assert r.key_codes[0].shape[0] == 2 and torch.equal(r.key_codes[0][1], b.key_codes[0][0])


@pytest.mark.parametrize("codec", ["lexico", "kivi"])
def test_after_prefill_storage_is_exactly_the_accounted_bytes(setup, codec):
    model, _, hd, ids = setup
    d = torch.nn.functional.normalize(torch.randn(hd, 64), dim=0)
    make = (lambda i: LexicoCodec(d, d, 4)) if codec == "lexico" else (lambda i: KIVICodec(2, 8))
    cache = CompressedCache(make, model.config.num_hidden_layers, buffer_length=8)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    for layer in cache.layers:
        assert storage_bytes([layer.keys, layer.values, *codes(layer)]) == layer.stored_bytes()
    cfg, t = model.config, ids.shape[1]
    vectors = cfg.num_hidden_layers * cfg.num_key_value_heads
    if codec == "lexico":  # 3s bytes per compressed vector (int16 id + fp8 coefficient), fp16 buffer
        assert cache.stored_bytes() == 2 * vectors * ((t - 8) * 3 * 4 + 8 * hd * 2)
    else:  # KIVI's residual: keys in whole 8-token residuals (the rest exact), values all but the last 8; 2-bit
        keys, values = t - t % 8, t - 8  # codes packed 4 to a byte, an fp16 scale and zero per group
        assert all((layer.compressed_keys, layer.compressed_values) == (keys, values) for layer in cache.layers)
        stored = (keys + values) * hd // 4 + 2 * 2 * (keys // 8 * hd + values * hd // 8) + (2 * t - keys - values) * hd * 2
        assert cache.stored_bytes() == vectors * stored


def test_attention_over_codes_equals_the_dense_rebuild():
    gen = torch.Generator().manual_seed(0)
    B, Hkv, g, Tq, Tc, Tb, d, N = 2, 2, 3, 3, 41, 5, 16, 64
    D = torch.nn.functional.normalize(torch.randn(d, N, generator=gen), dim=0)
    codec = LexicoCodec(D, torch.nn.functional.normalize(torch.randn(d, N, generator=gen), dim=0), 4, 6)
    kc = codec.encode_keys(torch.randn(B, Hkv, Tc, d, generator=gen))
    vc = codec.encode_values(torch.randn(B, Hkv, Tc, d, generator=gen))
    keys, values = codec.decode_keys(kc, torch.float32), codec.decode_values(vc, torch.float32)
    bk, bv = torch.randn(B, Hkv, Tb, d, generator=gen), torch.randn(B, Hkv, Tb, d, generator=gen)
    q = torch.randn(B, Hkv * g, Tq, d, generator=gen)
    mask = torch.ones(B, 1, Tq, Tc + Tb, dtype=torch.bool)
    mask[0, :, :, :7] = False  # left padding in the first sequence
    mask[:, :, 0, -2:] = False  # causal tail inside the buffer
    k_all = torch.cat([keys, bk], 2).repeat_interleave(g, 1)
    v_all = torch.cat([values, bv], 2).repeat_interleave(g, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=0.3)
    for gather in (1 << 22, 500, 50):  # one tile, query rows in tiles, compressed tokens in tiles too
        import llmx.plugins.lexico.codecs as codecs

        old, codecs.GATHER_ELEMENTS = codecs.GATHER_ELEMENTS, gather
        try:
            out = codec.attend(q, bk, bv, kc, vc, mask, 0.3)
        finally:
            codecs.GATHER_ELEMENTS = old
        assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)


@pytest.mark.parametrize("split", [(40, 38), (40, 0), (0, 3)])
def test_kivi_attention_over_codes_equals_the_dense_rebuild(split):
    """Quantized keys and values over other counts of tokens (KIVI's residual keeps 0..R-1 keys exact and R values),
    either side possibly none yet; one block, eighths, then a key group and a value token at a time."""
    import llmx.plugins.lexico.codecs as codecs

    gen = torch.Generator().manual_seed(0)
    B, Hkv, g, Tq, T, d = 2, 2, 3, 3, 46, 16
    codec, (tk, tv) = KIVICodec(2, 8), split
    k, v = torch.randn(B, Hkv, T, d, generator=gen), torch.randn(B, Hkv, T, d, generator=gen)
    kc, vc = (codec.encode_keys(k[:, :, :tk]) if tk else None), (codec.encode_values(v[:, :, :tv]) if tv else None)
    keys = torch.cat([*([codec.decode_keys(kc, torch.float32)] if tk else []), k[:, :, tk:]], 2)
    values = torch.cat([*([codec.decode_values(vc, torch.float32)] if tv else []), v[:, :, tv:]], 2)
    q = torch.randn(B, Hkv * g, Tq, d, generator=gen)
    mask = torch.ones(B, 1, Tq, T, dtype=torch.bool)
    mask[0, :, :, :7] = False  # left padding in the first sequence
    mask[:, :, 0, -2:] = False  # causal tail inside the buffer
    ref = torch.nn.functional.scaled_dot_product_attention(q, keys.repeat_interleave(g, 1),
                                                           values.repeat_interleave(g, 1), attn_mask=mask, scale=0.3)
    for elements, split in ((1 << 22, 1), (1 << 22, 8), (1, 1)):
        old = codecs.DEQUANT_ELEMENTS, codecs.DEQUANT_SPLIT
        codecs.DEQUANT_ELEMENTS, codecs.DEQUANT_SPLIT = elements, split
        try:
            out = codec.attend(q, k[:, :, tk:], v[:, :, tv:], kc, vc, mask, 0.3)
        finally:
            codecs.DEQUANT_ELEMENTS, codecs.DEQUANT_SPLIT = old
        assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)


@pytest.mark.parametrize("codec", ["lexico", "kivi"])
def test_model_logits_agree_between_codes_and_dense_attention(setup, codec):
    model, _, hd, ids = setup
    d = torch.nn.functional.normalize(torch.randn(hd, 64, generator=torch.Generator().manual_seed(2)), dim=0)
    make = (lambda i: LexicoCodec(d, d, 4)) if codec == "lexico" else (lambda i: KIVICodec(2, 4))
    logits = {}
    for attention in ("dense", "codes"):
        cache = CompressedCache(make, model.config.num_hidden_layers, buffer_length=4, chunk=2, attention=attention)
        with torch.no_grad(), scope(model, attention):
            model(input_ids=ids[:, :-6], past_key_values=cache, use_cache=True)
            logits[attention] = torch.cat([model(input_ids=ids[:, t:t + 1], past_key_values=cache).logits
                                           for t in range(ids.shape[1] - 6, ids.shape[1])], 1)
    assert torch.allclose(logits["dense"], logits["codes"], atol=1e-4)


def test_sparsity_at_or_above_head_dim_stops_early_without_nan(setup):
    model, _, hd, ids = setup
    d = torch.nn.functional.normalize(torch.randn(hd, 64), dim=0)
    for fp8 in (False, True):
        cache = CompressedCache(lambda i, fp8=fp8: LexicoCodec(d, d, hd + 4, fp8=fp8), model.config.num_hidden_layers,
                                buffer_length=4)
        with torch.no_grad():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            keys = cache.layers[0].codec.decode_keys(cache.layers[0].key_codes, torch.float32)
        assert torch.isfinite(out.logits).all() and torch.isfinite(keys).all()
        assert cache.layers[0].key_codes[0].shape[-1] == hd  # no slot stored past head_dim


def test_kivi_codec_round_trip_error_shrinks_with_bits():
    x = torch.randn(1, 2, 64, 32)
    errs = []
    for b in (2, 4, 8):
        codec = KIVICodec(b)
        k = codec.decode_keys(codec.encode_keys(x), torch.float32)
        v = codec.decode_values(codec.encode_values(x), torch.float32)
        errs.append((float((k - x).norm() / x.norm()), float((v - x).norm() / x.norm())))
    assert errs[0][0] > errs[1][0] > errs[2][0] and errs[0][1] > errs[1][1] > errs[2][1] and errs[2][0] < 0.01


def test_dictionary_for_another_model_or_damaged_file_is_exit_2(cli, tmp_path):
    r = cli("--json", "train", "--method", "lexico", "--model", "ref:llama-test", "--set", "atoms=32", "--set", "steps=3",
            "--set", "windows=4", "--set", "held_out_windows=2", "-o", tmp_path / "t")
    assert r.code == 0, r.err
    path = r.json()["stages"][0]["metrics"]["dictionary"]
    ok = cli("--json", "decode", "--method", "lexico", "--model", "ref:llama-test", "--set", f"dictionary={path}",
             "--set", "windows=1", "--set", "context_len=48", "--set", "continuation_len=8", "--set", "generate_tokens=4",
             "--set", "buffer_length=8", "--set", "recall_cue=8", "--set", "recall_tokens=4", "-o", tmp_path / "d")
    assert ok.code == 0, ok.err
    metrics = ok.json()["stages"][0]["metrics"]
    assert 0 < metrics["kv_memory_fraction"] < metrics["kv_memory_fraction_with_dictionaries"]
    assert metrics["dictionary_bytes"] >= 2 * 2 * 16 * 32 * 4  # K and V, 2 layers, head_dim 16, 32 atoms, float32
    for key, dictionaries in (("with_dictionaries", 1), ("amortised", metrics["amortize_batch"])):
        assert metrics[f"kv_memory_fraction_{key}"] == pytest.approx(
            (metrics["stored_bytes"] + metrics["dictionary_bytes"] / dictionaries) / metrics["full_fp16_bytes"])
    assert metrics["peak_bytes"] >= metrics["stored_bytes"]
    other = cli("decode", "--method", "lexico", "--model", "ref:opt-test", "--set", f"dictionary={path}", "-o", tmp_path / "x")
    assert other.code == 2 and "learned for another model" in other.err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    broken = cli("decode", "--method", "lexico", "--model", "ref:llama-test", "--set", f"dictionary={bad}", "-o", tmp_path / "x")
    assert broken.code == 2 and "not a readable Lexico dictionary" in broken.err
    unfit = cli("decode", "--method", "kivi", "--model", "ref:llama-test", "--set", "context_len=40", "--set",
                "recall_tokens=8", "-o", tmp_path / "x")
    assert unfit.code == 2 and "recall_cue" in unfit.err
    assert not (tmp_path / "x").exists() or list((tmp_path / "x").iterdir()) == []


def test_window_eviction_keeps_sinks_and_recent_tokens_with_absolute_positions(setup):
    model, _, hd, ids = setup
    cache = WindowCache(model.config.num_hidden_layers, window=6, sinks=2)
    out = model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=cache, pad_token_id=0)
    assert cache.get_seq_length() == out.shape[1] - 1
    assert all(layer.keys.shape[-2] == 8 for layer in cache.layers)
    big = WindowCache(model.config.num_hidden_layers, window=1000, store_dtype=None)  # nothing evicted: the full cache
    ref = model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=DynamicCache(), pad_token_id=0)
    assert torch.equal(model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=big, pad_token_id=0), ref)


@pytest.mark.parametrize("method,extra", [("kivi", ["group=8"]), ("kv-window", ["window=12"])])
def test_the_per_window_items_average_to_the_stage_figures(cli, tmp_path, method, extra):
    """``windows.jsonl`` (the items ``llmx compare lexico`` pairs): one row per held-out window whose means are the
    stage's KL, agreement, accuracy and perplexity."""
    import json
    import math
    from pathlib import Path

    sets = ["windows=3", "context_len=48", "continuation_len=8", "generate_tokens=4", "buffer_length=8",
            "recall_cue=8", "recall_tokens=4", *extra]
    r = cli("--json", "decode", "--method", method, "--model", "ref:llama-test",
            *[a for s in sets for a in ("--set", s)], "-o", tmp_path)
    assert r.code == 0, r.err
    out = r.json()
    metrics = out["stages"][0]["metrics"]
    rows = [json.loads(x) for x in (Path(out["run_dir"]) / "artifacts" / f"0_{method}" / "windows.jsonl")
            .read_text().splitlines()]
    assert [row["window"] for row in rows] == [0, 1, 2] and all(row["tokens"] == 8 for row in rows)
    assert all(isinstance(row["item"], str) for row in rows) and len({row["item"] for row in rows}) == 3

    def mean(key):
        return sum(row[key] for row in rows) / len(rows)

    for key in ("kl_to_full", "top1_agreement", "next_token_accuracy", "greedy_agreement", "recall_accuracy",
                "recall_accuracy_full_cache"):
        assert mean(key) == pytest.approx(metrics[key], rel=1e-9, abs=1e-12), key
    assert math.exp(mean("nll")) == pytest.approx(metrics["perplexity"], rel=1e-9)
    assert math.exp(mean("nll_full_cache")) == pytest.approx(metrics["perplexity_full_cache"], rel=1e-9)


def test_the_window_items_depend_on_the_windows_not_the_cache(cli, tmp_path):
    """Each row's ``item`` digests the window (start, context length, tokens): KIVI and a sliding window score the
    same items; another context length cuts other windows."""
    import json
    from pathlib import Path

    def items(method, *sets):
        sets = ("windows=2", "continuation_len=8", "generate_tokens=0", "recall_tokens=0", *sets)
        r = cli("--json", "decode", "--method", method, "--model", "ref:llama-test",
                *[a for s in sets for a in ("--set", s)], "-o", tmp_path / method / sets[-1])
        assert r.code == 0, r.err
        path = Path(r.json()["run_dir"]) / "artifacts" / f"0_{method}" / "windows.jsonl"
        return [json.loads(x)["item"] for x in path.read_text().splitlines()]

    kivi = items("kivi", "group=8", "context_len=48")
    assert len(set(kivi)) == 2 and items("kv-window", "window=12", "context_len=48") == kivi
    assert not set(items("kivi", "group=8", "context_len=40")) & set(kivi)


@pytest.mark.parametrize("codec", ["lexico", "kivi"])
def test_two_models_decoding_interleaved_decode_as_each_alone(setup, codec):
    """A second model steps inside the first's every step, between the first's cache update and its attention (the
    finest interleaving two threads can produce), both attending over codes: each decodes what it decodes alone. The
    state of handed-out codes is each cache's own (a process-wide record keyed by layer index collided here)."""
    llama, tok, hd, ids = setup
    qwen = models.load("ref:qwen2-test")[0]
    d = torch.nn.functional.normalize(torch.randn(hd, 64, generator=torch.Generator().manual_seed(3)), dim=0)

    def make(model):
        codec_for = (lambda i: LexicoCodec(d, d, 4)) if codec == "lexico" else (lambda i: KIVICodec(2, 4))
        return CompressedCache(codec_for, model.config.num_hidden_layers, buffer_length=4, chunk=2, attention="codes")

    def greedy(model, cache, steps: int = 8):
        """Tokens decoded one at a time; yields after each step."""
        tokens = ids
        for _ in range(steps):
            step = tokens if tokens is ids else tokens[:, -1:]
            nxt = model(input_ids=step, past_key_values=cache).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
            yield tokens

    with torch.no_grad(), over_codes(llama), over_codes(qwen):
        alone = {name: list(greedy(m, make(m)))[-1] for name, m in (("llama", llama), ("qwen", qwen))}
        first, second = make(llama), make(qwen)
        inner = greedy(qwen, second)
        layer0, seen = first.layers[0], []

        def update_then_step_the_other(*args, **kwargs):
            out = type(layer0).update(layer0, *args, **kwargs)
            seen.append(next(inner, None))
            return out

        layer0.update = update_then_step_the_other
        outer = list(greedy(llama, first))[-1]
    assert torch.equal(outer, alone["llama"]) and torch.equal(seen[-1], alone["qwen"])
