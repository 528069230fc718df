"""BlockDialect (arXiv 2501.01144): the formatbook, dialect selection against MXFP4 on synthetic and LLM-like blocks,
the block-format linear and attention, storage and the CLI's refusals."""

from __future__ import annotations

import pytest
import torch

from llmx.core.quant import blockapply, blockattn
from llmx.core.quant import blockfp as bf
from llmx.core.quant.blocklinear import BlockQuantLinear
from llmx.errors import UsageError
from llmx.plugins.blockdialect import formatbook
from llmx.plugins.blockdialect.config import BlockDialectParams
from llmx.plugins.blockdialect.method import formats

BOOK = formatbook.load("dialectfp4")
BD = bf.BlockFormat("blockdialect", BOOK, 32, select="two_stage")
BD_MSE = BD.with_(select="mse")


def _blocks(kind: str, n: int = 4096) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    size = (n, 32)
    if kind == "gaussian":
        return torch.randn(size, generator=g)
    if kind == "laplace":
        u = torch.rand(size, generator=g) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    if kind == "student_t3":
        z = torch.randn(size, generator=g)
        chi = (torch.randn(*size, 3, generator=g) ** 2).sum(-1)
        return z / torch.sqrt(chi / 3)
    channels = torch.exp(torch.randn(256, generator=g))  # LLM-like: log-normal channels, 1% outliers x30
    x = torch.randn(n * 32 // 256, 256, generator=g) * channels
    x = torch.where(torch.rand(x.shape, generator=g) < 0.01, 30 * x, x)
    return x.reshape(size)


def _rel_mse(x: torch.Tensor, fmt: bf.BlockFormat) -> float:
    return float(((x - bf.fake_quantize(x, fmt)) ** 2).sum() / (x**2).sum())


def test_dialectfp4_is_sixteen_half_unit_dialects_covering_every_max():
    assert len(BOOK) == 16 and all(len(d) == 8 for d in BOOK)
    assert all((2 * v).is_integer() and v <= 7.5 for d in BOOK for v in d)
    maxima = sorted(d[-1] for d in BOOK)
    assert maxima == sorted([m / 2 for m in range(8, 16)] * 2)  # 8 maxima x 2: the pairs of stage 1
    assert bf.E2M1 in BOOK


@pytest.mark.parametrize("kind", ["gaussian", "laplace", "student_t3", "llm_like"])
def test_blockdialect_beats_mxfp4_and_two_stage_is_close_to_exhaustive(kind):
    x = _blocks(kind)
    mx, two, full = _rel_mse(x, bf.mxfp4()), _rel_mse(x, BD), _rel_mse(x, BD_MSE)
    assert two <= 0.75 * mx, (kind, mx, two)
    assert full <= two <= 1.12 * full, (kind, two, full)


def test_exhaustive_selection_is_the_per_block_minimum():
    x = _blocks("gaussian", 512)
    best = ((x - bf.fake_quantize(x, BD_MSE)) ** 2).sum(-1)
    for d in range(16):
        one = bf.BlockFormat("one", (BOOK[d],), 32)
        err = ((x - bf.fake_quantize(x, one)) ** 2).sum(-1)
        assert bool((best <= err).all())


@pytest.mark.parametrize("select", ["mse", "two_stage"])
def test_a_formatbook_of_sixteen_e2m1_dialects_is_mxfp4_bit_for_bit(select):
    """Every dialect E2M1: the whole selection path (candidates, errors, gather) runs and must land on MXFP4."""
    x = _blocks("llm_like", 1024)
    cut = bf.BlockFormat("cut", (bf.E2M1,) * 16, 32, select=select)
    a, b = bf.quantize(x, cut), bf.quantize(x, bf.mxfp4())
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scale_code, b.scale_code)
    assert torch.equal(bf.dequantize(a, cut), bf.dequantize(b, bf.mxfp4()))
    assert int(a.table.max()) == 0  # ties go to the first table


