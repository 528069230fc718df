"""The lm and sft stages through the CLI: checkpoint series and bit-identical resume, cooldown branches, LoRA
adapters through PEFT, bad rows and missing extras."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

LM = ("--set", "init=scratch", "--set", "steps=8", "--set", "warmup=2", "--set", "batch_size=2", "--set", "seq_len=32",
      "--set", "eval_every=4", "--set", "eval_windows=4", "--set", "schedule=constant",
      "--set", "save_at_tokens=[128,384]")


@pytest.fixture
def corpus(tmp_path) -> Path:
    import json as module

    path = tmp_path / "corpus.txt"
    path.write_text(inspect.getsource(module.decoder) * 3)
    return path


def lm(cli, out: Path, corpus: Path, *sets: str):
    r = cli("--json", "train", "--method", "lm", "--model", "tiny:llama", "--data", corpus, *LM, *sets, "-o", out)
    assert r.code == 0, r.err
    return r.json()["stages"][0]["metrics"]


def tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def test_series_manifest_and_bit_identical_resume_mid_series(cli, tmp_path, corpus):
    whole = lm(cli, tmp_path / "a", corpus)
    series = Path(whole["series"])
    manifest = json.loads(series.read_text())
    assert [(e["tokens"], e["step"], e["tokens_seen"]) for e in manifest["checkpoints"]] == [(128, 2, 128), (384, 6, 384)]
    assert manifest["run"]["schedule"] == "constant" and manifest["run"]["tokens_per_step"] == 64
    assert manifest["run"]["data"]["fingerprint"] == whole["data_fingerprint"]
    assert manifest["checkpoints"][0]["lr"] == pytest.approx(1e-3)
    first = series.parent / "tokens_128"
    assert {"config.json", "model.safetensors", "training_state.pt", "checkpoint.json"} <= {f.name for f in first.iterdir()}
    r = cli("--json", "eval", "--method", "perplexity", "--model", first, "--data", corpus, "--set", "max_tokens=200",
            "-o", tmp_path / "e")
    assert r.code == 0, r.err  # a series checkpoint is a loadable model folder

    cut = lm(cli, tmp_path / "b", corpus, "--set", "stop_after=4")
    assert cut["steps"] == 4
    ckpt = Path(cut["model_dir"]).parent / "checkpoints"
    resumed = lm(cli, tmp_path / "c", corpus, "--set", f"resume={ckpt}")
    assert resumed["resumed_from"] == 4 and resumed["steps"] == 8
    late = json.loads(Path(resumed["series"]).read_text())["checkpoints"]
    assert [e["tokens"] for e in late] == [128, 384] and Path(late[0]["path"]).is_absolute()
    for name in ("tokens_384",):
        a, c = tensors(series.parent / name), tensors(Path(resumed["series"]).parent / name)
        assert all(torch.equal(a[k], c[k]) for k in a), name
    a, c = tensors(whole["model_dir"]), tensors(resumed["model_dir"])
    assert all(torch.equal(a[k], c[k]) for k in a)
    lines = (Path(resumed["model_dir"]).parent / "metrics.jsonl").read_text().splitlines()
    cut_lines = (Path(cut["model_dir"]).parent / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 9))  # the whole curve, no step twice
    assert lines[:4] == cut_lines and lines == (Path(whole["model_dir"]).parent / "metrics.jsonl").read_text().splitlines()
    again = lm(cli, tmp_path / "d", corpus, "--set", f"resume={Path(whole['series']).parent / 'tokens_128'}")
    assert [e["tokens"] for e in json.loads(Path(again["series"]).read_text())["checkpoints"]] == [128, 384]


def test_resume_from_a_checkpoint_kept_anywhere_and_configs_keep_their_cache(cli, tmp_path, corpus, monkeypatch):
    import shutil

    cut = lm(cli, tmp_path / "b", corpus, "--set", "stop_after=4", "--set", "gradient_checkpointing=true")
    step = Path(cut["model_dir"]).parent / "checkpoints" / "step_4"
    shutil.copytree(step, tmp_path / "ck")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "foreign": true}\n')
    monkeypatch.chdir(tmp_path)
    resumed = lm(cli, tmp_path / "c", corpus, "--set", "resume=ck", "--set", "gradient_checkpointing=true")
    assert resumed["resumed_from"] == 4 and resumed["steps"] == 8
    lines = (Path(resumed["model_dir"]).parent / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [5, 6, 7, 8]  # no history to copy, and none made up
    for folder in (Path(resumed["model_dir"]), Path(resumed["series"]).parent / "tokens_384"):
        assert json.loads((folder / "config.json").read_text())["use_cache"] is True, folder


def test_cooldown_branches_a_decay_from_a_stable_checkpoint(cli, tmp_path, corpus):
    whole = lm(cli, tmp_path / "a", corpus)
    branch = Path(whole["series"]).parent / "tokens_384"
    r = cli("--json", "train", "--method", "lm", "--data", corpus, *LM[2:], "--set", f"cooldown_from={branch}",
            "--set", "cooldown_fraction=0.5", "--set", "save_at_tokens=[]", "-o", tmp_path / "d")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert (m["branch_step"], m["cooldown_steps"], m["steps"], m["resumed_from"]) == (6, 3, 9, 6)
    records = [json.loads(x) for x in (Path(m["model_dir"]).parent / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 10))  # the branch's history, then its decay
    assert [r["lr"] for r in records[6:]] == pytest.approx([1e-3 * (0.1 + 0.9 * f) for f in (2 / 3, 1 / 3, 0.0)])
    assert m["heldout_loss"] < m["heldout_loss_before"]

    cosine = lm(cli, tmp_path / "f", corpus, "--set", "schedule=cosine")
    bad = Path(cosine["series"]).parent / "tokens_128"
    r = cli("train", "--method", "lm", "--data", corpus, *LM[2:], "--set", f"cooldown_from={bad}", "-o", tmp_path / "g")
    assert r.code == 2 and "cosine schedule" in r.err
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())
    r = cli("train", "--method", "lm", "--data", corpus, *LM[2:], "--set", "seq_len=16",
            "--set", f"cooldown_from={branch}", "-o", tmp_path / "g")
    assert r.code == 2 and "tokens_per_step" in r.err


@pytest.mark.parametrize("adapter", ["none", "lora"])
def test_a_cooldown_equals_a_wsd_run_whose_decay_starts_at_the_checkpoint(cli, tmp_path, corpus, adapter):
    sets = ("--set", "eval_every=2", "--set", f"adapter={adapter}", "--set", "init=pretrained", "--set", "lr=1e-2")
    whole = lm(cli, tmp_path / "a", corpus, *sets)
    evals = {json.loads(x)["step"]: json.loads(x).get("eval")
             for x in (Path(whole["series"]).parent.parent / "metrics.jsonl").read_text().splitlines()}
    branch = Path(whole["series"]).parent / "tokens_384"
    r = cli("--json", "train", "--method", "lm", "--data", corpus, *LM[2:], *sets, "--set", f"cooldown_from={branch}",
            "--set", "cooldown_fraction=0.5", "--set", "save_at_tokens=[]", "-o", tmp_path / "d")
    assert r.code == 0, r.err
    cooled = r.json()["stages"][0]["metrics"]
    assert cooled["heldout_loss_before"] == pytest.approx(evals[6], abs=1e-5)
    wsd = lm(cli, tmp_path / "w", corpus, *sets, "--set", "schedule=wsd", "--set", "steps=9",
             "--set", "decay_fraction=0.3333", "--set", "save_at_tokens=[]")
    key = "adapter_dir" if adapter == "lora" else "model_dir"
    name = "adapter_model.safetensors" if adapter == "lora" else "model.safetensors"
    a, b = load_file(str(Path(cooled[key]) / name)), load_file(str(Path(wsd[key]) / name))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_save_at_tokens_past_the_run_is_a_usage_error(cli, tmp_path, corpus):
    r = cli("train", "--method", "lm", "--model", "tiny:llama", "--data", corpus, *LM, "--set",
            "save_at_tokens=[100000]", "-o", tmp_path)
    assert r.code == 2 and "past the run's 512 tokens" in r.err


def rows(tmp_path: Path, n: int = 24) -> Path:
    path = tmp_path / "rows.jsonl"
    lines = []
    for i in range(n):
        if i % 2:
            lines.append({"prompt": f"n = {i} # double:", "completion": f" {2 * i}"})
        else:
            lines.append({"messages": [{"role": "user", "content": f"double {i}"},
                                       {"role": "assistant", "content": str(2 * i)}]})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def sft(cli, out: Path, data: Path, *sets: str):
    return cli("--json", "train", "--method", "sft", "--model", "tiny:llama", "--data", data, "--set", "steps=4",
               "--set", "batch_size=4", "--set", "max_length=48", "--set", "max_prompt_length=24", *sets, "-o", out)


def test_sft_full_and_lora_adapters_that_peft_and_llmx_load(cli, tmp_path):
    data = rows(tmp_path)
    full = sft(cli, tmp_path / "full", data)
    assert full.code == 0, full.err
    f = full.json()["stages"][0]["metrics"]
    assert f["heldout_loss"] < f["heldout_loss_before"] and f["train_rows"] + f["eval_rows"] == 24
    r = sft(cli, tmp_path / "lora", data, "--set", "adapter=lora", "--set", "lora.r=4", "--set", "packing=true",
            "--set", "lr=1e-2", "--eval", "perplexity", "--set", "pipeline.1.params.max_tokens=300")
    assert r.code == 0, r.err
    stages = r.json()["stages"]
    m = stages[0]["metrics"]
    assert m["trainable_params"] < f["trainable_params"] / 10 and m["optimizer_bytes"] < f["optimizer_bytes"] / 10
    assert m["sequences"] < m["train_rows"]  # packed
    adapter = Path(m["adapter_dir"])
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "model.safetensors").exists()
    from peft import PeftModel

    from llmx.core.models.archs import build_random

    peft_model = PeftModel.from_pretrained(build_random("llama")[0], str(adapter))
    e = cli("--json", "eval", "--method", "perplexity", "--model", adapter, "--set", "max_tokens=300",
            "-o", tmp_path / "e")
    assert e.code == 0, e.err
    # the adapter folder, loaded by llmx, scores exactly as the merged model the stage handed to its eval stage
    assert e.json()["stages"][0]["metrics"]["nll"] == pytest.approx(stages[1]["metrics"]["nll"], rel=1e-5)
    from llmx.core import models

    x = torch.randint(3, 259, (2, 16), generator=torch.Generator().manual_seed(0))
    ours, _ = models.load(str(adapter))
    with torch.no_grad():  # PEFT's own loading of the folder gives the model llmx loads (and it moved off the base)
        assert torch.allclose(peft_model.eval()(input_ids=x).logits, ours(input_ids=x).logits, atol=1e-5)
        assert not torch.allclose(build_random("llama")[0](input_ids=x).logits, ours(input_ids=x).logits, atol=1e-3)

    merged = sft(cli, tmp_path / "merged", data, "--set", "adapter=lora", "--set", "lora.merge=true")
    assert merged.code == 0, merged.err
    keys = tensors(merged.json()["stages"][0]["metrics"]["model_dir"])
    assert not any("lora" in k for k in keys) and "lm_head.weight" in keys


def test_sft_step_is_the_mean_over_its_tokens_however_it_is_split(cli, tmp_path):
    data = tmp_path / "uneven.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} #", "completion": " x" * (1 + 7 * (i % 3))}) + "\n"
                            for i in range(24)))
    folders = []
    for batch, accum in ((4, 1), (2, 2), (1, 4)):
        r = sft(cli, tmp_path / f"b{batch}", data, "--set", f"batch_size={batch}", "--set", f"grad_accum={accum}",
                "--set", "lr=1e-2")
        assert r.code == 0, r.err
        folders.append(r.json()["stages"][0]["metrics"]["model_dir"])
    first = tensors(folders[0])
    for other in folders[1:]:
        second = tensors(other)
        assert all(torch.allclose(first[k], second[k], atol=2e-6) for k in first), other


def test_bad_sft_row_names_file_and_line_and_writes_nothing(cli, tmp_path):
    data = rows(tmp_path)
    text = data.read_text().splitlines()
    text[4] = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    data.write_text("\n".join(text) + "\n")
    r = sft(cli, tmp_path / "out", data)
    assert r.code == 2 and f"{data}:5: no non-empty assistant message" in r.err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    r = sft(cli, tmp_path / "out", data, "--set", "max_prompt_length=64")
    assert r.code == 2 and "max_prompt_length (64) must be below max_length (48)" in r.err


def test_lora_without_peft_exits_3_before_anything_is_written(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    r = sft(cli, tmp_path / "out", rows(tmp_path), "--set", "adapter=lora")
    assert r.code == 3 and "pip install -e '.[lora]'" in r.err
    assert not (tmp_path / "out").exists()


def test_data_flag_goes_to_the_method_param_or_the_run_corpus(cli, tmp_path):
    (tmp_path / "corpus.txt").write_text("def f():\n    return 1\n" * 50)  # a dry run checks what the run would read
    r = cli("--json", "--dry-run", "train", "--method", "lm", "--model", "tiny:llama", "--data", "corpus.txt")
    assert r.json()["config"]["pipeline"][0]["params"]["data"] == "corpus.txt"
    r = cli("--json", "--dry-run", "train", "--method", "clover", "--model", "tiny:llama", "--data", "corpus.txt")
    assert r.json()["config"]["data"]["source"] == "corpus.txt"



def test_align_with_a_lora_adapter_uses_the_disabled_adapter_as_reference(cli, tmp_path):
    data = Path(__file__).resolve().parents[1] / "configs" / "smoke" / "data" / "brackets_paired.jsonl"
    r = cli("--json", "align", "--method", "dpo", "--model", "tiny:llama", "--data", data, "--set", "steps=3",
            "--set", "batch_size=2", "--set", "max_len=64", "--set", "adapter=lora", "--set", "lr=1e-2",
            "--set", "lora.target_modules=all-linear", "-o", tmp_path)
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert Path(m["adapter_dir"], "adapter_config.json").is_file() and m["trainable_params"] < 40_000
    assert m["heldout_logratio_per_token"] != 0  # the policy moved away from its adapter-free self


def test_lm_with_a_lora_adapter_saves_series_adapters(cli, tmp_path, corpus):
    m = lm(cli, tmp_path, corpus, "--set", "init=pretrained", "--set", "adapter=lora", "--set", "lr=1e-2")
    first = Path(m["series"]).parent / "tokens_128"
    assert (first / "adapter_config.json").is_file() and (first / "training_state.pt").is_file()
    assert m["heldout_loss"] < m["heldout_loss_before"]


@pytest.mark.slow
def test_a_model_with_real_widths_gqa_and_biases_trains(cli, tmp_path):
    """Hidden 2048, 16 query heads over 4 KV heads, biased Q/K/V (Qwen2-style): lm, then sft with packed LoRA."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=2048, intermediate_size=2816, num_hidden_layers=1,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    folder = tmp_path / "qwen2-wide"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    text = tmp_path / "corpus.txt"
    text.write_text(inspect.getsource(json.decoder))
    r = cli("--json", "train", "--method", "lm", "--model", folder, "--data", text, "--set", "steps=2",
            "--set", "batch_size=2", "--set", "seq_len=32", "--set", "eval_windows=2", "--set", "save=false",
            "-o", tmp_path / "lm")
    assert r.code == 0, r.err
    r = sft(cli, tmp_path / "sft", rows(tmp_path), "--model", folder, "--set", "steps=2", "--set", "packing=true",
            "--set", "adapter=lora", "--set", "gradient_checkpointing=true", "--set", "precision=bf16-mixed")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["trainable_params"] == 8 * (2048 + 2048) + 8 * (2048 + 512)  # r x (in + out) on q_proj and v_proj


