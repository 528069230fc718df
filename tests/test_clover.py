"""CLOVER: exact orthogonalisation, singular values as importance, pruning that beats vanilla, real size reduction,
singular-value fine-tuning that merges back without extra parameters."""

from __future__ import annotations

import pytest
import torch

from llmx.core import models
from llmx.core.eval.lm import mean_nll
from llmx.plugins.clover import transform as T
from llmx.plugins.clover.attention import attention_layers, convert


def held_out(tok, n=16, seq=128):
    from llmx.core.data import random_windows

    return random_windows(tok, "stdlib", n, seq, seed=0, split="validation")


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


@pytest.mark.parametrize("name,qk", [("ref:opt-test", True), ("ref:llama-test", False)])
def test_transform_alone_leaves_the_loss_unchanged(name, qk):
    model, tok = models.load(name)
    x = held_out(tok)
    base = mean_nll(model, x)
    with torch.no_grad():
        for _, attn in attention_layers(model):
            attn = convert(attn)
            T.orthogonalize(attn, "vo", attn.vo_dim)
            if qk:
                T.orthogonalize(attn, "qk", attn.qk_dim)
    assert mean_nll(model, x) == pytest.approx(base, abs=1e-4)


def pruned_loss(cli, tmp_path, model, criterion, ratio, targets):
    r = cli("--json", "prune", "--method", "clover", "--model", model, "--set", f"criterion={criterion}",
            "--set", f"ratio={ratio}", "--set", f"targets={targets}", "--eval", "perplexity",
            "--set", "perplexity.max_tokens=4096", "-o", tmp_path)
    assert r.code == 0, r.err
    return r.json()["stages"]


@pytest.mark.parametrize("targets", ['["qk"]', '["vo"]'])
def test_clover_prunes_with_less_loss_than_vanilla(cli, tmp_path, targets):
    for ratio in (0.5, 0.875):
        clover = pruned_loss(cli, tmp_path, "ref:opt-test", "clover", ratio, targets)[1]["metrics"]["nll"]
        vanilla = pruned_loss(cli, tmp_path, "ref:opt-test", "vanilla", ratio, targets)[1]["metrics"]["nll"]
        assert clover < vanilla, (targets, ratio)


def test_pruned_model_is_smaller_keeps_its_scale_and_reloads(cli, tmp_path):
    stages = pruned_loss(cli, tmp_path / "p", "ref:opt-test", "clover", 0.75, '["qk", "vo"]')
    m = stages[0]["metrics"]
    assert m["qk_dim"] == m["vo_dim"] == 4 and m["params_after"] < m["params_before"]
    assert m["kv_bytes_per_token_after"] == m["kv_bytes_per_token_before"] // 4
    model, _ = models.load(m["model_dir"])
    attn = attention_layers(model)[0][1]
    assert attn.k_proj.out_features == 4 * 4 and attn.scaling == pytest.approx(16 ** -0.5)  # original head_dim 16
    r = cli("--json", "eval", "--method", "perplexity", "--model", m["model_dir"], "--set", "max_tokens=4096",
            "-o", tmp_path / "e")
    assert r.json()["stages"][0]["metrics"]["nll"] == pytest.approx(stages[1]["metrics"]["nll"], rel=1e-6)


def test_singular_value_finetuning_trains_cores_and_merges_back(cli, tmp_path):
    stages = pruned_loss(cli, tmp_path / "p", "ref:opt-test", "clover", 0.75, '["qk", "vo"]')
    pruned = stages[0]["metrics"]["model_dir"]
    r = cli("--json", "train", "--method", "clover", "--model", pruned, "--set", "steps=30", "--set", "batch_size=4",
            "--set", "seq_len=64", "--set", "lr=0.01", "-o", tmp_path / "t")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["trainable_params"] == 2 * 2 * 4 * 4 * 4  # layers x pairs x kv heads x 4 x 4 cores
    assert m["train_nll_after"] < m["train_nll_before"]  # the cores learn (held-out gains need bigger models)
    assert m["val_nll_merged"] == pytest.approx(m["val_nll_after"], abs=1e-5)
    assert m["params_after"] == m["params_before"]


def test_bad_input_is_exit_2(cli, tmp_path):
    assert cli("prune", "--method", "clover", "--model", "tiny:llama", "--set", "ratio=1.0", "-o", tmp_path).code == 2
    r = cli("prune", "--method", "clover", "--model", "tiny:mamba2", "-o", tmp_path)
    assert r.code == 2 and "no attention layers" in r.err
    r = cli("prune", "--method", "clover", "--model", "tiny:llama", "--set", 'targets=["qk"]', "-o", tmp_path)
    assert r.code == 2 and "RoPE" in r.err
    assert list(tmp_path.iterdir()) == []
