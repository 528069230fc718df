"""The attention layouts users' models have: Qwen2 (GQA, biased q/k/v), GPT-2 (learned positions, a fused c_attn
in transformers' Conv1D), at the zoo's widths and at real ones."""

from __future__ import annotations

import pytest
import torch

from llmx.core.models import archs
from llmx.core.models.linear import as_linear, linear_layers


def test_qwen2_has_gqa_and_biases_on_qkv_only():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(archs.config("qwen2", 300, hidden=128, heads=8, kv_heads=2))
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    assert attn.o_proj.bias is None
    assert attn.k_proj.out_features == 2 * 128 // 8 and attn.q_proj.out_features == 128


def test_conv1d_becomes_the_equal_linear():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    conv = Conv1D(48, 16)
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(3, 5, 16)
    lin = as_linear(conv)
    assert (lin.in_features, lin.out_features) == (16, 48)
    torch.testing.assert_close(lin(x), conv(x))


def test_gpt2_weight_methods_see_every_projection_and_keep_the_function():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(archs.config("gpt2", 300, hidden=64, layers=2)).eval()
    x = torch.randint(0, 300, (2, 12))
    with torch.no_grad():
        before = model(x).logits
    layers = linear_layers(model, skip=["lm_head"])
    assert sorted(n.split(".", 3)[-1] for n in layers) == sorted(["attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                  "mlp.c_proj"] * 2)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, before)


def test_quantized_gpt2_saves_and_loads_to_the_same_logits(cli, tmp_path):
    from llmx.core import models

    r = cli("--json", "quantize", "--method", "rtn", "--bits", "w4a16", "--model", "tiny:gpt2", "-o", tmp_path)
    assert r.code == 0, r.err
    metrics = r.json()["stages"][0]["metrics"]
    assert metrics["layers"] == 8  # 2 blocks x (c_attn, attn.c_proj, c_fc, mlp.c_proj); lm_head skipped
    fp, _ = models.load("tiny:gpt2")
    q, _ = models.load(metrics["model_dir"])
    x = torch.randint(0, 259, (1, 16))
    with torch.no_grad():
        diff = (q(x).logits - fp(x).logits).abs().max()
    assert 0 < diff < 1.0  # quantized (not the FP weights), and still the same function roughly


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "opt", "moe"])
def test_real_widths_build_and_run(arch):
    """hidden 2048 with 16 heads (GQA 16:4 where the layout has it), one layer: the shapes users' models have."""
    from transformers import AutoModelForCausalLM

    kv = None if arch in archs.NO_GQA else 4
    config = archs.config(arch, 512, hidden=2048, layers=1, heads=16, kv_heads=kv, max_positions=256)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert sum(p.numel() for p in model.parameters()) > 10_000_000
    with torch.no_grad():
        logits = model(torch.randint(0, 512, (2, 8))).logits
    assert logits.shape == (2, 8, 512) and torch.isfinite(logits).all()


def test_shape_checks_name_the_problem():
    assert "do not divide hidden" in archs.check_shape("llama", 100, 3, None)
    assert "must be even" in archs.check_shape("llama", 96, 32, None)  # head width 3
    assert "kv_heads must be 4" in archs.check_shape("gpt2", 64, 4, 2)
    assert archs.check_shape("qwen2", 2048, 16, 4) is None and archs.check_shape("mamba2", 64, 3, None) is None
