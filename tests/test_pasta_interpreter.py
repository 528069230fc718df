"""The Pasta-Lang interpreter on scripted (forced) token streams through a tiny 4-layer RoPE Llama (notes §5): steps
equal the critical path, the cache holds each position once with layer-0 keys equal to a sequential run's, the
teacher-forced threads give the Pasta-SFT forward's logits, and with no tag emitted it is greedy ``generate``.
Attention from the visibility tables: their dense mask is the rule, the ``segments`` path (AttentionInterface; the
SDPA reference on CPU) decodes exactly as the ``mask`` path, and on a GPU the CuPy kernel equals the reference."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from llmx.core import kernels
from llmx.core.tokenizer import byte_tokenizer
from llmx.plugins.pasta import annotate, lang, layout
from llmx.plugins.pasta import attention as A
from llmx.plugins.pasta import interpreter as I


@pytest.fixture(scope="module")
def kit():
    tok = byte_tokenizer()
    tags = lang.equip(tok)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).eval()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return model, tok, tags, enc


def scripted(kit, chunk_lengths=(48, 40, 56), intro=12, middle=10, outro=12):
    """The notes' stream: intro, three promises (each with its chunk inline), middle text, <sync/>, outro."""
    model, tok, tags, enc = kit
    resp = enc("a" * intro)
    for k, n in enumerate(chunk_lengths):
        resp += enc(lang.promise_tag(f"t{k}", n)) + [tags[lang.ASYNC_OPEN]] + enc("x" * (n - 2)) + [tags[lang.ASYNC_CLOSE]]
    resp += enc("b" * middle) + [tags[lang.SYNC]] + enc("c" * outro)
    return enc("def f"), resp


def interpret(kit, prompt, resp, opts=None, keep_logits=False):
    model, tok, tags, _ = kit
    lay = layout.build(prompt, resp, tags, tok.decode, eos=tok.eos_token_id)
    main, chunks = lay.script()
    forced = I.Forced(main[:-1], chunks, tok.eos_token_id, tags[lang.ASYNC_CLOSE])  # EOS ends it, never fed
    return lay, I.run(model, prompt, tags, tok.decode, tok.eos_token_id, opts, forced, keep_logits)


def critical_path(kit, lay: layout.Layout, serial: bool = False) -> int:
    """Steps by hand: main token i is fed at step i+1; a chunk of n tokens forked at the step its promise's last
    token is fed (f) ends at f+n-1 (``serial``: it starts the step after the previous chunk ends); ``<sync/>`` is
    fed once the main stream reaches it and every chunk has ended, then the rest of the main stream follows."""
    tags = kit[2]
    main, chunks = lay.script()
    main = main[:-1]  # EOS ends the main thread; it is never fed
    forks = [i + 1 for i, t in enumerate(main) if t == tags[lang.PROMISE_CLOSE]]
    sync = main.index(tags[lang.SYNC])
    end = 0
    for f, c in zip(forks, chunks, strict=True):
        end = (max(f, end + 1) if serial else f) + len(c) - 1 if serial else max(end, f + len(c) - 1)
    return max(sync + 1, end + 1) + len(main) - 1 - sync


def sequential_keys(model, ids, positions):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([positions]), past_key_values=cache,
              use_cache=True)
    return cache.layers[0].keys[0]


def test_steps_equal_the_critical_path_and_the_cache_matches_a_sequential_run(kit):
    model = kit[0]
    prompt, resp = scripted(kit)
    lay, r = interpret(kit, prompt, resp)
    assert r.errors == [] and r.response == resp and r.tokens == len(resp)
    # by hand: 56 main tokens (12 + 3 promises of 7 tokens + 10 + <sync/> + 12); promises close at steps 19, 26, 33;
    # chunks of 48, 40, 56 end at 66, 65, 88; <sync/> at 89; 12 more: 101 steps against 200 sequential
    assert r.steps == critical_path(kit, lay) == 101 and len(resp) == 200
    assert max(r.active) == 4  # the main thread and three chunks in one forward
    assert sorted(r.slot_positions) == list(range(len(prompt) + len(resp)))  # each position once: oracle lengths
    full = prompt + resp
    seq = sequential_keys(model, full, list(range(len(full))))
    got = r.cache.layers[0].keys[0]
    assert torch.allclose(got, seq[:, torch.tensor(r.slot_positions)], atol=1e-5)
    assert [full[p] for p in r.slot_positions] == r.slot_tokens  # the splice: every slot holds its position's token