def test_resume_refuses_a_checkpoint_of_another_run(cli, tmp_path, corpus, monkeypatch):
    cut = lm(cli, tmp_path / "a", corpus, "--set", "stop_after=4")
    step = Path(cut["model_dir"]).parent / "checkpoints" / "step_4"
    def resume(model: str, *sets: str):
        return cli("train", "--method", "lm", "--model", model, "--data", corpus, *LM, "--set", f"resume={step}", *sets,
                   "-o", tmp_path / "b")

    r = resume("tiny:llama", "--set", "lr=0.01")
    assert r.code == 2 and "belongs to a run with other settings (lr 0.001 -> 0.01)" in r.err, r.err
    r = resume("tiny:llama", "--set", "grad_accum=2")  # another global batch (grad_accum x processes)
    assert r.code == 2 and "(grad_accum 1 -> 2)" in r.err, r.err
    r = resume("tiny:qwen2")
    assert r.code == 2 and "was trained on model 'tiny:llama'" in r.err, r.err
    r = resume("tiny:llama", "--set", "steps=3", "--set", "save_at_tokens=[]")
    assert r.code == 2 and "past this run's 3 steps" in r.err, r.err
    assert resume("tiny:llama", "--set", "gradient_checkpointing=true").code == 0  # the same maths may change
    monkeypatch.chdir(corpus.parent)  # the same corpus by another spelling is the same run
    r = cli("train", "--method", "lm", "--model", "tiny:llama", "--data", f"./{corpus.name}", *LM,
            "--set", f"resume={step}", "-o", tmp_path / "e")
    assert r.code == 0, r.err


