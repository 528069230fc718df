"""Sequential onloading (``onload: cpu``): decoder blocks in CPU memory, one at a time on the execution device, for
GPTQ's calibration and for evaluation; the same results as the resident model."""

from __future__ import annotations

import copy

import pytest
import torch

from llmx.core.models import onload

GPTQ = {"method": "gptq", "params": {"bits": "w4a16", "group_size": 32, "calib_samples": 4, "calib_seq_len": 32}}
PPL = {"method": "perplexity", "params": {"max_tokens": 256}}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(layers: int = 3, hidden: int = 64):
    from transformers import AutoModelForCausalLM

    from llmx.core.models.archs import config
    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config("llama", vocab_size=len(tok), hidden=hidden, layers=layers))
    return model.eval(), tok


def run(mode: str, model, tok, stages, device: str = "cpu"):
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host

    raw = {"name": "onload", "onload": mode, "device": device, "output_dir": "runs",
           "data": {"source": "stdlib", "seq_len": 32}, "pipeline": copy.deepcopy(stages)}
    return execute(resolve(raw, host().methods), show_progress=False, model=(model, tok))


def state(model) -> dict[str, torch.Tensor]:
    with onload.resident(model):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def blocks_on(model, device: str) -> list[torch.nn.Module]:
    from llmx.core.models.blocks import decoder_blocks

    return [b for b in decoder_blocks(model) if any(t.device.type == device for t in b.state_dict().values())]


@pytest.mark.parametrize("mode", ["cpu", "none"])
def test_at_most_one_block_on_the_device_during_gptq(mode):
    """At every module call of the GPTQ stage (the capture pass, each block's statistics, quantization and
    re-forward), the blocks holding tensors on the target device are counted: one under onloading, every block
    without it (the check is genuine: it fails with onloading off)."""
    model, tok = tiny_llama()
    seen: list[int] = []

    def count(module, _args):
        seen.append(len(blocks_on(model, "cpu")))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        run(mode, model, tok, [GPTQ])
    finally:
        handle.remove()
    assert seen
    assert max(seen) == (1 if mode == "cpu" else 3)
    if mode == "cpu":  # after the stage: every block offloaded, its packed layers in the CPU store
        assert not blocks_on(model, "cpu") and model.model.embed_tokens.weight.device.type == "cpu"
        store = onload.handle(model.model.layers[0]).store
        assert any(k.endswith("q_proj.qweight") for k in store) and not any(k.endswith("q_proj.weight") for k in store)
        assert all(t.device.type == "cpu" for t in store.values())


@pytest.mark.parametrize("stage", [GPTQ, {"method": "guidedquant", "params": {
    "bits": "w4a16", "backend": "gptq", "guided": False, "group_size": 32, "calib_samples": 4, "calib_seq_len": 32}}],
    ids=["gptq", "guidedquant-gptq"])
def test_quantized_model_with_onloading_equals_the_resident_one(stage):
    """Every tensor of the quantized model (codes, scales, the float layers) and the perplexity after it are the
    same bit for bit with and without onloading."""
    model, tok = tiny_llama()
    plain = run("none", copy.deepcopy(model), tok, [stage, PPL])
    onl = run("cpu", copy.deepcopy(model), tok, [stage, PPL])
    a, b = state(plain.model), state(onl.model)
    assert a.keys() == b.keys() and any(k.endswith("qweight") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain.stages[1]["metrics"]["perplexity"] == onl.stages[1]["metrics"]["perplexity"]
    assert (onl.path / "artifacts" / f"0_{stage['method']}" / "model" / "model.safetensors").is_file()


def test_eval_with_onloading_equals_resident():
    """Perplexity and greedy generation through the onloading hooks are those of the resident model."""
    model, tok = tiny_llama()
    stages = [PPL, {"method": "generate", "params": {"prompt": "def f(", "max_new_tokens": 8}}]
    plain = run("none", copy.deepcopy(model), tok, stages)
    onl = run("cpu", copy.deepcopy(model), tok, stages)
    assert [s["metrics"] for s in plain.stages] == [s["metrics"] for s in onl.stages]
    assert not blocks_on(onl.model, "cpu")


def test_a_block_changed_while_held_keeps_its_new_tensors():
    """Writes inside ``held(write_back=True)`` reach the CPU store; a slot reassigned while held is kept even without
    it; outside ``held`` the block is meta again, and so is a layer taken out of it meanwhile."""
    model, _ = tiny_llama(layers=2)
    onload.attach(model, "cpu")
    block = model.model.layers[1]
    old = block.mlp.down_proj
    with onload.held(block, write_back=True):
        block.mlp.up_proj.weight.data.zero_()
        block.mlp.down_proj = torch.nn.Linear(old.in_features, old.out_features, bias=False)
    assert old.weight.is_meta and block.mlp.down_proj.weight.is_meta
    with onload.held(block):
        block.self_attn.o_proj.weight = torch.nn.Parameter(torch.ones_like(block.self_attn.o_proj.weight))
    assert block.mlp.up_proj.weight.is_meta and block.self_attn.o_proj.weight.is_meta
    with onload.held(block):
        assert not block.mlp.up_proj.weight.any() and bool((block.self_attn.o_proj.weight == 1).all())


@pytest.mark.parametrize("args", [["quantize", "--method", "rtn"], ["prune", "--method", "clover"],
                                  ["quantize", "--method", "guidedquant"]])
def test_a_method_that_cannot_onload_is_a_usage_error(cli, args):
    r = cli(*args, "--model", "tiny:llama", "--onload", "cpu")
    assert r.code == 2
    line = r.err.strip()
    assert "\n" not in line and "cannot run with onload cpu" in line and args[2] in line


def test_help_shows_the_flag_with_an_example(cli):
    r = cli("quantize", "--help")
    assert r.code == 0 and "--onload" in r.out and "--onload cpu" in r.out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gptq_on_cuda_holds_about_one_block():
    """Weights on the CPU, execution on CUDA: the stage's peak CUDA memory (above what was held before it) is a few
    blocks' worth (one block, its Hessians, GPTQ's work, the dequantized re-forward and the activations), far below
    the 32-block model the resident run holds; the codes and the perplexity match the resident CUDA run."""
    pytest.importorskip("cupy")  # GPTQ's CUDA path
    model, tok = tiny_llama(layers=32, hidden=512)
    block_bytes = sum(t.numel() * t.element_size() for t in model.model.layers[0].state_dict().values())
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    peaks, results = {}, {}
    for mode in ("none", "cpu"):
        m = copy.deepcopy(model)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        results[mode] = run(mode, m.to("cuda") if mode == "none" else m, tok, [GPTQ, PPL], device="cuda")
        torch.cuda.synchronize()
        peaks[mode] = torch.cuda.max_memory_allocated() - base
        del m
    figures = {"peaks": peaks, "block_bytes": block_bytes, "model_bytes": model_bytes}
    assert peaks["none"] >= model_bytes, figures
    assert peaks["cpu"] < 8 * block_bytes < model_bytes / 4, figures
    a, b = state(results["none"].model), state(results["cpu"].model)
    codes = [k for k in a if k.endswith("qweight")]
    assert codes and all((a[k] != b[k]).float().mean() <= 0.01 for k in codes)
    ppl = [results[m].stages[1]["metrics"]["perplexity"] for m in ("none", "cpu")]
    assert ppl[1] == pytest.approx(ppl[0], rel=1e-3)
