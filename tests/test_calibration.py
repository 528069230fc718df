"""Sequential calibration: each block runs on cached block inputs (O(L) block calls, not a whole model per block),
with the same statistics the whole-model passes give, one Hessian per distinct input, on Llama and Mamba2; true
sequential: each group of a block's layers calibrated through the block's quantized earlier groups."""

from __future__ import annotations

import copy

import pytest
import torch

from llmx.core import models
from llmx.core.models.linear import linear_layers
from llmx.core.quant.calibration import collect, decoder_blocks, sequential
from llmx.core.quant.formats import IntFormat, fake_quantize


def _setup(name):
    model = models.load(name)[0]
    torch.manual_seed(0)
    return model, linear_layers(model, []), torch.randint(0, 200, (10, 24))


def _fake_quantize_block(block, _stats):
    for lin in block.values():
        lin.weight.data = fake_quantize(lin.weight.data, IntFormat(2, 16, full_range=True))


def _check_against_whole_model_passes(model, layers, batches, rtol, true_sequential=False):
    """Quantized propagation against the old O(L^2) algorithm: before quantizing a block (or, true sequential, a
    group of its layers), run the whole (partly quantized) model and compare those layers' Hessians."""
    reference = {}

    def quantize(block, stats):
        reference.update(collect(model, block, batches))
        for n in block:
            assert torch.allclose(stats[n].hessian, reference[n].hessian, rtol=rtol,
                                  atol=rtol * float(reference[n].hessian.abs().max())), n
        _fake_quantize_block(block, stats)

    sequential(model, layers, batches, quantize, propagate="quantized", true_sequential=true_sequential)
    assert reference.keys() == layers.keys()


@pytest.mark.parametrize("name", ["tiny:llama", "tiny:mamba2"])
def test_fp_statistics_equal_one_whole_model_pass(name):
    model, layers, batches = _setup(name)
    full = collect(model, layers, batches)
    got = {}
    sequential(model, layers, batches, lambda block, stats: got.update(stats), propagate="fp")
    assert got.keys() == layers.keys()
    for n in layers:
        assert torch.allclose(got[n].hessian, full[n].hessian, rtol=1e-9, atol=1e-9 * float(full[n].hessian.abs().max()))
        assert got[n].tokens == full[n].tokens and got[n].absmax == pytest.approx(full[n].absmax)


@pytest.mark.parametrize("name", ["tiny:llama", "tiny:mamba2"])
def test_quantized_statistics_equal_rerunning_the_whole_model_per_block(name):
    _check_against_whole_model_passes(*_setup(name), rtol=1e-6)


@pytest.mark.parametrize("name", ["tiny:llama", "tiny:mamba2"])
def test_true_sequential_statistics_equal_rerunning_the_whole_model_per_group(name):
    _check_against_whole_model_passes(*_setup(name), rtol=1e-6, true_sequential=True)


def test_true_sequential_takes_the_reference_groups_and_later_hessians_see_quantized_outputs():
    """Groups in the reference llama.py's order (q/k/v, o, gate/up, down); the first group's Hessian is the
    one-pass Hessian (same inputs), every later group's differs: it reads outputs of quantized layers."""
    model, layers, batches = _setup("tiny:llama")
    layers.pop("lm_head")
    one_pass, groups = {}, []
    twin = copy.deepcopy(model)

    def record_one_pass(block, stats):
        one_pass.update({n: s.hessian.clone() for n, s in stats.items()})
        _fake_quantize_block(block, stats)

    def record_group(block, stats):
        groups.append({n: stats[n].hessian.clone() for n in block})
        _fake_quantize_block(block, stats)

    sequential(twin, linear_layers(twin, ["lm_head"]), batches, record_one_pass)
    sequential(model, layers, batches, record_group, true_sequential=True)
    parts = [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
             ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]
    blocks = len(decoder_blocks(model, layers))
    assert [list(g) for g in groups] == [[f"model.layers.{i}.{n}" for n in part] for i in range(blocks) for part in parts]
    for k, group in enumerate(groups):
        for n, h in group.items():
            gap = float((h - one_pass[n]).abs().max() / one_pass[n].abs().max())
            assert gap < 1e-6 if k % len(parts) == 0 else gap > 1e-3, (n, gap)
    with pytest.raises(ValueError, match="propagate='quantized'"):
        sequential(model, layers, batches, record_group, propagate="fp", true_sequential=True)


def test_true_sequential_gptq_is_not_worse_end_to_end():
    """GPTQ W3 g32 on a trained model: true sequential's logits are no farther from the float model's on held-out
    windows than one pass's."""
    import llmx
    from llmx.core.data import random_windows

    base, tok = models.load("ref:llama-test")
    held_out = random_windows(tok, "stdlib", 16, 64, seed=1, split="validation")
    with torch.no_grad():
        reference = base(input_ids=held_out).logits
    error = {}
    for flag in (False, True):
        model, _ = llmx.quantize(copy.deepcopy(base), tokenizer=tok, method="gptq", bits="w3a16", group_size=32,
                                 symmetric=False, calib_samples=16, calib_seq_len=64, save=False, true_sequential=flag)
        with torch.no_grad():
            error[flag] = float(((model(input_ids=held_out).logits - reference) ** 2).mean())
    assert error[True] <= error[False], error


