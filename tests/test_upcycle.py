"""Sparse upcycling: the dense identity pins the renormalised router, the export reloads in plain transformers, the
load-balancing loss stays out of held-out scores, parameter counts, the continued data order, bad input, and the
upcycled MoE trained through the CLI (from scratch too)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from llmx.core.eval.lm import mean_nll
from llmx.core.models.upcycle import UpcycleConfig, balance_loss_kwargs, parameter_counts, upcycle
from llmx.core.train.lm.data import TokenWindows
from llmx.errors import UsageError


def dense(arch: str = "llama", hidden: int = 64, inter: int = 128, heads: int = 4, kv: int = 2, layers: int = 2,
          vocab: int = 96, **kw):
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=64,
                  tie_word_embeddings=False, **kw)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**common)))
    with torch.no_grad():  # weights far from init, so that a wrong mixture shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def error(a, b, vocab: int = 96) -> float:
    x = torch.randint(vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((a(input_ids=x).logits - b(input_ids=x).logits).abs().max())


@pytest.mark.parametrize("arch,config", [
    ("llama", UpcycleConfig()), ("llama", UpcycleConfig(num_experts=4, top_k=1)),
    ("llama", UpcycleConfig(router_init="zeros")), ("qwen2", UpcycleConfig(num_experts=4)),
    ("llama", UpcycleConfig(target="qwen2_moe"))])
def test_right_after_upcycling_the_logits_are_the_dense_models(arch, config):
    d = dense(arch)
    moe = upcycle(d, config).eval()
    assert moe.config.num_experts_per_tok == config.top_k
    assert error(d, moe) < 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_switch_style_router_without_renormalising_breaks_the_identity(arch):
    d = dense(arch)
    switch = upcycle(d, UpcycleConfig(num_experts=4, target="qwen2_moe", renormalize=False)).eval()
    kept = upcycle(d, UpcycleConfig(num_experts=4, target="qwen2_moe")).eval()
    assert error(d, kept) < 1e-5
    assert error(d, switch) > 1e-2


def test_the_router_is_new_and_the_experts_are_copies():
    d = dense()
    moe = upcycle(d, UpcycleConfig(num_experts=4, seed=3))
    layer = moe.model.layers[1].mlp
    gate_up = torch.cat([d.model.layers[1].mlp.gate_proj.weight, d.model.layers[1].mlp.up_proj.weight])
    assert all(torch.equal(layer.experts.gate_up_proj[e], gate_up) for e in range(4))
    assert abs(float(layer.gate.weight.std()) - d.config.initializer_range) < 0.005
    again = upcycle(d, UpcycleConfig(num_experts=4, seed=3))
    other = upcycle(d, UpcycleConfig(num_experts=4, seed=4))
    assert torch.equal(again.model.layers[1].mlp.gate.weight, layer.gate.weight)
    assert not torch.equal(other.model.layers[1].mlp.gate.weight, layer.gate.weight)
    zeros = upcycle(d, UpcycleConfig(num_experts=4, router_init="zeros"))
    assert not zeros.model.layers[0].mlp.gate.weight.any()


def test_the_saved_moe_reloads_through_auto_model_with_the_same_logits(tmp_path):
    from llmx.core import models
    from llmx.core.models.archs import build_random

    d, tok = build_random("llama")
    moe = upcycle(d, UpcycleConfig(num_experts=4, aux_loss_coef=0.02)).eval()
    models.save(moe, tok, tmp_path / "moe")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert type(back).__name__ == "MixtralForCausalLM"
    assert back.config.router_aux_loss_coef == 0.02 and not back.config.output_router_logits
    assert error(moe, back, vocab=len(tok)) < 1e-6
    assert error(d, back, vocab=len(tok)) < 1e-5


def test_a_qwen2_moe_export_reloads_with_norm_topk_prob(tmp_path):
    d = dense("qwen2")
    moe = upcycle(d, UpcycleConfig(num_experts=4)).eval()
    moe.save_pretrained(tmp_path / "moe")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "moe").eval()
    assert type(back).__name__ == "Qwen2MoeForCausalLM" and back.config.norm_topk_prob
    assert error(d, back) < 1e-5


def test_the_balance_loss_trains_but_held_out_scores_are_the_nll_alone():
    d = dense()
    moe = upcycle(d, UpcycleConfig(num_experts=4, aux_loss_coef=0.5)).eval()
    x = torch.randint(96, (3, 20), generator=torch.Generator().manual_seed(2))
    assert abs(mean_nll(moe, x) - mean_nll(d, x)) < 1e-5
    assert balance_loss_kwargs(d) == {} and balance_loss_kwargs(moe) == {"output_router_logits": True}
    with torch.no_grad():
        out = moe(input_ids=x, labels=x, **balance_loss_kwargs(moe))  # as the lm stage trains it
        plain = moe(input_ids=x, labels=x)
    assert out.aux_loss is not None and float(out.aux_loss) > 0
    assert float(out.loss) == pytest.approx(mean_nll(d, x) + 0.5 * float(out.aux_loss), abs=1e-4)
    assert float(plain.loss) == pytest.approx(mean_nll(d, x), abs=1e-5)


def test_parameter_counts_take_top_k_of_the_experts():
    d = dense()
    moe = upcycle(d, UpcycleConfig(num_experts=8, top_k=2))
    c, cd = parameter_counts(moe), parameter_counts(d)
    per_expert = 3 * 64 * 128 * 2  # gate, up and down in each of 2 layers
    assert c["total_params"] - c["active_params"] == 6 * per_expert
    assert c["active_params"] == cd["total_params"] + per_expert + 2 * 8 * 64  # one more expert and the routers
    assert c["total_params"] - c["total_non_embedding"] == 2 * 96 * 64


def test_a_model_with_real_widths_gqa_and_biases_upcycles_exactly():
    d = dense("qwen2", hidden=2048, inter=2048, heads=16, kv=4, layers=1, vocab=64)
    moe = upcycle(d, UpcycleConfig(num_experts=4)).eval()
    assert moe.model.layers[0].self_attn.q_proj.bias is not None
    assert error(d, moe, vocab=64) < 1e-4


@pytest.mark.parametrize("make,config,words", [
    (lambda: AutoModelForCausalLM.from_config(__import__("transformers").GPT2Config(n_layer=1, n_embd=64, n_head=4,
                                                                                   vocab_size=50)),
     UpcycleConfig(), "no gated dense FFN"),
    (lambda: dense(attention_bias=True), UpcycleConfig(), "attention_bias"),
    (lambda: dense(mlp_bias=True), UpcycleConfig(), "mlp_bias"),
    (lambda: dense("qwen2", use_sliding_window=True, sliding_window=16), UpcycleConfig(), "use_sliding_window"),
    (dense, UpcycleConfig(num_experts=4, top_k=5), "above the 4 experts"),
    (dense, UpcycleConfig(renormalize=False), "always renormalises"),
    (lambda: dense("qwen2"), UpcycleConfig(target="mixtral"), "no q/k/v biases")])
def test_models_that_cannot_be_upcycled_say_why(make, config, words):
    with pytest.raises(UsageError, match=words):
        upcycle(make(), config)


def test_skipped_windows_continue_the_same_seeded_order():
    stream = torch.arange(64 * 40)
    full, cont = TokenWindows(stream, 64, seed=5), TokenWindows(stream, 64, seed=5, skip=12)
    assert torch.equal(cont.batch(0, 4), full.batch(3, 4))
    assert torch.equal(cont.batch(9, 4), full.batch(12, 4))  # into the second epoch


def train(cli, out, *sets):
    return cli("--json", "train", "--method", "upcycle", "--model", "ref:llama-test", "-o", out, "--set", "steps=3",
               "--set", "warmup=1", "--set", "batch_size=2", "--set", "seq_len=32", "--set", "max_tokens=8000",
               "--set", "eval_windows=2", "--set", "eval_every=3", "--set", "num_experts=4", *sets)


def test_the_cli_upcycles_checks_trains_saves_and_continues_the_data(cli, tmp_path):
    r = train(cli, tmp_path / "runs", "--set", "data_offset=640", "--set", "save_at_tokens=[128]", "--set",
              "router_seed=5")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["architecture"] == "MixtralForCausalLM" and m["identity_max_logit_error"] < 1e-5
    assert m["moe_params"]["active_params"] < m["moe_params"]["total_params"]
    assert m["heldout_loss_before"] > 0 and m["data_offset"] == 640 and m["router_seed"] == 5
    manifest = json.loads(open(m["series"]).read())
    assert manifest["run"]["data"]["offset"] == 640 and manifest["checkpoints"][0]["tokens"] == 128
    back = AutoModelForCausalLM.from_pretrained(m["model_dir"])
    assert back.config.num_local_experts == 4


def test_upcycling_a_series_checkpoint_continues_its_runs_data_by_default(cli, tmp_path):
    r = cli("--json", "train", "--method", "lm", "--model", "ref:llama-test", "-o", tmp_path / "dense", "--set",
            "steps=3", "--set", "batch_size=2", "--set", "seq_len=32", "--set", "max_tokens=8000", "--set",
            "eval_every=3", "--set", "eval_windows=2", "--set", "save_at_tokens=[100]", "--set", "save=false")
    assert r.code == 0, r.err
    manifest = json.loads(open(r.json()["stages"][0]["metrics"]["series"]).read())
    source = str(tmp_path / "dense" / next((tmp_path / "dense").iterdir()) / "artifacts" / "0_lm" / "series" /
                 manifest["checkpoints"][0]["path"])
    up = cli("--json", "train", "--method", "upcycle", "--model", source, "-o", tmp_path / "up", "--set", "steps=1",
             "--set", "batch_size=2", "--set", "seq_len=32", "--set", "max_tokens=8000", "--set", "eval_windows=2",
             "--set", "num_experts=4", "--set", "save=false")
    assert up.code == 0, up.err
    assert up.json()["stages"][0]["metrics"]["data_offset"] == 128  # the tokens seen: 2 steps of 64
    for i, (sets, words) in enumerate(((["seq_len=16"], "seq_len is 16 here and 32"),
                                       (["seq_len=32", "max_tokens=6000"], "training data differs"))):
        other = tmp_path / f"other{i}"
        bad = cli("train", "--method", "upcycle", "--model", source, "-o", other, "--set", "steps=1", "--set",
                  "num_experts=4", "--set", "batch_size=2", *[x for s in sets for x in ("--set", s)])
        assert bad.code == 2 and words in bad.err, bad.err
        assert not other.exists() or list(other.iterdir()) == []


def test_init_scratch_is_the_same_moe_from_a_fresh_init(cli, tmp_path):
    r = train(cli, tmp_path / "runs", "--set", "init=scratch")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert "identity_max_logit_error" not in m
    experts = AutoModelForCausalLM.from_pretrained(m["model_dir"]).model.layers[0].mlp.experts.down_proj
    assert not torch.equal(experts[0], experts[1])


@pytest.mark.parametrize("model,sets,words", [
    ("tiny:gpt2", [], "no gated dense FFN"), ("ref:llama-test", ["--set", "top_k=9"], "above num_experts"),
    ("ref:llama-test", ["--set", "cooldown_from=."], "--method lm")])
def test_bad_upcycling_is_exit_2_with_no_run_folder(cli, tmp_path, model, sets, words):
    out = tmp_path / "runs"
    r = cli("train", "--method", "upcycle", "--model", model, "-o", out, "--set", "steps=1", *sets)
    assert r.code == 2 and words in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_upcycled_moe_stays_there_matches_and_trains():
    d = dense().cuda()
    moe = upcycle(d, UpcycleConfig(num_experts=4))
    assert all(p.device.type == "cuda" for p in moe.parameters())
    x = torch.randint(96, (2, 24), device="cuda")
    with torch.no_grad():
        assert float((moe.eval()(input_ids=x).logits - d(input_ids=x).logits).abs().max()) < 1e-4
    moe.train()
    moe(input_ids=x, labels=x).loss.backward()
    assert moe.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0
