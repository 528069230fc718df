"""CLOVER: exact orthogonalisation on every recognised attention layout, singular values as importance, pruning that
beats vanilla, uniform and global budgets, real size reduction that reloads, singular-value fine-tuning (official
scope: pre-RoPE query cores, V-O, MLP up blocks, dropout) that merges back, and the PEFT baselines at its budget."""

from __future__ import annotations

import pytest
import torch

import llmx
from llmx.core import models
from llmx.core.eval.lm import mean_nll
from llmx.errors import UsageError
from llmx.plugins.clover import transform as T
from llmx.plugins.clover.attention import attention_layers, convert_model, head_counts
from llmx.plugins.clover.config import CloverTrainParams


def held_out(tok, n=16, seq=128):
    from llmx.core.data import random_windows

    return random_windows(tok, "stdlib", n, seq, seed=0, split="validation")


def in_code(arch: str):
    """Tiny models of the layouts the zoo does not build, with the byte tokenizer."""
    import transformers

    _, tok = models.load("tiny:llama")
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    bart = dict(vocab_size=len(tok), d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, pad_token_id=0, bos_token_id=1,
                eos_token_id=2, decoder_start_token_id=2)
    cfg = {"mistral": lambda: transformers.MistralConfig(sliding_window=8, **common),
           "phi3": lambda: transformers.Phi3Config(**common),
           "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **common),
           "stablelm": lambda: transformers.StableLmConfig(partial_rotary_factor=0.25, **common),
           "bart": lambda: transformers.BartConfig(**bart)}[arch]()
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval(), tok


def load(name):
    return in_code(name.removeprefix("code:")) if name.startswith("code:") else models.load(name)


LAYOUTS = ["tiny:llama", "tiny:qwen2", "code:mistral", "tiny:moe", "tiny:gpt2", "tiny:opt"]
PROBE = torch.randint(3, 250, (2, 24), generator=torch.Generator().manual_seed(1))  # longer than Mistral's window


def test_orthogonalize_pair_keeps_the_product_and_sorts_by_singular_value():
    torch.manual_seed(0)
    left, right = torch.randn(40, 8, dtype=torch.float64), torch.randn(8, 30, dtype=torch.float64)
    new_left, new_right, s = T.orthogonalize_pair(left, right)
    assert torch.allclose(new_left @ new_right, left @ right, atol=1e-10)
    assert torch.allclose(new_left.T @ new_left, torch.diag(s), atol=1e-10)
    assert torch.allclose(new_right @ new_right.T, torch.diag(s), atol=1e-10)
    assert torch.all(s[:-1] >= s[1:])
    # each dim's norm product is its singular value: the pruning criterion
    assert torch.allclose(new_left.norm(dim=0) * new_right.norm(dim=1), s, atol=1e-10)
    u, vh, s2 = T.orthogonalize_pair(left, right, scaled=False)  # fine-tuning: orthonormal, diag(s) in the core
    assert torch.allclose(u @ torch.diag(s2) @ vh, left @ right, atol=1e-10)
    assert torch.allclose(vh @ vh.T, torch.eye(8, dtype=torch.float64), atol=1e-10)


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_qr_blocks_rebuild_weight_and_bias(kind):
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 32) if kind == "linear" else Conv1D(32, 24)
    torch.nn.init.normal_(layer.bias)
    w, b = T.rows_of(layer).clone(), layer.bias.data.clone()
    cores = T.qr_blocks(layer, 8)
    rows = torch.cat([T.rows_of(layer), layer.bias.data[:, None]], 1).double().reshape(4, 8, 25)
    assert torch.allclose(rows @ rows.transpose(1, 2), torch.eye(8, dtype=torch.float64).expand(4, 8, 8), atol=1e-5)
    rebuilt = (cores @ rows).reshape(32, 25)
    assert torch.allclose(rebuilt[:, :-1].float(), w, atol=1e-5) and torch.allclose(rebuilt[:, -1].float(), b, atol=1e-5)


