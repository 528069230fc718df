"""The llmx Mamba / Mamba2 mixers reproduce transformers' on the same weights (forward, and cached decoding), and
Quamba2's offline rearrangement leaves the model function unchanged while a wrong one does not."""

from __future__ import annotations

import pytest
import torch

from llmx.core import models
from llmx.plugins.quamba2 import mixers, reorder


@pytest.mark.parametrize("name", ["tiny:mamba2", "ref:mamba2-test", "tiny:mamba", "ref:mamba-test"])
def test_mixer_matches_transformers(name):
    model, _ = models.load(name)
    torch.manual_seed(0)
    hf_cls, cls = mixers.hf_mixers()[model.config.model_type]
    for layer in model.backbone.layers:
        h = torch.randn(2, 70, model.config.hidden_size) * 0.5  # 70 > chunk_size 64: crosses a chunk boundary
        with torch.no_grad():
            assert (cls(layer.mixer)(h) - layer.mixer(h)).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["tiny:mamba2", "tiny:mamba"])
def test_converted_model_matches_and_decodes_with_the_cache(name):
    model, _ = models.load(name)
    ids = torch.randint(3, 200, (2, 12))
    with torch.no_grad():
        ref_logits = model(input_ids=ids).logits
        ref_gen = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
        mixers.convert(model)
        assert all(isinstance(layer.mixer, mixers.QuantMixer) for layer in model.backbone.layers)
        assert (model(input_ids=ids).logits - ref_logits).abs().max() < 1e-4
        assert torch.equal(model.generate(input_ids=ids, max_new_tokens=6, do_sample=False), ref_gen)


def test_quantization_points_see_the_named_tensors():
    model, _ = models.load("tiny:mamba2")
    mixer = mixers.convert(model)[0]
    seen = {}

    class Spy(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, t):
            seen[self.name] = t.shape
            return t

    for point in mixers.Mamba2Mixer.POINTS:
        mixer.points[point] = Spy(point)
    with torch.no_grad():
        mixer(torch.randn(1, 9, model.config.hidden_size))
    cfg = model.config
    assert set(seen) == set(mixers.Mamba2Mixer.POINTS) - {"state"}  # the state passes its point only into a cache
    assert seen["x"][-1] == cfg.expand * cfg.hidden_size and seen["B"][-1] == cfg.n_groups * cfg.state_size
    assert seen["dt"][-1] == cfg.num_heads and seen["ssm_out"][-1] == cfg.expand * cfg.hidden_size


def grouped_mamba2():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    cfg = Mamba2Config(vocab_size=64, hidden_size=64, num_hidden_layers=1, state_size=16, expand=2, head_dim=16,
                       num_heads=8, n_groups=2, conv_kernel=4, chunk_size=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(cfg).eval()
    mixers.convert(model)
    return model


def test_rearrangement_leaves_the_output_unchanged_and_a_wrong_one_does_not():
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
    original_z = m.in_proj.weight[: m.inner].clone()
    with torch.no_grad():
        reorder.apply(m, heads, within)
        m.in_proj.weight[: m.inner] = original_z
        assert (wrong(input_ids=ids).logits - base).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["tiny:mamba2", "tiny:mamba"])
def test_scan_builds_its_terms_a_chunk_of_steps_at_a_time(name, monkeypatch):
    """Memory: the decay and input terms exist for one chunk of steps, never batch x length x state; the result does
    not depend on the chunk."""
    model, _ = models.load(name)
    mixer = mixers.convert(model)[0]
    torch.manual_seed(0)
    h = torch.randn(2, 37, model.config.hidden_size) * 0.5
    with torch.no_grad():
        whole = mixer(h)
        widths = []
        real = mixers.recurrence

        def spy(parts, steps, h0, track_peak, chunk=mixers.CHUNK):
            def recorded(s, e):
                out = parts(s, e)
                widths.append(out[1].shape[1])
                return out
            return real(recorded, steps, h0, track_peak, chunk=5)

        monkeypatch.setattr(mixers, "recurrence", spy)
        chunked = mixer(h)
    assert widths == [5] * 7 + [2]
    assert torch.allclose(chunked, whole, atol=1e-6)