def test_serial_threads_and_wrong_positions_fail_the_checks(kit, monkeypatch):
    model = kit[0]
    prompt, resp = scripted(kit)
    _, right = interpret(kit, prompt, resp)
    lay, serial = interpret(kit, prompt, resp, I.Options(max_threads=1))
    assert serial.steps == critical_path(kit, lay, serial=True) > critical_path(kit, lay)  # one thread at a time costs steps
    full = prompt + resp
    seq = sequential_keys(model, full, list(range(len(full))))
    _, no_skip = interpret(kit, prompt, resp, I.Options(positions="fixed", fixed_tokens=0))
    assert sorted(no_skip.slot_positions) != list(range(len(full)))  # the main stream overlaps the chunks

    class Restart(I.Thread):  # a thread that starts its positions at 0
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.index:
                self.next_pos = 0

    monkeypatch.setattr(I, "Thread", Restart)
    _, restart = interpret(kit, prompt, resp)
    want = seq[:, torch.tensor(right.slot_positions)]  # the same schedule puts the same token in each slot
    assert torch.allclose(right.cache.layers[0].keys[0], want, atol=1e-5)
    for bad in (no_skip, restart):
        assert bad.slot_tokens == right.slot_tokens
        assert not torch.allclose(bad.cache.layers[0].keys[0], want, atol=1e-3)


def test_oracle_and_fixed_positions_and_logged_length_gaps(kit):
    prompt, resp = scripted(kit)
    lay, oracle = interpret(kit, prompt, resp, I.Options(positions="oracle", lengths=[48, 40, 56]))
    assert oracle.length_gaps == [0, 0, 0] and sorted(oracle.slot_positions) == list(range(len(lay.ids) - 1))
    _, fixed = interpret(kit, prompt, resp, I.Options(positions="fixed", fixed_tokens=32))
    assert fixed.promised == [32, 32, 32] and fixed.length_gaps == [16, 8, 24]
    assert fixed.steps == oracle.steps  # positions never change the schedule
    _, short = interpret(kit, prompt, resp, I.Options(positions="oracle", lengths=[48, 40]))
    assert short.errors == ["main: oracle-miss"] and short.promised == [48, 40, 56]  # an extra promise: predicted N


def test_a_thread_cap_queues_promises_and_keeps_the_cache_exact(kit):
    prompt, resp = scripted(kit)
    lay, r = interpret(kit, prompt, resp, I.Options(max_threads=2))
    assert max(r.active) == 3 and critical_path(kit, lay) < r.steps < critical_path(kit, lay, serial=True)
    assert r.response == resp and sorted(r.slot_positions) == list(range(len(lay.ids) - 1))


def test_teacher_forced_threads_give_the_pasta_sft_logits(kit):
    model, tok, tags, enc = kit
    rows, _ = annotate.build(enc, annotate.Options(limit=3))
    row = rows[0]
    prompt, resp = enc(row["prompt"]), enc(row["response"])
    lay, r = interpret(kit, prompt, resp, I.Options(max_chunk_tokens=2048, max_new_tokens=2048), keep_logits=True)
    assert r.errors == [] and r.response == resp and len(r.chunks) == row["chunks"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([lay.ids]), position_ids=torch.tensor([lay.positions]),
                       attention_mask=lay.visible()[None, None]).logits[0]
    main_at = [i for i in range(lay.prompt_len, len(lay.ids) - 1) if lay.stream[i] == layout.MAIN]
    assert torch.allclose(torch.stack(r.main_logits), logits[main_at], atol=1e-5)
    assert torch.allclose(r.prefill_logits, logits[lay.prompt_len - 1], atol=1e-5)
    for k, got in enumerate(r.chunk_logits, 1):
        at = [i for i, s in enumerate(lay.stream) if s == k]
        assert torch.allclose(torch.stack(got), logits[at], atol=1e-5)
    causal = model(input_ids=torch.tensor([lay.ids])).logits[0]
    assert not torch.allclose(causal[main_at], logits[main_at], atol=1e-3)  # the mask matters