@pytest.mark.parametrize("name", LAYOUTS)
def test_transform_alone_leaves_the_logits_unchanged(name):
    model, _ = load(name)
    with torch.no_grad():
        base = model(input_ids=PROBE).logits
        layers = convert_model(model, name)
        for attn in layers:
            T.orthogonalize(attn, "vo", attn.vo_dim)
            if not attn.rope:
                T.orthogonalize(attn, "qk", attn.qk_dim)
        assert (model(input_ids=PROBE).logits - base).abs().max() < 1e-5
    assert [a.rope for a in layers] == [name not in ("tiny:gpt2", "tiny:opt")] * len(layers)


def zeroed(name, keep):
    """The reference for slicing: the orthogonalised model with all but each group's ``keep`` largest singular
    dims zeroed, shapes unchanged."""
    model, _ = load(name)
    with torch.no_grad():
        for attn in convert_model(model, name):
            for t in ("vo",) if attn.rope else ("qk", "vo"):
                s = T.orthogonalize(attn, t, attn.head_dim)
                T.zero_dims(attn, t, attn.head_dim, [torch.argsort(x, descending=True)[keep:] for x in s])
    return model


@pytest.mark.parametrize("name", LAYOUTS)
def test_pruned_heads_are_smaller_compute_the_zeroed_model_and_reload(name, tmp_path):
    model, tok = load(name)
    pruned, m = llmx.prune(model, tokenizer=tok, method="clover", ratio=0.5, output_dir=tmp_path)
    with torch.no_grad():
        assert torch.allclose(pruned(input_ids=PROBE).logits, zeroed(name, 8)(input_ids=PROBE).logits, atol=1e-5)
    rope = name not in ("tiny:gpt2", "tiny:opt")
    assert m["vo_dim"] == 8 and m["qk_dim"] == (16 if rope else 8)
    assert m["params_after"] < m["params_before"] and m["kv_bytes_per_token_after"] < m["kv_bytes_per_token_before"]
    with torch.no_grad():
        expected = pruned(input_ids=PROBE).logits
        reloaded, _ = models.load(m["model_dir"])
        attn = attention_layers(reloaded)[0][1]
        assert attn.v_proj.out_features == head_counts(attn)[1] * 8
        assert attn.scaling == pytest.approx(16 ** -0.5)  # the original head_dim's temperature
        assert torch.allclose(reloaded(input_ids=PROBE).logits, expected, atol=1e-5)


@pytest.mark.parametrize("name,target", [("ref:opt-test", "qk"), ("tiny:qwen2", "vo")])
def test_global_pruning_keeps_exactly_the_global_top_dims(name, target):
    model, tok = load(name)
    with torch.no_grad():
        probe = load(name)[0]
        singular = torch.cat([torch.cat(T.orthogonalize(a, target, a.head_dim)) for a in convert_model(probe, name)])
    pruned, m = llmx.prune(model, tokenizer=tok, method="clover", mode="global", ratio=0.6, targets=[target],
                           save=False)
    want = round(singular.numel() * 0.4)
    assert m[f"{target}_dims_kept"] == want
    live = []
    for _, attn in attention_layers(pruned):
        shared = attn.k_proj if target == "qk" else attn.v_proj
        rows = torch.cat([shared.weight, shared.bias[:, None]], 1) if shared.bias is not None else shared.weight
        norms = rows.double().norm(dim=1)  # after CLOVER each live dim's shared row has norm sqrt(s)
        live.append(norms[norms > 0] ** 2)
    live = torch.cat(live)
    assert live.numel() == want  # exactly the budget, the rest of each layer's widest slice zeroed
    assert torch.allclose(live.sort().values, singular.topk(want).values.sort().values, rtol=1e-4)


