"""Every training stage on a CUDA device, for a few steps: batches, labels, masks, heads and cores must be created on
the model's device, and bf16-mixed must train there. Skipped without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke"


def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"n = {i} #", "completion": f" {i * i}"}) + "\n" for i in range(32)))
    return path


@pytest.mark.parametrize("sets", [
    ("--method", "lm", "--set", "init=scratch", "--set", "max_tokens=20000", "--set", "steps=3", "--set", "seq_len=64",
     "--set", "save_at_tokens=[512]", "--set", "precision=bf16-mixed"),
    ("--method", "clover", "--set", "steps=3", "--set", "seq_len=64", "--set", "eval_windows=2"),
], ids=["lm", "clover"])
def test_lm_and_clover_train_on_cuda(cli, tmp_path, sets):
    r = cli("--json", "train", "--model", "tiny:llama", "--device", "cuda", *sets, "-o", tmp_path)
    assert r.code == 0, r.err


def test_sft_with_packing_lora_and_gradient_checkpointing_on_cuda(cli, tmp_path):
    r = cli("--json", "train", "--method", "sft", "--model", "tiny:llama", "--device", "cuda", "--data", rows(tmp_path),
            "--set", "steps=3", "--set", "batch_size=4", "--set", "max_length=48", "--set", "max_prompt_length=24",
            "--set", "packing=true", "--set", "adapter=lora", "--set", "gradient_checkpointing=true",
            "--set", "precision=bf16-mixed", "-o", tmp_path)
    assert r.code == 0, r.err
    assert r.json()["stages"][0]["metrics"]["heldout_loss"] > 0


@pytest.mark.parametrize("method,data,adapter", [("dpo", "brackets_paired", "none"), ("dpo", "brackets_paired", "lora"),
                                                 ("kto", "brackets_unpaired", "none"), ("pipa", "brackets_steps", "none")])
def test_align_on_cuda(cli, tmp_path, method, data, adapter):
    r = cli("--json", "align", "--method", method, "--model", "tiny:llama", "--device", "cuda",
            "--data", SMOKE / "data" / f"{data}.jsonl", "--set", "steps=2", "--set", "batch_size=2",
            "--set", "max_len=64", "--set", f"adapter={adapter}", "--set", "checkpoint_every=1", "-o", tmp_path)
    assert r.code == 0, r.err


def test_cuda_rng_state_is_checkpointed_and_restored(tmp_path):
    from llmx.core.train import checkpoint

    torch.cuda.manual_seed(7)
    torch.rand(3, device="cuda")
    model = torch.nn.Linear(4, 4).cuda()
    named = dict(model.named_parameters())
    path = checkpoint.save(tmp_path, 1, named, torch.optim.AdamW(named.values()))
    expected = torch.rand(3, device="cuda")
    checkpoint.set_rng_state(checkpoint.load(path)["rng"])
    assert torch.equal(torch.rand(3, device="cuda"), expected)