def test_a_strategy_the_method_or_launch_cannot_use_is_refused_before_any_work(cli, tmp_path, corpus, monkeypatch):
    r = cli("train", "--method", "sft", "--model", "tiny:llama", "--data", rows(tmp_path), "--set", "strategy=fsdp",
            "-o", tmp_path / "a")
    assert r.code == 3 and "only inside torchrun" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    monkeypatch.setenv("WORLD_SIZE", "1")
    r = cli("train", "--method", "lm", "--model", "tiny:llama", "--data", corpus, *LM, "--set", "strategy=fsdp",
            "-o", tmp_path / "d")
    assert r.code == 3 and "cannot keep a checkpoint series" in r.err, r.err
    r = cli("train", "--method", "lift", "--model", "tiny:llama", "--data", rows(tmp_path), "--set", "strategy=fsdp",
            "-o", tmp_path / "b")
    assert r.code == 3 and "cannot train under strategy fsdp" in r.err, r.err
    r = cli("train", "--method", "sft", "--model", "tiny:llama", "--data", rows(tmp_path), "--set", "offload=true",
            "-o", tmp_path / "c")
    assert r.code == 2 and "set strategy: fsdp" in r.err, r.err
    assert not any((tmp_path / n).exists() for n in "abcd")  # nothing written