def test_activation_scores_are_the_calibration_norms():
    from llmx.core.config import DataConfig
    from llmx.core.data import random_windows
    from llmx.plugins.clover.config import CloverPruneParams
    from llmx.plugins.clover.method import activation_norms

    model, tok = models.load("tiny:opt")
    layers = convert_model(model, "tiny:opt")
    p = CloverPruneParams(criterion="activation", calib_windows=6, calib_seq_len=32)

    class Ctx:
        progress = staticmethod(lambda xs, description=None: xs)
        config = type("C", (), {"seed": 0, "data": DataConfig()})

    Ctx.model, Ctx.tokenizer = model, tok
    norms = activation_norms(Ctx, layers, p)[0]  # accumulated over micro-batches of windows
    outs = {}
    hooks = [getattr(layers[0], f"{n}_proj").register_forward_hook(lambda _m, _i, o, n=n: outs.setdefault(n, o))
             for n in "qkv"]
    with torch.no_grad():
        model(input_ids=random_windows(tok, "stdlib", 6, 32, 0))
    for h in hooks:
        h.remove()
    direct = {n: o.double().reshape(-1, o.shape[-1]).norm(dim=0) for n, o in outs.items()}
    assert all(torch.allclose(norms[n], direct[n], rtol=1e-6) for n in "qkv")
    qk = T.activation_scores(layers[0], "qk", 16, norms)
    assert torch.allclose(qk[1], direct["q"][16:32] * direct["k"][16:32], rtol=1e-6)
    vo = T.activation_scores(layers[0], "vo", 16, norms)
    assert torch.allclose(vo[2], direct["v"][32:48] * layers[0].out_proj.weight[:, 32:48].double().norm(dim=0),
                          rtol=1e-6)


def pruned_loss(cli, tmp_path, model, criterion, ratio, targets):
    r = cli("--json", "prune", "--method", "clover", "--model", model, "--set", f"criterion={criterion}",
            "--set", f"ratio={ratio}", "--set", f"targets={targets}", "--eval", "perplexity",
            "--set", "perplexity.max_tokens=4096", "-o", tmp_path)
    assert r.code == 0, r.err
    return r.json()["stages"][1:]  # the prune stage and the evaluation after it (the starting model's comes first)


@pytest.mark.parametrize("targets", ['["qk"]', '["vo"]'])
def test_clover_prunes_with_less_loss_than_vanilla_and_activation(cli, tmp_path, targets):
    for ratio in (0.5, 0.875):
        clover = pruned_loss(cli, tmp_path, "ref:opt-test", "clover", ratio, targets)[1]["metrics"]["nll"]
        for baseline in ("vanilla", "activation") if ratio > 0.5 else ("vanilla",):  # activation ties at half here
            other = pruned_loss(cli, tmp_path, "ref:opt-test", baseline, ratio, targets)[1]["metrics"]["nll"]
            assert clover < other, (targets, ratio, baseline)


def test_cli_pruned_model_keeps_its_scale_and_reloads(cli, tmp_path):
    stages = pruned_loss(cli, tmp_path / "p", "ref:opt-test", "clover", 0.75, '["qk", "vo"]')
    m = stages[0]["metrics"]
    assert m["qk_dim"] == m["vo_dim"] == 4 and m["params_after"] < m["params_before"]
    assert m["kv_bytes_per_token_after"] == m["kv_bytes_per_token_before"] // 4
    r = cli("--json", "eval", "--method", "perplexity", "--model", m["model_dir"], "--set", "max_tokens=4096",
            "-o", tmp_path / "e")
    assert r.json()["stages"][0]["metrics"]["nll"] == pytest.approx(stages[1]["metrics"]["nll"], rel=1e-6)


def cores_model(name, targets, basis="orthogonal", gqa_vo="qr"):
    from llmx.plugins.clover.finetune import _install

    model, tok = load(name)
    layers = convert_model(model, name)

    class Ctx:
        progress = staticmethod(lambda xs, description=None: xs)

    Ctx.model = model
    params = CloverTrainParams(targets=targets, basis=basis, gqa_vo=gqa_vo)
    with torch.no_grad():
        return model, _install(Ctx, layers, targets, params)


@pytest.mark.parametrize("name,targets", [("tiny:llama", ["q", "vo", "up"]), ("tiny:qwen2", ["q", "vo", "up"]),
                                          ("code:mistral", ["q", "vo", "up"]), ("tiny:moe", ["q", "vo"]),
                                          ("tiny:gpt2", ["qk", "vo", "up"]), ("tiny:opt", ["qk", "vo", "up"])])