def test_with_no_tag_it_is_greedy_generate(kit):
    model, tok, tags, enc = kit
    prompt = enc("class Point:\n")
    r = I.run(model, prompt, tags, tok.decode, tok.eos_token_id, I.Options(max_new_tokens=40))
    assert not set(r.main) & set(tags.values()) and r.chunks == [] and r.steps == len(r.main)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id)
    assert r.main == out[0, len(prompt):].tolist()


def test_malformed_tags_are_recorded_and_never_fork(kit):
    model, tok, tags, enc = kit
    bad = enc("ab") + enc('<promise topic="x" tokens="many"/>') + enc("cd")
    r = I.run(model, enc("p"), tags, tok.decode, tok.eos_token_id,
              choose=I.Forced(bad, [], tok.eos_token_id, tags[lang.ASYNC_CLOSE]))
    assert r.chunks == [] and r.errors == ["main: bad-count"] and r.main == bad
    nested = enc("a") + enc(lang.promise_tag("t", 6))
    inner = [tags[lang.ASYNC_OPEN]] + enc("xy") + [tags[lang.SYNC]]
    r = I.run(model, enc("p"), tags, tok.decode, tok.eos_token_id,
              choose=I.Forced(nested, [inner], tok.eos_token_id, tags[lang.ASYNC_CLOSE]))
    assert r.chunks[0][-1] == tags[lang.ASYNC_CLOSE] and "thread 1: tag-in-thread" in r.errors
    assert "main: no-sync" in r.errors


cupy = pytest.mark.skipif(not kernels.available(), reason="needs CuPy and a CUDA device")


def tables(t: int, s: int, owners: int, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    owner = torch.randint(0, owners, (s,), generator=g)
    limit = torch.randint(0, s + 1, (t, owners), generator=g)
    limit[:, 0] = torch.randint(1, s + 1, (t,), generator=g)
    owner[0] = 0  # every row sees slot 0 at least
    return owner.int().to(device), limit.int().to(device)


def test_the_tables_dense_mask_is_the_rule():
    owner, limit = tables(5, 40, 4)
    mask = A.dense(owner, limit)
    for t in range(5):
        for s in range(40):
            assert bool(mask[t, s]) == (s < int(limit[t, owner[s]]))


def test_the_reference_is_sdpa_with_gqa_on_the_dense_mask(monkeypatch):
    monkeypatch.setattr(kernels, "function", lambda *a: (_ for _ in ()).throw(AssertionError("kernel on CPU")))
    owner, limit = tables(3, 30, 3)
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(4, 3, 16, generator=g), torch.randn(2, 30, 16, generator=g), torch.randn(2, 30, 16, generator=g)
    out = A.segment_attention(q, k, v, owner, limit, 0.25)
    mask = A.dense(owner, limit)
    for h in range(4):
        kh = h // 2
        for t in range(3):
            w = torch.softmax((q[h, t] @ k[kh].T * 0.25).masked_fill(~mask[t], float("-inf")), -1)
            assert torch.allclose(out[t, h], w @ v[kh], atol=1e-5)


def test_segments_decode_exactly_as_the_mask(kit):
    prompt, resp = scripted(kit)
    _, masked = interpret(kit, prompt, resp, I.Options(), keep_logits=True)
    _, segments = interpret(kit, prompt, resp, I.Options(attention="segments"), keep_logits=True)
    assert segments.steps == masked.steps and segments.slot_positions == masked.slot_positions
    assert torch.allclose(torch.stack(segments.main_logits), torch.stack(masked.main_logits), atol=1e-5)
    for a, b in zip(segments.chunk_logits, masked.chunk_logits, strict=True):
        assert torch.allclose(torch.stack(a), torch.stack(b), atol=1e-5)
    assert kit[0].config._attn_implementation != A.NAME  # the model's own attention is restored


@pytest.mark.gpu
@cupy
@pytest.mark.parametrize("t,s,hq,hkv,d", [(1, 7, 4, 2, 16), (5, 300, 8, 2, 64), (9, 1500, 16, 4, 128)])
def test_the_kernel_matches_the_reference(t, s, hq, hkv, d):
    owner, limit = tables(t, s, 6, device="cuda")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(*shape, generator=g).cuda() for shape in ((hq, t, d), (hkv, s, d), (hkv, s, d)))
    got = A.segment_attention(q, k, v, owner, limit, d ** -0.5)
    want = A.reference(q, k, v, owner, limit, d ** -0.5)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    for name, fn in (("kernel", A.segment_attention), ("reference", A.reference)):
        fn(q, k, v, owner, limit, d ** -0.5)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn(q, k, v, owner, limit, d ** -0.5)
        torch.cuda.synchronize()
        print(f"pasta segment attention {name} t={t} s={s} hq={hq} d={d}: {(time.perf_counter() - t0) / 20 * 1e6:.1f} us")


