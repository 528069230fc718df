"""Groundwork for Quamba2: the llmx Mamba2 mixer reproduces transformers' on the same weights."""

from __future__ import annotations

import pytest
import torch

from llmx.core import models
from llmx.plugins.quamba2.mixer import Mamba2Reference


@pytest.mark.parametrize("name", ["tiny:mamba2", "ref:mamba2-test"])
def test_mixer_matches_transformers(name):
    model, _ = models.load(name)
    torch.manual_seed(0)
    for layer in model.backbone.layers:
        hf = layer.mixer
        ours = Mamba2Reference(hf)
        h = torch.randn(2, 70, model.config.hidden_size) * 0.5  # 70 > chunk_size 64: crosses a chunk boundary
        with torch.no_grad():
            assert (ours(h) - hf(h)).abs().max() < 1e-4


def test_quantization_points_see_the_named_tensors():
    model, _ = models.load("tiny:mamba2")
    mixer = Mamba2Reference(model.backbone.layers[0].mixer)
    seen = {}
    for point in ("x", "B", "C", "dt", "ssm_out"):
        mixer.points[point] = lambda t, p=point: seen.setdefault(p, t.shape) and t
    with torch.no_grad():
        mixer(torch.randn(1, 9, model.config.hidden_size))
    cfg = model.config
    assert seen["x"][-1] == cfg.expand * cfg.hidden_size and seen["B"][-1] == cfg.n_groups * cfg.state_size
    assert seen["dt"][-1] == cfg.num_heads and seen["ssm_out"][-1] == cfg.expand * cfg.hidden_size


def grouped_mamba2():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, state_size=16, expand=2, head_dim=16,
                       num_heads=8, n_groups=2, conv_kernel=4, chunk_size=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    return Mamba2ForCausalLM(cfg).eval()


def test_rearrangement_leaves_the_output_unchanged_and_a_wrong_one_does_not():
    from llmx.plugins.quamba2 import reorder

    model = grouped_mamba2()
    ids = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        base = model(input_ids=ids).logits
    mixer = model.backbone.layers[0].mixer
    gen = torch.Generator().manual_seed(1)
    heads = torch.cat([torch.randperm(4, generator=gen), 4 + torch.randperm(4, generator=gen)])
    within = torch.stack([torch.randperm(16, generator=gen) for _ in range(8)])
    reorder.apply(mixer, heads, within)
    with torch.no_grad():
        assert (model(input_ids=ids).logits - base).abs().max() < 1e-4
    with pytest.raises(ValueError, match="across SSD group"):
        reorder.apply(mixer, torch.tensor([4, 1, 2, 3, 0, 5, 6, 7]), within)
    wrong = grouped_mamba2()  # rearrange everything but the z rows: the output must change
    m = wrong.backbone.layers[0].mixer
    original_z = m.in_proj.weight[: m.intermediate_size].clone()
    with torch.no_grad():
        reorder.apply(m, heads, within)
        m.in_proj.weight[: m.intermediate_size] = original_z
        assert (wrong(input_ids=ids).logits - base).abs().max() > 1e-2