@pytest.mark.parametrize("basis,gqa_vo", [("orthogonal", "qr"), ("orthogonal", "svd"), ("raw", "qr")])
def test_cores_start_exact_and_merge_back_exactly(name, targets, basis, gqa_vo):
    base, _ = load(name)
    with torch.no_grad():
        original = base(input_ids=PROBE).logits
    model, installed = cores_model(name, targets, basis, gqa_vo)
    assert {n for _, n, _ in installed} >= {"v_proj"} | ({"q_proj"} if "q" in targets else {"k_proj"})
    with torch.no_grad():
        assert (model(input_ids=PROBE).logits - original).abs().max() < 1e-5  # the cores start as the model
        for _, _, layer in installed:  # a trained core: any r x r matrices, incl. the pre-RoPE query ones
            layer.core.add_(0.05 * torch.randn_like(layer.core))
        unmerged = model(input_ids=PROBE).logits
        assert (unmerged - original).abs().max() > 1e-3
        for parent, name_, layer in installed:
            setattr(parent, name_, layer.merged())
        assert (model(input_ids=PROBE).logits - unmerged).abs().max() < 1e-5


def test_dropout_acts_on_the_frozen_vectors_only_in_training():
    model, installed = cores_model("tiny:llama", ["q"])
    layer = installed[0][2]
    layer.dropout.p = 0.5
    x = torch.randn(3, 64)
    layer.train()
    assert not torch.allclose(layer(x), layer(x))
    layer.eval()
    assert torch.equal(layer(x), layer(x))


def train(cli, tmp_path, model, *sets):
    r = cli("--json", "train", "--method", "clover", "--model", model, "--set", "steps=30", "--set", "batch_size=4",
            "--set", "seq_len=64", "--set", "lr=0.01", *[a for s in sets for a in ("--set", s)], "-o", tmp_path)
    assert r.code == 0, r.err
    return r.json()["stages"][0]["metrics"]


def test_singular_value_finetuning_trains_cores_and_merges_back(cli, tmp_path):
    stages = pruned_loss(cli, tmp_path / "p", "ref:opt-test", "clover", 0.75, '["qk", "vo"]')
    pruned = stages[0]["metrics"]["model_dir"]
    m = train(cli, tmp_path / "t", pruned)
    assert m["targets"] == "qk,vo,up"  # the official scope: the attention pairs and the MLP up blocks
    # per layer: 4 KV heads x (4 x 4 qk + 4 x 4 vo cores) + fc1's 256 rows in 32 blocks of 8 x 8 (head_dim / 2)
    assert m["trainable_params"] == m["core_budget"] == 2 * (4 * (16 + 16) + 32 * 64)
    assert m["train_nll_after"] < m["train_nll_before"]  # the cores learn (held-out gains need bigger models)
    assert m["val_nll_merged"] == pytest.approx(m["val_nll_after"], abs=1e-5)
    assert m["params_after"] == m["params_before"]


@pytest.mark.parametrize("tuner", ["lora", "pissa"])
def test_peft_baselines_train_at_the_cores_budget_and_merge(cli, tmp_path, tuner):
    m = train(cli, tmp_path, "ref:llama-test", f"tuner={tuner}")
    assert m["targets"] == "q,vo,up" and m["rank"] >= 1
    assert m["trainable_params"] <= m["core_budget"]
    # q (64 x 64) and v (64 x 32): r * (in + out); up: r * (64 + 192), two layers; one more rank would not fit
    assert m["trainable_params"] == 2 * m["rank"] * (128 + 96 + 256) < m["core_budget"] + 2 * (128 + 96 + 256)
    assert m["train_nll_after"] < m["train_nll_before"]
    assert m["val_nll_merged"] == pytest.approx(m["val_nll_after"], abs=1e-4)
    model, tok = models.load("ref:llama-test")  # both adapters start as the model itself
    assert m["val_nll_before"] == pytest.approx(mean_nll(model, held_out(tok, n=32, seq=64)), abs=1e-4)
    assert m["params_after"] == m["params_before"]


@pytest.mark.parametrize("arch,words", [("phi3", "fuses Q, K and V"), ("qwen3", "q_norm"),
                                        ("stablelm", "partial rotary"), ("bart", "BART-style")])
