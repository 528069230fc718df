"""FoPE (Hua et al., ICML 2025): the kept frequencies, the Fourier tables, the step-eye init, RoPE as an exact
special case, GQA tables, ALiBi, length extension, storage, the length evaluation and the CLI."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from llmx.core.train.stage import trainable
from llmx.plugins.fope import attention, ops, position
from llmx.plugins.fope.length import buckets


def llama(heads=4, kv=2, hidden=64, layers=2, attn="sdpa", seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=512)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


def ids(n=40, batch=2, seed=1):
    return torch.randint(0, 97, (batch, n), generator=torch.Generator().manual_seed(seed))


def fope(train_len=32, **kw):
    return attention.Settings(strategy="fope", train_len=train_len, **kw)


def test_head_dim_64_at_train_len_64_keeps_exactly_nine_frequencies_and_zeroes_the_rest():
    clipped = position.kept_frequencies(64, 1e4, 64, floor_clip=True, ignore_zero=False)
    base = position.base_frequencies(64, 1e4)
    assert (clipped != 0).sum() == 9 and torch.equal(clipped[:9], base[:9])
    assert torch.equal(clipped[9:], torch.zeros(23))  # to zero, not to the floor value
    assert bool((base[9:] < 2 * math.pi / 64).all()) and bool((base[:9] >= 2 * math.pi / 64).all())
    assert torch.equal(position.kept_frequencies(64, 1e4, 64), base[:9])
    assert position.output_dims(9, 64, None, True) == 9 and position.output_dims(40, 64, None, True) == 16


def test_identity_coefficients_over_every_dim_without_clipping_reproduce_rope():
    model = llama()
    x = ids()
    before = model(input_ids=x).logits
    attention.convert(model, fope(floor_clip=False, ignore_zero=False, sigma=0.0), 0, "test")
    after = model(input_ids=x).logits
    assert torch.allclose(before, after, atol=1e-5, rtol=0)
    changed = llama()
    attention.convert(changed, fope(floor_clip=False, ignore_zero=False, sigma=0.3), 0, "test")
    assert not torch.allclose(before, changed(input_ids=x).logits, atol=1e-3)


def test_padding_dims_carry_sin_and_cos_one():
    freqs = position.kept_frequencies(32, 1e4, 64)
    shape = (2, len(freqs), position.output_dims(len(freqs), 32, None, True))
    a_s, a_c = position.init_coefficients(shape, 0.3), position.init_coefficients(shape, 0.3)
    cos, sin = position.fourier_tables(torch.arange(50)[None], freqs, a_s, a_c, 32)
    d_out = shape[2]
    for half in (slice(d_out, 16), slice(16 + d_out, 32)):
        assert torch.equal(cos[..., half], torch.ones_like(cos[..., half]))
        assert torch.equal(sin[..., half], torch.ones_like(sin[..., half]))
    assert not torch.equal(sin[..., :d_out], torch.ones_like(sin[..., :d_out]))
    assert torch.equal(cos[..., :16], cos[..., 16:])  # the half-split layout


def test_init_is_the_step_eye_plus_xavier_noise_of_gain_sigma():
    shape = (8, 24, 8)
    eye = position.step_eye(shape)
    assert torch.equal(eye[3, ::3, :], torch.eye(8)) and eye.sum() == 8 * 8  # step = ceil(24 / 8) = 3
    assert torch.equal(position.init_coefficients(shape, 0.0), eye)
    noise = position.init_coefficients(shape, 0.6, torch.Generator().manual_seed(0)) - eye
    expected = 0.6 * math.sqrt(2.0 / (24 * 8 + 8 * 8))  # torch's fans of a 3-D tensor, as the official call
    assert abs(float(noise.std()) / expected - 1) < 0.1


def test_coefficients_differ_per_head_and_per_layer_and_stay_out_of_the_optimiser():
    model = llama(layers=3)
    layers = attention.convert(model, fope(train_len=64), 0, "test")
    a = [m.fope_sin for m in layers]
    assert a[0].shape[0] == 2  # one table per KV head
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0][0], a[0][1])
    assert not torch.equal(layers[0].fope_sin, layers[0].fope_cos)  # separate sin and cos bases
    assert not any("fope" in n for n in trainable(model))
    learn = llama()
    attention.convert(learn, fope(learnable=True), 0, "test")
    assert sum("fope" in n for n in trainable(learn)) == 4


def test_query_heads_read_their_kv_heads_table():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 10, 16, generator=g), torch.randn(1, 2, 10, 16, generator=g)
    freqs = position.kept_frequencies(16, 1e4, 8, floor_clip=False)
    a_s = position.init_coefficients((2, len(freqs), 4), 0.5, g)
    a_c = position.init_coefficients((2, len(freqs), 4), 0.5, g)
    pos = torch.arange(10)[None]
    qo, ko = ops.fope_rotate_reference(q, k, pos, freqs, a_s, a_c)
    cos, sin = position.fourier_tables(pos, freqs, a_s, a_c, 16)
    for h in range(4):
        assert torch.allclose(qo[:, h], position.rotate(q[:, h], cos[:, h // 2], sin[:, h // 2]))
    assert torch.allclose(ko, position.rotate(k, cos, sin))


@pytest.mark.parametrize("strategy", ["fope", "alibi"])
def test_cached_decoding_equals_the_full_forward(strategy):
    model = llama()
    attention.convert(model, attention.Settings(strategy=strategy, train_len=16), 0, "test")
    x = ids(24, batch=1)
    full = model(input_ids=x).logits
    out = model(input_ids=x[:, :10], use_cache=True)
    steps = [out.logits]
    cache = out.past_key_values
    for t in range(10, 24):
        out = model(input_ids=x[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-4, rtol=0)


def test_alibi_biases_the_scores_as_the_paper_and_matches_across_attention_implementations():
    slopes = position.alibi_slopes(8)
    assert torch.allclose(slopes, torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert torch.allclose(position.alibi_slopes(6), torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1,
                                                                  2 ** -3]))
    x = ids()
    sdpa, eager = llama(attn="sdpa"), llama(attn="eager")
    for m in (sdpa, eager):
        attention.convert(m, attention.Settings(strategy="alibi", train_len=16), 0, "test")
    assert torch.allclose(sdpa(input_ids=x).logits, eager(input_ids=x).logits, atol=1e-5)
    layer = sdpa.model.layers[0].self_attn
    q = torch.zeros(1, 4, 5, 16)
    bias = layer._alibi(None, q, 5)[0]
    assert float(bias[1, 4, 2]) == pytest.approx(-float(position.alibi_slopes(4)[1]) * 2)  # head 1, i - j = 2
    assert float(bias[0, 1, 3]) == torch.finfo(torch.float32).min  # causal
    rope = llama()
    assert not torch.allclose(rope(input_ids=x).logits, sdpa(input_ids=x).logits, atol=1e-3)


def test_extension_keeps_the_old_block_bitwise_and_grows_with_the_floor():
    model = llama(heads=2, kv=2, hidden=128)  # head_dim 64
    layers = attention.convert(model, fope(train_len=64), 0, "test")
    old = layers[0].fope_sin.detach().clone()
    attention.expand(layers[0], 256, torch.Generator().manual_seed(1))
    new = layers[0].fope_sin
    assert old.shape == (2, 9, 9) and new.shape == (2, 13, 13)
    assert torch.equal(new[:, :9, :9], old)
    assert torch.equal(layers[0].fope_freqs[:9], position.kept_frequencies(64, 1e4, 64))
    assert not new.requires_grad
    with pytest.raises(Exception, match="shorter"):
        attention.expand(layers[0], 128)


@pytest.mark.parametrize("strategy", ["fope", "alibi"])
def test_a_converted_model_reloads_with_identical_logits(tmp_path, strategy):
    from llmx.core import models
    from llmx.core.tokenizer import byte_tokenizer

    model = llama()
    attention.convert(model, attention.Settings(strategy=strategy, train_len=32), 0, "test")
    models.save(model, byte_tokenizer(), tmp_path / "m")
    loaded, _ = models.load(str(tmp_path / "m"))
    x = ids()
    assert torch.equal(model(input_ids=x).logits, loaded(input_ids=x).logits)
    if strategy == "fope":
        assert loaded.model.layers[1].self_attn.fope_sin.dtype == torch.float32


def test_qwen2_with_biases_and_gqa_converts():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(cfg).eval()
    x = ids()
    before = model(input_ids=x).logits
    twin = copy.deepcopy(model)
    attention.convert(twin, fope(floor_clip=False, ignore_zero=False, sigma=0.0), 0, "test")
    assert torch.allclose(before, twin(input_ids=x).logits, atol=1e-5, rtol=0)


def test_length_buckets_tile_every_scored_token_once():
    for t, length in [(64, 512), (32, 100), (16, 16)]:
        covered = [i for lo, hi in buckets(t, length) for i in range(lo, hi)]
        assert covered == list(range(length - 1))
    assert buckets(64, 512)[:4] == [(0, 64), (64, 128), (128, 256), (256, 511)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernel_matches_the_reference_forward_and_backward():
    from llmx.core import kernels

    assert kernels.available(), "CuPy with a CUDA device is needed for this test"
    g = torch.Generator().manual_seed(0)
    freqs = position.kept_frequencies(128, 1e4, 64)
    a_s = position.init_coefficients((4, len(freqs), 32), 0.4, g).cuda()
    a_c = position.init_coefficients((4, len(freqs), 32), 0.4, g).cuda()
    q = torch.randn(2, 16, 300, 128, generator=g).cuda().requires_grad_()
    k = torch.randn(2, 4, 300, 128, generator=g).cuda().requires_grad_()
    pos = torch.arange(7, 307).cuda().expand(2, -1)
    f = freqs.cuda()
    qo, ko = ops.fope_rotate(q, k, pos, f, a_s, a_c)
    qr, kr = ops.fope_rotate_reference(q, k, pos, f, a_s, a_c)
    assert torch.allclose(qo, qr, atol=1e-4) and torch.allclose(ko, kr, atol=1e-4)
    gq, gk = torch.randn_like(qo), torch.randn_like(ko)
    kernel_grads = torch.autograd.grad((qo * gq).sum() + (ko * gk).sum(), (q, k))
    reference_grads = torch.autograd.grad((qr * gq).sum() + (kr * gk).sum(), (q, k))
    for a, b in zip(kernel_grads, reference_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4)
    half_q, half_k = q.detach().bfloat16(), k.detach().bfloat16()
    hq, hk = ops.fope_rotate(half_q, half_k, pos, f, a_s, a_c)
    rq, rk = ops.fope_rotate_reference(half_q, half_k, pos, f, a_s, a_c)
    assert hq.dtype == torch.bfloat16 and torch.allclose(hq.float(), rq.float(), atol=2e-2, rtol=1e-2)
    assert torch.allclose(hk.float(), rk.float(), atol=2e-2, rtol=1e-2)


def _train(cli, out, *sets, model="ref:llama-test"):
    args = ["train", "--method", "fope", "--model", model, "--set", "steps=2", "--set", "warmup=1",
            "--set", "batch_size=2", "--set", "max_tokens=8000", "--set", "eval_windows=2", "--set", "eval_every=2"]
    return cli(*args, *[a for s in sets for a in ("--set", s)], "-o", out, "--json")


def test_cli_extension_grows_the_coefficients_and_keeps_the_trained_block(cli, tmp_path):
    from llmx.core import models

    first = _train(cli, tmp_path / "a", "train_len=32")
    assert first.code == 0, first.err
    folder = first.json()["stages"][0]["metrics"]["model_dir"]
    before, _ = models.load(folder)
    longer = cli("train", "--method", "fope", "--model", folder, "--set", "init=continue", "--set", "train_len=128",
                 "--set", "steps=1", "--set", "warmup=0", "--set", "batch_size=1", "--set", "max_tokens=8000",
                 "--set", "eval_windows=2", "--set", "eval_every=1", "-o", tmp_path / "b", "--json")
    assert longer.code == 0, longer.err
    metrics = longer.json()["stages"][0]["metrics"]
    after, _ = models.load(metrics["model_dir"])
    old, new = before.model.layers[0].self_attn.fope_sin, after.model.layers[0].self_attn.fope_sin
    assert (old.shape[1], new.shape[1]) == (2, 3) and metrics["frequencies_kept"] == 3  # head_dim 16: 2 pi / T floor
    assert torch.equal(new[:, :2, :old.shape[2]], old)
    untouched = LlamaForCausalLM(before.config)  # frozen: the trained model's coefficients are its seed-0 init
    attention.convert(untouched, attention.Settings(**before.model.layers[0].self_attn.settings.__dict__), 0, "x")
    assert torch.equal(untouched.model.layers[0].self_attn.fope_sin, old)
    changed = cli("train", "--method", "fope", "--model", folder, "--set", "init=continue", "--set", "sigma=0",
                  "--set", "steps=1", "-o", tmp_path / "c")
    assert changed.code == 2 and "sigma 0.3" in changed.err


def test_cli_yarn_changes_long_windows_of_a_rope_model(cli, tmp_path):
    base = ["eval", "--method", "length", "--model", "ref:llama-test", "--set", "lengths=[64,256]", "--set",
            "windows=2", "--set", "copy_samples=2", "-o", tmp_path, "--json"]
    plain, yarn = cli(*base), cli(*base, "--set", "yarn_factor=4")
    assert plain.code == 0 and yarn.code == 0, plain.err + yarn.err
    p, y = plain.json()["stages"][0]["metrics"], yarn.json()["stages"][0]["metrics"]
    assert p["train_len"] == 64 and y["yarn_factor"] == 4
    assert p["ppl@256"] != y["ppl@256"]


def test_yarn_is_undone_after_the_evaluation():
    from llmx.plugins.fope.length import yarn

    model = llama()
    x = ids(200, batch=1)
    before, saved = model(input_ids=x).logits, dict(model.config.rope_parameters)
    with yarn(model, 4.0, 32, attention_factor=1.0):
        assert model.config.rope_parameters["rope_type"] == "yarn"
        assert model.model.rotary_emb.attention_scaling == 1.0
        during = model(input_ids=x).logits
    with yarn(model, 4.0, 32):
        assert model.model.rotary_emb.attention_scaling == pytest.approx(1 + 0.1 * math.log(4))
    assert not torch.allclose(before, during, atol=1e-3)
    assert torch.equal(model(input_ids=x).logits, before) and model.config.rope_parameters == saved
    converted = llama()
    attention.convert(converted, fope(), 0, "test")
    with pytest.raises(Exception, match="RoPE model"), yarn(converted, 4.0, 32):
        pass


class Copier(torch.nn.Module):
    """Predicts the token ``distance`` back with certainty (a perfect copier at one distance)."""

    def __init__(self, distance: int, vocab: int = 97):
        super().__init__()
        self.distance, self.vocab = distance, vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, use_cache=False):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        shift = self.distance - 1  # position t predicts token t + 1 - distance; uniform before the sequence starts
        if shift < input_ids.shape[1]:
            logits[:, shift:].scatter_(-1, input_ids[:, :input_ids.shape[1] - shift, None], 50.0)
        return type("Out", (), {"logits": logits})()


def test_copy_probe_scores_the_repeat_after_its_first_token():
    from llmx.plugins.fope.config import LengthParams
    from llmx.plugins.fope.length import _copy_probe

    stream = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0))
    p = LengthParams(copy_len=8, copy_distances=[16, 48], copy_samples=4)
    right = _copy_probe(Copier(48), stream, p, 32, 256)
    assert right["48"] < 1e-6 and right["16"] == pytest.approx(math.log(97), abs=1e-4)  # 48 back: nothing at 16
    assert _copy_probe(Copier(47), stream, p, 32, 256)["48"] > 10  # one token off: the repeat is not what is scored
    with pytest.raises(Exception, match="too few"):
        _copy_probe(Copier(48), stream[:150], p, 32, 256)


def test_tables_stay_float32_under_bf16_autocast_and_casts():
    model = llama()
    layers = attention.convert(model, fope(), 0, "test")
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    pos = torch.arange(8)[None]
    m = layers[0]
    exact = ops.fope_rotate_reference(q, k, pos, m.fope_freqs, m.fope_sin, m.fope_cos)
    with torch.autocast("cpu", torch.bfloat16):
        inside = ops.fope_rotate_reference(q, k, pos, m.fope_freqs, m.fope_sin, m.fope_cos)
    assert inside[0].dtype == torch.float32 and torch.equal(inside[0], exact[0])
    coef, freqs = m.fope_sin.detach().clone(), m.fope_freqs.clone()
    model.to(torch.bfloat16)
    assert m.fope_sin.dtype == torch.float32 and torch.equal(m.fope_sin, coef)
    assert m.fope_freqs.dtype == torch.float32 and torch.equal(m.fope_freqs, freqs)
    assert m.q_proj.weight.dtype == torch.bfloat16


def test_alibi_with_left_padding_matches_across_attention_implementations():
    x = ids(20)
    mask = torch.ones_like(x)
    mask[0, :5] = 0
    outs = []
    for attn in ("sdpa", "eager"):
        m = llama(attn=attn)
        attention.convert(m, attention.Settings(strategy="alibi", train_len=16), 0, "test")
        outs.append(m(input_ids=x, attention_mask=mask).logits)
    assert torch.allclose(outs[0][0, 5:], outs[1][0, 5:], atol=1e-5) and torch.allclose(outs[0][1], outs[1][1],
                                                                                         atol=1e-5)
    alone = m(input_ids=x[:1, 5:]).logits[0]  # the padded row is the same text without its padding
    assert torch.allclose(outs[1][0, 5:], alone, atol=1e-5)


def test_alibi_is_refused_where_the_attention_cannot_take_a_bias():
    model = llama()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(Exception, match="cannot take"):
        attention.convert(model, attention.Settings(strategy="alibi", train_len=16), 0, "test")
    later = llama()
    attention.convert(later, attention.Settings(strategy="alibi", train_len=16), 0, "test")
    later.config._attn_implementation = "flash_attention_2"  # switched after conversion
    with pytest.raises(Exception, match="cannot take"):
        later(input_ids=ids())


@pytest.mark.parametrize("how,words", [
    (("--model", "tiny:gpt2"), "Llama-family"),
    (("--set", "train_len=2"), "keeps no frequency"),
    (("--set", "position=rope", "--set", "learnable=true"), "learnable"),
    (("--set", "seq_len=64", "--set", "train_len=32"), "differs from train_len"),
])
def test_bad_training_input_is_one_line_exit_2_without_a_run_folder(cli, tmp_path, how, words):
    model = [] if "--model" in how else ["--model", "ref:llama-test"]
    r = cli("train", "--method", "fope", *model, *how, "--set", "steps=1", "--set", "max_tokens=4000",
            "-o", tmp_path / "runs")
    assert r.code == 2 and words in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_lengths_shorter_than_the_training_length_are_exit_2(cli, tmp_path):
    r = cli("eval", "--method", "length", "--model", "ref:llama-test", "--set", "lengths=[32,64]", "-o",
            tmp_path / "runs")
    assert r.code == 2 and "shorter than the training length 64" in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_length_writes_one_item_per_longest_window_that_agrees_with_its_perplexity(cli, tmp_path):
    """The items ``llmx compare fope`` pairs: each window at the longest length, whose NLLs average to the stage's
    ``nll`` (log of ppl at that length), each with its NLL beyond T and that minus its NLL within T."""
    import json
    from pathlib import Path

    r = cli("eval", "--method", "length", "--model", "ref:llama-test", "--set", "lengths=[64,256]", "--set",
            "windows=3", "--set", "copy_samples=2", "-o", tmp_path, "--json")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    rows = [json.loads(x) for x in next(Path(tmp_path).glob("*/artifacts/0_length/windows.jsonl")).read_text().splitlines()]
    assert len(rows) == 3 and all(row["tokens"] == 255 for row in rows)
    assert sum(row["nll"] for row in rows) / 3 == pytest.approx(m["nll"]) == pytest.approx(math.log(m["ppl@256"]))
    within = [(row["nll"] * 255 - row["nll_beyond"] * 191) / 64 for row in rows]  # 64 predictions within T = 64
    expected = [row["nll_beyond"] - w for row, w in zip(rows, within, strict=True)]
    assert [row["degradation"] for row in rows] == pytest.approx(expected, abs=1e-5)
    ids = [row["item"] for row in rows]  # what each window scores: its start and tokens, not the model
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == 3

    def items(out, *sets):
        r = cli("eval", "--method", "length", "--model", "ref:llama-test", "--set", "windows=3", "--set",
                "copy_samples=2", *[a for s in sets for a in ("--set", s)], "-o", tmp_path / out, "--json")
        assert r.code == 0, r.err
        path = next((tmp_path / out).glob("*/artifacts/0_length/windows.jsonl"))
        return [json.loads(x)["item"] for x in path.read_text().splitlines()]

    assert items("yarn", "lengths=[64,256]", "yarn_factor=2.0") == ids  # another model, the same windows
    assert not set(items("shorter", "lengths=[64,128]")) & set(ids)
