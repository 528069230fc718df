"""No lost work: every stage's references are checked before the first stage runs, a later failure keeps what
earlier stages made, and a run killed mid-way is marked ``died`` with its half-written files removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmx.core import runs


def test_a_typo_in_a_later_stage_stops_before_the_first(cli, tmp_path):
    r = cli("quantize", "--method", "rtn", "--bits", "w4a16", "--model", "tiny:llama", "--eval", "perplexity",
            "--set", "perplexity.source=typo.txt", "-o", tmp_path / "runs")
    assert r.code == 2 and "pipeline.0.params.source" in r.err and "typo.txt" in r.err
    assert not (tmp_path / "runs").exists()
    for args, where in ((("--model", "ref:lamma"), "Did you mean 'ref:llama'?"),
                        (("--model", "tiny:llama", "--set", "calib_source=nope.txt"), "calib_source")):
        r = cli("quantize", "--method", "gptq", "--bits", "w4a16", *args, "-o", tmp_path / "runs")
        assert r.code == 2 and where in r.err, r.err
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: tiny:llama\npipeline:\n  - method: sft\n    params: {data: missing.jsonl}\n")
    r = cli("run", recipe, "-o", tmp_path / "runs")
    assert r.code == 2 and "pipeline.0.params.data: file not found: missing.jsonl" in r.err
    for check in (("config", "validate", recipe), ("--dry-run", "run", recipe)):  # what run refuses, they refuse
        r = cli(*check)
        assert r.code == 2 and "missing.jsonl" in (r.out + r.err), check
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\npipeline: []\n")
    r = cli("config", "validate", latin)
    assert r.code == 2 and "not UTF-8" in (r.out + r.err)


def test_a_later_failure_keeps_the_earlier_stages_artifacts(cli, tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 ".encode("latin-1") * 200)  # exists, so only reading it fails
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model: tiny:llama\npipeline:\n- {{method: rtn, params: {{bits: w4a16}}}}\n"
                      f"- {{method: perplexity, params: {{source: '{latin}'}}}}\n")
    r = cli("run", recipe, "-o", tmp_path / "runs")
    assert r.code == 2 and "not UTF-8" in r.err and "Run folder kept" in r.err and "0:rtn finished" in r.err
    (folder,) = (tmp_path / "runs").iterdir()
    meta = json.loads((folder / runs.META).read_text())
    assert meta["status"] == "failed" and "not UTF-8" in meta["error"]
    assert json.loads((folder / runs.METRICS).read_text())["stages"][0]["method"] == "rtn"
    r = cli("--json", "eval", "--method", "perplexity", "--model", folder / "artifacts" / "0_rtn" / "model",
            "--set", "max_tokens=512", "-o", tmp_path / "again")
    assert r.code == 0, r.err  # the quantized model survived


def test_a_killed_run_is_marked_died_and_its_leftovers_removed(cli, tmp_path):
    def run_folder(name: str) -> Path:
        folder = tmp_path / "runs" / name
        (folder / "artifacts" / ".model.abc.tmp").mkdir(parents=True)
        (folder / runs.CONFIG).write_text("pipeline: []\n")
        (folder / runs.META).write_text(json.dumps({"status": "running"}))
        (folder / runs.LOCK).touch()
        return folder

    dead, alive = run_folder("20260101T000000000000Z_run_deadbeef"), run_folder("20260101T000000000001Z_run_cafebabe")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom filelock import FileLock\n"
                               f"lock = FileLock({str(alive / runs.LOCK)!r})\nlock.acquire()\nprint('held', flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # another process (another container) runs it
        r = cli("--json", "report", tmp_path / "runs")
        assert r.code == 0, r.err
    finally:
        holder.kill()
    assert json.loads((dead / runs.META).read_text())["status"] == "died"
    assert not (dead / "artifacts" / ".model.abc.tmp").exists()
    assert json.loads((alive / runs.META).read_text())["status"] == "running"
    assert (alive / "artifacts" / ".model.abc.tmp").exists()  # a live run's save in flight is left alone


def test_a_run_holds_its_lock_while_it_runs(cli, tmp_path):
    from filelock import FileLock

    r = cli("--json", "eval", "--method", "perplexity", "--model", "tiny:llama", "--set", "max_tokens=256",
            "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    (folder,) = (tmp_path / "runs").iterdir()
    FileLock(str(folder / runs.LOCK)).acquire(timeout=0)  # released at the end


class _Payload:
    """Unpickling it opens (creates) ``marker``: the stand-in for code a crafted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_weight_file_that_would_run_code_or_is_missing_is_exit_2_before_the_run_folder(cli, tmp_path):
    import pickle

    import torch

    marker = tmp_path / "payload-ran"
    folders = {}
    for name, write in (("pytorch_model.bin", lambda f: torch.save({"w": torch.zeros(2), "x": _Payload(marker)}, f)),
                        ("pytorch_model-00001-of-00002.bin", lambda f: f.write_bytes(pickle.dumps(_Payload(marker)))),
                        ("model.safetensors.index.json",
                         lambda f: f.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}})))):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "llama"}')
        write(folder / name)
        folders[name] = folder
    for name, folder in folders.items():
        r = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "runs")
        assert r.code == 2 and name in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "model-00001-of-00002.safetensors" in r.err
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_plain_torch_weights_pass_the_check_and_files_no_loader_reads_are_not_read(tmp_path):
    import torch
    from safetensors.torch import save_file

    from llmx.core.models.storage import check_weight_files
    from llmx.errors import UsageError

    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model-00002-of-00002.bin",
               _use_new_zipfile_serialization=False)  # the legacy format
    torch.save(_Payload(tmp_path / "x"), tmp_path / "training_args.bin")  # the Trainer's pickle: nothing loads it
    (tmp_path / "openvino_model.bin").write_bytes(b"\x00\x01 not a pickle")  # another runtime's file
    check_weight_files(tmp_path)
    (tmp_path / "pytorch_model-00001-of-00002.bin").write_bytes(b"\x00\x01 not a pickle")
    with pytest.raises(UsageError, match="not a torch weights file"):
        check_weight_files(tmp_path)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))  # safetensors win: the .bin are not read,
    (tmp_path / "pytorch_model.bin.index.json").write_text(  # nor a leftover .bin index naming absent shards
        json.dumps({"weight_map": {"w": "pytorch_model-00003-of-00003.bin"}}))
    check_weight_files(tmp_path)


def test_every_file_a_run_writes_follows_the_umask(cli, tmp_path):
    import os

    from llmx.core import atomic

    old = os.umask(0o027)  # not the usual 022: 0644 hard-coded anywhere would show
    atomic._umask.cache_clear()
    try:
        r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "--set", "save=true",
                "-o", tmp_path / "q")
    finally:
        os.umask(old)
        atomic._umask.cache_clear()
    assert r.code == 0, r.err
    modes = {p.relative_to(tmp_path): p.stat().st_mode & 0o777 for p in (tmp_path / "q").rglob("*")}
    assert any(p.name == "model.safetensors" for p in modes)
    assert modes == {p: 0o750 if (tmp_path / p).is_dir() else 0o640 for p in modes}
