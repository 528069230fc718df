"""Training on torch's engines under two gloo processes, against one process with the same global batch:

- ``strategy: ddp`` ends with the same weights bit for bit (two ranks' gradients summed are the one process's
  two-term sum; the engine's division by 2 is exact), for sft, dpo and a LoRA adapter with dropout 0.3 (each
  micro-batch's masks are seeded by its global index, not by the rank that ran it);
- ``strategy: fsdp``, with two micro-batches a rank (reduce-scattered one by one, accumulated as shards) against
  four in one process, ends within 1e-4 (sums in another order, which Adam scales up where gradients are small; a
  missing reduction moves weights by ~lr = 1e-2), and writes sharded safetensors that plain transformers loads;
- a fsdp run killed at step 2 and resumed in one process (another world size, no process group) from its
  distributed checkpoint ends where the uninterrupted run does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_ddp import write_data

STEPS = 4


def specs(data: Path, strategy: str) -> dict[str, dict]:
    common = {"steps": STEPS, "batch_size": 2, "warmup": 1, "lr": 1e-2, "strategy": strategy}
    sft = {**common, "data": str(data / "rows.jsonl"), "max_length": 32, "max_prompt_length": 16}
    return {
        "sft": {"method": "sft", "params": sft},
        "dpo": {"method": "dpo", "params": {**common, "data": str(data / "pairs.jsonl"), "max_len": 32}},
        "lora": {"method": "sft", "params": {**sft, "adapter": "lora", "lora": {"dropout": 0.3, "merge": True,
                                                                               "target_modules": "all-linear"}}},
    }


def run(runs: dict[str, dict], out: Path, accum: int, model: str = "tiny:llama",
        device: str = "cpu") -> dict[str, str]:
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host

    folders = {}
    for name, stage in runs.items():
        stage = json.loads(json.dumps(stage))
        stage["params"].setdefault("grad_accum", accum)
        raw = {"model": model, "output_dir": str(out / name), "seed": 3, "threads": 1, "device": device,
               "pipeline": [stage]}
        metrics = execute(resolve(raw, host().methods), show_progress=False).stages[0]["metrics"]
        folders[name] = metrics.get("model_dir", "")
        folders[name + ".metrics"] = metrics
        folders[name + ".checkpoints"] = str(Path(metrics.get("model_dir") or ".").parent / "checkpoints")
    return folders


def _worker(rank: int, size: int, init: str, runs: str, out: str, model: str, device: str) -> None:
    import os

    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo", init_method=init, rank=rank,
                                         world_size=size)
    torch.set_num_threads(1)
    from llmx.core import plugins

    plugins.configure([])
    whole: list[int] = []
    if device == "cpu":  # what the loop starts with: no tensor FSDP replaced by its shard may still be alive
        import gc
        import weakref

        from llmx.core.train import parallel, stage

        train, shard, originals = stage.train, parallel.shard, []

        def sharding(model, *args, **kwargs):
            originals.extend(weakref.ref(p) for p in model.parameters())
            return shard(model, *args, **kwargs)

        def counting(*args, **kwargs):
            gc.collect()
            whole.append(sum(r() is not None for r in originals))
            originals.clear()
            return train(*args, **kwargs)

        stage.train, parallel.shard = counting, sharding
    try:
        folders = run(json.loads(runs), Path(out), accum=1, model=model, device=device)
        folders["unsharded_trained"] = whole
        if device == "cuda":
            folders["peak_bytes"] = torch.cuda.max_memory_allocated()
        if rank == 0:
            (Path(out) / "folders.json").write_text(json.dumps(folders))
    finally:
        torch.distributed.destroy_process_group()


def two_processes(tmp_path: Path, runs: dict[str, dict], name: str, size: int = 2, model: str = "tiny:llama",
                  device: str = "cpu") -> dict:
    out = tmp_path / name
    out.mkdir()
    torch.multiprocessing.spawn(_worker, args=(size, f"file://{tmp_path / (name + '.store')}", json.dumps(runs),
                                               str(out), model, device), nprocs=size, join=True)
    return json.loads((out / "folders.json").read_text())


def weights(folder: str) -> dict[str, torch.Tensor]:
    files = sorted(Path(folder).glob("*.safetensors"))
    assert files, folder
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def compare(a: str, b: str, exact: bool) -> float:
    left, right = weights(a), weights(b)
    assert set(left) == set(right)
    worst = max(float((left[k] - right[k]).abs().max()) for k in right)
    if exact:
        assert all(torch.equal(left[k], right[k]) for k in right), worst
    return worst


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    write_data(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_end_with_the_weights_of_one(tmp_path, data, strategy):
    from llmx.core.models.archs import build_random

    accum = 1 if strategy == "ddp" else 2
    runs = specs(data, strategy)
    for stage in runs.values():
        stage["params"]["grad_accum"] = accum
    sharded = two_processes(tmp_path, runs, "two")
    single = run(specs(data, "ddp"), tmp_path / "one", accum=2 * accum)
    fresh = build_random("llama")[0].state_dict()
    if strategy == "fsdp":  # the trained tensors the loop began with were all shards
        assert sharded["unsharded_trained"] == [0] * len(runs), sharded["unsharded_trained"]
    for name in runs:
        worst = compare(sharded[name], single[name], exact=strategy == "ddp")
        assert worst < 1e-4, (name, worst)
        trained = weights(single[name])
        assert any(not torch.equal(fresh[k], v) for k, v in trained.items() if k in fresh), name


@pytest.mark.slow
def test_a_fsdp_run_killed_and_resumed_in_one_process_ends_as_the_uninterrupted_one(tmp_path, data):
    from transformers import AutoModelForCausalLM

    runs = {"sft": specs(data, "fsdp")["sft"]}
    runs["sft"]["params"].update(stop_after=2)
    cut = two_processes(tmp_path, runs, "cut")
    checkpoints = Path(cut["sft.checkpoints"])
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_2"]
    assert len(list((checkpoints / "step_2").glob("*.distcp"))) == 2  # each rank wrote its own shard
    again = specs(data, "ddp")["sft"]
    again["params"].update(resume=str(checkpoints))
    resumed = run({"sft": again}, tmp_path / "resumed", accum=2)
    straight = run({"sft": specs(data, "ddp")["sft"]}, tmp_path / "straight", accum=2)
    assert compare(resumed["sft"], straight["sft"], exact=False) < 1e-6
    plain = AutoModelForCausalLM.from_pretrained(cut["sft"])  # the fsdp run's model loads in plain transformers
    assert plain.config.num_hidden_layers == 2


def test_sharded_safetensors_stream_one_shard_at_a_time_and_load_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    from llmx.core.models import shards
    from llmx.core.models.archs import build_random

    model = build_random("llama")[0]
    biggest = max(t.numel() * t.element_size() for t in model.state_dict().values())
    held = []

    def gather(t: torch.Tensor) -> torch.Tensor:
        held.append(t.numel() * t.element_size())
        return t

    model.config.save_pretrained(tmp_path)
    written = shards.write(model.state_dict().items(), tmp_path, shard_bytes=biggest, gather=gather)
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(written.values()) == set(files)
    assert all(p.stat().st_size < 2 * biggest for p in tmp_path.glob("*.safetensors"))  # never more than a shard
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert shards.write(model.state_dict().items(), None, gather=gather) == {}  # a rank that only gathers


def real_width_model(folder: Path) -> str:
    """A Llama with real widths (hidden 2048, GQA 16/4 heads, attention biases as Qwen2), random, saved with the tiny
    model's tokenizer: what a 1B user trains."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmx.core import models
    from llmx.core.models.archs import build_random

    _, tok = build_random("llama")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                         num_attention_heads=16, num_key_value_heads=4, attention_bias=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    models.save(LlamaForCausalLM(config), tok, folder, {"source": "test"})
    return str(folder)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_on_one_gpu_with_bf16_gathers_and_offload(tmp_path, data):
    """One GPU, world size 1 (as under ``torchrun --nproc-per-node 1``): fsdp with bf16-mixed, with and without
    offload, on a real-width model; offload holds less on the device; the planner's estimate beside the peaks."""
    import os

    from llmx.core.models.meta import model_config
    from llmx.core.train.plan import plan_stage
    from llmx.core.train.sft.params import SFTParams

    model = real_width_model(tmp_path / "model")
    peaks, plans = {}, {}
    for offload in (False, True):
        runs = {k: v for k, v in specs(data, "fsdp").items() if k in ("sft", "dpo")}  # dpo: a sharded reference
        for stage in runs.values():
            stage["params"].update(precision="bf16-mixed", gradient_checkpointing=True, offload=offload, steps=2)
        done = two_processes(tmp_path, runs, f"offload_{offload}", size=1, model=model, device="cuda")
        peaks[offload] = done["peak_bytes"]
        for name in runs:
            loss = done[f"{name}.metrics"]["final_loss"]
            assert loss == loss, name  # finite, not NaN
            weights(done[name])
        config = model_config(model)
        plans[offload] = plan_stage(config, SFTParams(**runs["sft"]["params"]), 1, method="sft").as_dict()
    assert peaks[True] < peaks[False], peaks
    if os.environ.get("GPU_CHECK_REPORT"):
        with open(os.environ["GPU_CHECK_REPORT"], "a") as f:
            f.write(json.dumps({"memory": "fsdp one GPU", "model": "Llama 4 layers, hidden 2048, GQA 16/4, biases",
                                "peak_bytes": {"offload": peaks[True], "resident": peaks[False]},
                                "plan": plans, "device": torch.cuda.get_device_name()}) + "\n")