def test_each_block_runs_once_per_chunk_plus_once_after_quantizing(monkeypatch):
    model, layers, batches = _setup("tiny:llama")
    calls = {}
    blocks = decoder_blocks(model, layers)
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda *_a, i=i: calls.__setitem__(i, calls.get(i, 0) + 1))
    layers.pop("lm_head")
    sequential(model, layers, batches, _fake_quantize_block, propagate="quantized")
    chunks = -(-len(batches) // 8)
    assert calls == {i: 3 * chunks for i in range(len(blocks))}  # the recording pass, the statistics, after quantizing


def test_each_block_gets_its_own_arguments(monkeypatch):
    """Qwen2 with a sliding window on every other layer passes those layers another mask: the recorded arguments
    must be each block's, not block 0's for all."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=4, vocab_size=200, use_sliding_window=True, sliding_window=6,
                         max_window_layers=0, layer_types=["sliding_attention", "full_attention"] * 2,
                         attn_implementation="eager")
    model = Qwen2ForCausalLM(config).eval()
    _check_against_whole_model_passes(model, linear_layers(model, ["lm_head"]), torch.randint(0, 200, (4, 24)), rtol=1e-5)


def test_a_layer_no_token_reaches_gets_empty_statistics():
    model, layers, batches = _setup("tiny:mamba")  # transformers' Mamba1 reads dt_proj.weight directly
    got = {}
    sequential(model, layers, batches, lambda block, stats: got.update(stats), propagate="fp")
    dt = [n for n in layers if n.endswith("dt_proj")]
    assert dt and all(got[n].hessian is None and got[n].tokens == 0 for n in dt)
    assert all(got[n].hessian is not None for n in layers if n not in dt and n != "lm_head")


def test_layers_reading_one_input_share_one_hessian():
    model, layers, batches = _setup("tiny:llama")
    got = {}
    sequential(model, layers, batches, lambda block, stats: got.update(stats), propagate="fp")
    attn = [got[f"model.layers.0.self_attn.{p}_proj"] for p in "qkv"]
    assert attn[0] is attn[1] is attn[2]
    assert got["model.layers.0.mlp.gate_proj"] is got["model.layers.0.mlp.up_proj"]
    assert got["model.layers.0.self_attn.o_proj"] is not attn[0] and got["model.layers.0.mlp.down_proj"] is not attn[0]


def _packed_run(monkeypatch, cached: bool):
    """Sequential calibration installing real packed W4 g16 layers; the Hessians every block saw, the final logits
    and how often a packed weight was dequantized."""
    import contextlib

    from llmx.core.quant import calibration
    from llmx.core.quant.formats import quantize
    from llmx.core.quant.qlinear import QuantLinear

    model, layers, batches = _setup("tiny:llama")
    layers.pop("lm_head")
    fmt, seen, built = IntFormat(4, 16, full_range=True), {}, []
    if not cached:  # the path before issue 65: unpack and dequantize on every chunk
        monkeypatch.setattr(calibration, "dequantized_once", lambda _block: contextlib.nullcontext())
    plain = QuantLinear.dequantized_weight
    monkeypatch.setattr(QuantLinear, "dequantized_weight", lambda self, *a, **k: built.append(self) or plain(self, *a, **k))

    def quantize_block(block, stats):
        seen.update({n: s.hessian.clone() for n, s in stats.items()})
        for name, lin in block.items():
            model.set_submodule(name, QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt))

    sequential(model, layers, batches, quantize_block, propagate="quantized")
    packed = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(packed) == len(layers) and not any("dequantized_weight" in vars(m) for m in packed)
    calls = len(built)
    with torch.no_grad():
        logits = model(input_ids=batches).logits
    return seen, logits, calls, len(packed), -(-len(batches) // 8)


def test_the_reforward_dequantizes_each_packed_weight_once_with_the_same_numbers(monkeypatch):
    """After quantizing a block its outputs (the next block's inputs) are recomputed with each packed weight
    dequantized once for all chunks: every Hessian and the final logits equal, bit for bit, those of the per-chunk
    exact path."""
    seen, logits, calls, layers, chunks = _packed_run(monkeypatch, cached=True)
    seen_before, logits_before, calls_before, _, _ = _packed_run(monkeypatch, cached=False)
    assert chunks > 1 and calls == layers and calls_before == layers * chunks
    assert seen.keys() == seen_before.keys() and all(torch.equal(seen[n], seen_before[n]) for n in seen)
    assert torch.equal(logits, logits_before)