@pytest.mark.parametrize("fmt", [BD, BD_MSE])
def test_every_value_is_an_integer_number_of_half_units_of_its_block(fmt):
    x = _blocks("student_t3", 1024)
    b = bf.quantize(x, fmt)
    k = bf.dequantize(b, fmt).reshape(-1, 32) / (0.5 * bf.block_scale(b, fmt).reshape(-1, 1))
    assert torch.equal(k, torch.round(k)) and int(k.abs().max()) <= 15
    assert torch.equal(k.to(torch.int32), bf.half_units(b, fmt).reshape(-1, 32))


@pytest.mark.parametrize("bad,needle", [([[0, 0.5, 1, 1.5, 2, 3, 4, 6]] * 15, "needs 16 dialects"),
                                        ([[0, 0.5, 1, 1.5, 2, 3, 4.2, 6]] * 16, "not a multiple of 0.5"),
                                        ([[0, 0.5, 1, 1.5, 2, 3, 4, 8]] * 16, "outside [0, 7.5]"),
                                        ([[0, 0.5, 1, 1.5, 2, 3, 6, 4]] * 16, "ascending")])
def test_bad_formatbooks_are_refused(bad, needle):
    with pytest.raises(UsageError, match=None) as exc:
        formatbook.check(bad, "book.yaml")
    assert needle in exc.value.message


def test_params_pick_exhaustive_weights_and_two_stage_activations():
    w, a = formats(BlockDialectParams())
    assert (w.select, a.select, w.bits) == ("mse", "two_stage", 4.375)
    assert BlockDialectParams(bits="w4a4").resolved_targets == ("linear", "attn_qk", "attn_pv")
    assert BlockDialectParams(bits="w4a16").resolved_targets == ("linear",)
    with pytest.raises(ValueError, match="use bits w4a4"):
        BlockDialectParams(bits="w4a16", targets=["attn_qk"])


def test_block_linear_computes_with_its_quantized_operands_and_stores_4375_bits():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 48, bias=True)
    q = BlockQuantLinear.from_linear(lin, BD_MSE, BD)
    assert torch.equal(q.dequantized_weight(), bf.fake_quantize(lin.weight.detach(), BD_MSE))
    x = torch.randn(3, 5, 256)
    ref = torch.nn.functional.linear(bf.fake_quantize(x, BD), bf.fake_quantize(lin.weight.detach(), BD_MSE), lin.bias)
    assert torch.allclose(q(x), ref, atol=1e-6)
    stored = sum(t.numel() * t.element_size() for k, t in q.state_dict().items() if k != "bias")
    assert 8 * stored / (256 * 48) == 4.375


def _attention_case(kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=kv_heads, attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval(), torch.randint(0, 64, (2, 48))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_block_attention_without_formats_is_sdpa(kv_heads):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model, _ = _attention_case(kv_heads)
    attn = model.model.layers[0].self_attn
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 48, 16), torch.randn(2, kv_heads, 48, 16), torch.randn(2, kv_heads, 48, 16)
    mask = torch.triu(torch.full((48, 48), torch.finfo(torch.float32).min), 1)[None, None].expand(2, 1, 48, 48)
    ours, _ = blockattn.block_attention(attn, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=0.25)
    assert (ours - ref).abs().max() < 1e-6


def test_full_path_quantizes_qk_along_head_dim_and_pv_along_keys():
    model, _ = _attention_case(2)
    attn = model.model.layers[0].self_attn
    blockattn.install(model, bf.mxfp4(16), bf.mxfp4())
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 32, 16), torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    out, _ = blockattn.block_attention(attn, q, k, v, None, scaling=0.25)
    kq, vq = (t.repeat_interleave(2, dim=1) for t in (k, v))
    fq = bf.fake_quantize
    p = torch.softmax(fq(q, bf.mxfp4(16)) @ fq(kq, bf.mxfp4(16)).transpose(2, 3) * 0.25, -1)
    ref = (fq(p, bf.mxfp4()) @ fq(vq, bf.mxfp4(), dim=-2)).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)