def test_unsupported_layouts_are_refused_by_name(arch, words):
    model, _ = in_code(arch)
    with pytest.raises(UsageError, match=words):
        convert_model(model, arch)


def test_an_attention_this_forward_does_not_reproduce_is_refused():
    from transformers.models.llama.modeling_llama import LlamaAttention

    class Doubled(LlamaAttention):  # a separate-projection layout whose forward computes something else
        def forward(self, *args, **kwargs):
            out, weights = super().forward(*args, **kwargs)
            return 2 * out, weights

    model, _ = models.load("tiny:llama")
    for _, attn in attention_layers(model):
        attn.__class__ = Doubled
    with pytest.raises(UsageError, match="does not reproduce Doubled"):
        convert_model(model, "tiny:llama")


@pytest.mark.parametrize("name", ["tiny:gpt2", "tiny:opt", "tiny:llama"])
def test_eager_attention_runs_the_familys_own_function(name):
    model, _ = load(name)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        base = model(input_ids=PROBE).logits
        for attn in convert_model(model, name):
            T.orthogonalize(attn, "vo", attn.vo_dim)
        assert (model(input_ids=PROBE).logits - base).abs().max() < 1e-5


def test_bad_input_is_exit_2(cli, tmp_path):
    assert cli("prune", "--method", "clover", "--model", "tiny:llama", "--set", "ratio=1.0", "-o", tmp_path).code == 2
    r = cli("prune", "--method", "clover", "--model", "tiny:mamba2", "-o", tmp_path)
    assert r.code == 2 and "no attention layers" in r.err
    r = cli("prune", "--method", "clover", "--model", "tiny:llama", "--set", 'targets=["qk"]', "-o", tmp_path)
    assert r.code == 2 and "RoPE" in r.err
    r = cli("prune", "--method", "clover", "--model", "tiny:llama", "--set", "mode=global", "--set",
            "layer_keep=[4,4]", "-o", tmp_path)
    assert r.code == 2 and "global" in r.err
    r = cli("train", "--method", "clover", "--model", "tiny:moe", "--set", 'targets=["up"]', "-o", tmp_path)
    assert r.code == 2 and "up projection" in r.err
    r = cli("train", "--method", "clover", "--model", "tiny:opt", "--set", 'targets=["q", "qk"]', "-o", tmp_path)
    assert r.code == 2 and "choose one" in r.err
    r = cli("train", "--method", "lm", "--model", "tiny:llama", "--set", "adapter=lora", "--set", "lora.init=pissa",
            "-o", tmp_path)
    assert r.code == 2 and "merge" in r.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["tiny:gpt2", "tiny:qwen2"])
@pytest.mark.parametrize("prune", [{}, {"mode": "global"}, {"criterion": "activation"}])
@pytest.mark.parametrize("tuner", ["clover", "pissa"])
def test_prune_and_tuners_on_cuda(name, prune, tuner):
    """Probe, scores, masks, cores and adapters are created on the model's device, in bf16 as well."""
    model, tok = llmx.load(name, device="cuda", dtype="bfloat16")
    model, m = llmx.prune(model, tokenizer=tok, method="clover", device="cuda", dtype="bfloat16", ratio=0.5,
                          save=False, **prune)
    heads = head_counts(attention_layers(model)[0][1])[1]
    assert m["vo_dims_kept"] == 2 * heads * 8 and min(m["layer_vo_dims"]) <= 8 <= max(m["layer_vo_dims"])
    with torch.no_grad():  # sliced equals zeroed on the device as well
        if not prune:
            reference = zeroed(name, 8).to("cuda", torch.bfloat16)
            assert (model(input_ids=PROBE.cuda()).logits - reference(input_ids=PROBE.cuda()).logits).abs().max() < 0.1
    model, m = llmx.train(model, tokenizer=tok, method="clover", device="cuda", dtype="bfloat16", tuner=tuner,
                          steps=3, seq_len=32, eval_windows=2, save=False)
    assert m["params_after"] == m["params_before"] and next(model.parameters()).is_cuda
