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