def test_quantize_blocks_api_on_a_model_with_biases_and_gqa_and_its_counts():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 24))
    with torch.no_grad():
        before = model(ids).logits
    stats = blockapply.quantize_blocks_(model, BD_MSE, BD, ("linear", "attn_qk", "attn_pv"))
    assert stats["layers"] == 14 and stats["attention_layers"] == 2 and stats["weight_bits_per_element"] == 4.375
    with torch.no_grad():
        after = model(ids).logits
    assert 0 < (after - before).abs().max() < before.abs().max()


def _tiny(kind: str):
    import transformers as t

    from llmx.core import models

    small = dict(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4)
    gqa = dict(small, intermediate_size=64, num_key_value_heads=2, head_dim=16)
    return {"falcon": lambda: t.FalconForCausalLM(t.FalconConfig(**small)),
            "bloom": lambda: t.BloomForCausalLM(t.BloomConfig(vocab_size=64, hidden_size=64, n_layer=1, n_head=4)),
            "gemma2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(**gqa)),
            "gpt-oss": lambda: t.GptOssForCausalLM(t.GptOssConfig(**gqa, num_local_experts=4, num_experts_per_tok=2)),
            "mamba2": lambda: models.load("tiny:mamba2")[0]}[kind]()


@pytest.mark.parametrize("kind,needle", [("mamba2", "no attention layers"), ("falcon", "AttentionInterface"),
                                         ("bloom", "AttentionInterface"), ("gemma2", "softcapping"),
                                         ("gpt-oss", "sinks")])
def test_attention_it_cannot_quantize_is_refused_before_anything_changes(kind, needle):
    model = _tiny(kind)
    before = model.config._attn_implementation
    with pytest.raises(UsageError, match=needle):
        blockattn.install(model, bf.mxfp4(), bf.mxfp4())
    assert model.config._attn_implementation == before
    assert not any(hasattr(m, blockattn.CHILD) for m in model.modules())


def test_block_attention_in_a_model_keeps_sliding_windows_padding_and_the_cache():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=8, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    ids = torch.randint(1, 64, (2, 24))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).logits
        ref_gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        blockattn.install(model, None, None)
        ours = model(ids, attention_mask=mask).logits
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    real = mask.bool()
    assert (ours - ref)[real].abs().max() < 1e-5
    assert torch.equal(gen, ref_gen)


@pytest.mark.parametrize("method", ["blockdialect", "mxfp4", "nvfp4", "int4-block"])
def test_saved_full_path_model_reloads_with_identical_perplexity(cli, tmp_path, method):
    r = cli("--json", "quantize", "--method", method, "--bits", "w4a4", "--model", "ref:llama-test", "--eval",
            "perplexity", "--set", "perplexity.max_tokens=512", "-o", tmp_path / "q")
    assert r.code == 0, r.err
    quant, ppl = r.json()["stages"][-2]["metrics"], r.json()["stages"][-1]["metrics"]["perplexity"]
    assert quant["targets"] == ["linear", "attn_qk", "attn_pv"]
    again = cli("--json", "eval", "--method", "perplexity", "--model", quant["model_dir"], "--set", "max_tokens=512",
                "-o", tmp_path / "e")
    assert again.code == 0, again.err
    assert again.json()["stages"][0]["metrics"]["perplexity"] == pytest.approx(ppl, rel=1e-9)


def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, tmp_path):
    bad = cli("quantize", "--method", "blockdialect", "--bits", "w4a8", "--model", "tiny:llama", "-o", tmp_path / "a")
    assert bad.code == 2 and "valid: w4a16, w4a4" in bad.err
    book = tmp_path / "book.yaml"
    book.write_text("\n".join(["- [0, 0.5, 1, 1.5, 2, 3, 4, 6.2]"] * 16))
    off = cli("quantize", "--method", "blockdialect", "--model", "tiny:llama", "--set", f"formatbook={book}",
              "-o", tmp_path / "b")
    assert off.code == 2 and "not a multiple of 0.5" in off.err
    mamba = cli("quantize", "--method", "mxfp4", "--model", "tiny:mamba2", "-o", tmp_path / "c")
    assert mamba.code == 2 and "no attention layers" in mamba.err and len(mamba.err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before any run folder
    assert not any((tmp_path / "c").iterdir())  # the run that found no attention left nothing behind
