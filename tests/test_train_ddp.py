"""Data parallelism in every stage that trains (lm, sft, align, CLOVER; SFT also packed with a LoRA adapter): two gloo
processes with two micro-batches each see disjoint micro-batches and end with the weights of one process with four."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

STEPS, BATCH = 3, 2


def stages(data: Path) -> dict[str, dict]:
    common = {"steps": STEPS, "batch_size": BATCH, "warmup": 1, "lr": 1e-2}
    return {
        "lm": {"method": "lm", "params": {**common, "init": "scratch", "data": str(data / "corpus.txt"), "seq_len": 16,
                                          "eval_every": None}},
        "sft": {"method": "sft", "params": {**common, "data": str(data / "rows.jsonl"), "max_length": 32,
                                            "max_prompt_length": 16}},
        "sft-lora-packed": {"method": "sft", "params": {**common, "data": str(data / "rows.jsonl"), "max_length": 32,
                                                        "max_prompt_length": 16, "packing": True, "adapter": "lora",
                                                        "lora": {"merge": True, "target_modules": "all-linear"}}},
        "align": {"method": "dpo", "params": {**common, "data": str(data / "pairs.jsonl"), "max_len": 32}},
        "clover": {"method": "clover", "stage": "train",
                   "params": {**common, "seq_len": 16, "eval_windows": 2}},  # dropout masks seeded per micro-batch
    }


def write_data(folder: Path) -> None:
    import json as module

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.txt").write_text(inspect.getsource(module.decoder) * 2)
    (folder / "rows.jsonl").write_text("".join(
        json.dumps({"prompt": f"n = {i} #", "completion": f" {i * i}"}) + "\n" for i in range(40)))
    (folder / "pairs.jsonl").write_text("".join(
        json.dumps({"prompt": f"x{i} =", "chosen": f" {i}", "rejected": f" {i + 1}"}) + "\n" for i in range(40)))


def run_all(data: Path, out: Path, accum: int, record: Path | None = None) -> dict[str, Path]:
    """Each stage as its own run; returns the saved model folder of each (rank 0)."""
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host
    from llmx.core.train import loop

    seen: dict[str, list[int]] = {}
    original = loop.micro_index
    folders = {}
    for name, stage in stages(data).items():
        stage = json.loads(json.dumps(stage))
        stage["params"]["grad_accum"] = accum
        seen[name] = []

        def spy(*args, _name=name):
            i = original(*args)
            seen[_name].append(i)
            return i

        loop.micro_index = spy
        try:
            raw = {"model": "tiny:llama", "output_dir": str(out / name), "seed": 3, "threads": 1,
                   "data": {"source": str(data / "corpus.txt")}, "pipeline": [stage]}
            result = execute(resolve(raw, host().methods), show_progress=False)
        finally:
            loop.micro_index = original
        folders[name] = Path(result.stages[0]["metrics"].get("model_dir", ""))
    if record is not None:
        record.write_text(json.dumps(seen))
    return folders


def _worker(rank: int, size: int, init: str, data: str, out: str) -> None:
    import os

    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    torch.set_num_threads(1)
    from llmx.core import plugins

    plugins.configure([])
    try:
        folders = run_all(Path(data), Path(out), accum=2, record=Path(out) / f"seen_{rank}.json")
        if rank == 0:
            (Path(out) / "folders.json").write_text(json.dumps({k: str(v) for k, v in folders.items()}))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_see_disjoint_batches_and_match_one_with_twice_the_accumulation(tmp_path):
    data = tmp_path / "data"
    write_data(data)
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    torch.multiprocessing.spawn(_worker, args=(2, f"file://{tmp_path / 'store'}", str(data), str(ddp)), nprocs=2,
                                join=True)
    from llmx.core.models.archs import build_random

    single = run_all(data, tmp_path / "single", accum=4, record=tmp_path / "seen_single.json")
    ranks = [json.loads((ddp / f"seen_{r}.json").read_text()) for r in range(2)]
    one = json.loads((tmp_path / "seen_single.json").read_text())
    folders = {k: Path(v) for k, v in json.loads((ddp / "folders.json").read_text()).items()}
    for name in stages(data):
        a, b = set(ranks[0][name]), set(ranks[1][name])
        assert not a & b, name  # no micro-batch is seen by both ranks
        assert sorted(a | b) == sorted(one[name]) == list(range(STEPS * 4)), name
        left, right = load_file(str(folders[name] / "model.safetensors")), load_file(str(single[name] / "model.safetensors"))
        for key, value in right.items():
            # two micro-batches a rank sum in another order than four in one process; Adam scales the rounding up
            # where gradients are small (a missing reduction moves weights by ~lr = 1e-2; test_train_sharded checks
            # bit-equality where the orders agree)
            assert torch.allclose(left[key], value, atol=1e-4), f"{name}: {key} {(left[key] - value).abs().max()}"
        if name != "lm":  # the stages that start from tiny:llama moved away from it
            fresh = dict(build_random("llama")[0].state_dict())
            assert any(not torch.equal(fresh[k], v) for k, v in right.items() if k in fresh), name


def test_gathered_shards_come_back_in_the_jobs_order(monkeypatch):
    from llmx.core.train import distributed

    items = list(range(10))
    monkeypatch.setattr(distributed, "world", lambda: (1, 3))
    monkeypatch.setattr(torch.distributed, "all_gather_object",
                        lambda parts, mine: parts.__setitem__(slice(None), [items[r::3] for r in range(3)]))
    assert distributed.gather_shards(items[1::3]) == items