@pytest.mark.gpu
@cupy
def test_the_interpreter_on_cuda_decodes_as_on_cpu(kit):
    model = kit[0]
    prompt, resp = scripted(kit)
    _, cpu = interpret(kit, prompt, resp, I.Options(), keep_logits=True)
    model.cuda()
    try:
        for how in ("mask", "segments"):
            _, gpu = interpret(kit, prompt, resp, I.Options(attention=how), keep_logits=True)
            assert gpu.steps == cpu.steps and gpu.response == cpu.response
            assert torch.allclose(torch.stack(gpu.main_logits), torch.stack(cpu.main_logits), atol=1e-3)
    finally:
        model.cpu()


def test_a_model_of_real_width_with_gqa_and_biases_decodes_as_its_sft_forward():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = byte_tokenizer()
    tags = lang.equip(tok)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=2048, intermediate_size=256, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2 attention carries biases
    wide = (model, tok, tags, lambda s: tok(s, add_special_tokens=False)["input_ids"])
    prompt, resp = scripted(wide, chunk_lengths=(9, 7), intro=3, middle=2, outro=3)
    for how in ("mask", "segments"):
        lay, r = interpret(wide, prompt, resp, I.Options(attention=how), keep_logits=True)
        assert r.steps == critical_path(wide, lay) and r.response == resp
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([lay.ids]), position_ids=torch.tensor([lay.positions]),
                           attention_mask=lay.visible()[None, None]).logits[0]
        main_at = [i for i in range(lay.prompt_len, len(lay.ids) - 1) if lay.stream[i] == layout.MAIN]
        assert torch.allclose(torch.stack(r.main_logits), logits[main_at], atol=1e-4)
        for k, got in enumerate(r.chunk_logits, 1):
            assert torch.allclose(torch.stack(got), logits[[i for i, s in enumerate(lay.stream) if s == k]], atol=1e-4)


def test_the_token_budget_ends_main_and_closes_open_chunks(kit):
    model, tok, tags, enc = kit
    prompt, resp = scripted(kit)
    _, r = interpret(kit, prompt, resp, I.Options(max_new_tokens=60))
    assert r.ended == "cap" and all(c[-1] == tags[lang.ASYNC_CLOSE] for c in r.chunks) and len(r.chunks) == 3
    assert "thread 1: chunk-cap" in r.errors and 60 <= r.tokens <= 60 + 2 * 3  # each open thread closes, and starts
    empty = I.run(model, enc("p"), tags, tok.decode, tok.eos_token_id,
                  choose=I.Forced([], [], tok.eos_token_id, tags[lang.ASYNC_CLOSE]))
    assert (empty.steps, empty.main, empty.ended) == (0, [], "eos")


def test_hybrid_recurrent_and_flash_attention_models_are_refused(kit):
    from types import SimpleNamespace as NS

    for cfg in (NS(num_attention_heads=4, model_type="jamba", layers_block_type=["mamba", "attention"]),
                NS(num_attention_heads=4, model_type="qwen2", layer_types=["full_attention", "sliding_attention"]),
                NS(num_attention_heads=None, model_type="mamba2")):
        with pytest.raises(lang.PastaSyntaxError, match="needs full attention"):
            I.require_attention(NS(config=cfg))
    I.require_attention(kit[0])
    flash = NS(config=NS(_attn_implementation="flash_attention_2"))
    with pytest.raises(lang.PastaSyntaxError, match="custom 4-D mask"):
        I.run(flash, [1, 2], kit[2], kit[1].decode, kit[1].eos_token_id)  # refused before any forward
