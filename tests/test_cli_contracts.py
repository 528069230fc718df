"""The CLI's contracts with scripts and users: ``--json`` always answers with exactly one JSON document, each failure
has its exit code, and each is found before any work is done."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch


@pytest.mark.parametrize("args,code", [(["--bogus"], 2), (["nocommand"], 2), (["zoo", "build"], 2),
                                       (["methods", "--bogus"], 2), (["--version"], 0), (["zoo"], 2), (["config"], 2)])
def test_json_answers_with_one_document(cli, args, code):
    r = cli("--json", *args)
    assert r.code == code
    doc = json.loads(r.out)  # exactly one document: json.loads fails on anything before or after it
    assert doc.get("version") if code == 0 else (doc["ok"] is False and doc["exit_code"] == code and doc["error"])


def _default_sigint():
    """A job a shell starts in the background inherits SIGINT ignored (and Python then keeps it ignored): the child
    gets the default disposition back, as a terminal's foreground process has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_130_and_one_line(tmp_path):
    env = {**os.environ, "LLMX_CACHE_DIR": str(tmp_path / "cache")}
    # the small preset: the test preset's early stopping can end a build within the second before the signal
    proc = subprocess.Popen([sys.executable, "-m", "llmx", "-q", "zoo", "build", "llama", "--preset", "small", "--steps",
                             "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)
    deadline = time.time() + 60
    while time.time() < deadline and not list((tmp_path / "cache").glob("zoo/.locks/*.lock")):
        time.sleep(0.2)  # the build has started (it holds its lock)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)  # the signal lands when the tokenizer trainer (Rust) returns
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["error: interrupted"], err
    assert [p.name for p in (tmp_path / "cache" / "zoo").iterdir()] == [".locks"]  # nothing half-written


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_exit_3_before_any_work(cli, tmp_path):
    r = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--device", "cuda", "-o", tmp_path / "runs")
    assert r.code == 3 and "CUDA" in r.err
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="needs a machine without CuPy")
def test_cuda_without_cupy_is_exit_3_for_a_method_with_kernels_and_cpu_needs_none(cli, tmp_path, monkeypatch):
    from llmx.cli.build import resolve_cli
    from llmx.core.pipeline import check_requirements

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine, as far as the checks can tell
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    r = cli("quantize", "--method", "rtn", "--model", "tiny:llama", "--device", "cuda", "-o", tmp_path / "runs")
    assert r.code == 3 and "'cupy'" in r.err and "pip install -e '.[gpu]'" in r.err, r.err
    assert not (tmp_path / "runs").exists()

    def run(method: str, device: str):
        raw = {"model": "tiny:llama", "device": device, "pipeline": [{"stage": "quantize", "method": method}]}
        return resolve_cli(raw, None, None, source=None)

    check_requirements(run("rtn", "cpu"))  # on the CPU the kernels' PyTorch references run: no CuPy needed
    check_requirements(run("bnb", "cuda"))  # a method without CuPy kernels: CUDA without CuPy is fine


def test_a_truncated_weight_file_is_exit_2_naming_it(cli, tmp_path):
    r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "-o", tmp_path / "q")
    folder = r.json()["stages"][0]["metrics"]["model_dir"]
    weights = os.path.join(folder, "model.safetensors")
    with open(weights, "r+b") as fh:
        fh.truncate(os.path.getsize(weights) // 2)
    r = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "e")
    assert r.code == 2 and "model.safetensors" in r.err and "truncated" in r.err
    assert not (tmp_path / "e").exists()


def test_a_mistyped_bare_model_name_fails_fast_offline(cli, monkeypatch, tmp_path):
    import socket

    def unreachable(address, timeout=None):
        time.sleep(min(timeout or 0, 0.1))
        raise TimeoutError("timed out")

    for key in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(socket, "create_connection", unreachable)  # a network that does not answer
    t0 = time.perf_counter()
    r = cli("eval", "--method", "perplexity", "--model", "lamma", "-o", tmp_path / "runs")
    assert r.code == 2 and "Did you mean 'tiny:llama'?" in r.err
    assert time.perf_counter() - t0 < 10  # not a minute of hub retries
    r = cli("eval", "--method", "perplexity", "--model", "bad name!", "-o", tmp_path / "runs")
    assert r.code == 2 and "not a local folder, a known name or a valid hub id" in r.err


def test_progress_off_a_terminal_is_periodic_lines(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LLMX_PROGRESS_SECONDS", "0")
    r = cli("zoo", "build", "llama", "--preset", "test", "--steps", "20")
    assert r.code == 0, r.err
    lines = r.err.strip().splitlines()
    assert lines[0].startswith("building llama (test preset), once: it is cached after")
    assert "about" in lines[0] and any(line.startswith("training: 20/20 (100%)") for line in lines)
    r = cli("-q", "zoo", "build", "llama", "--preset", "test", "--steps", "21")
    assert r.code == 0 and r.err == ""


def test_the_help_path_imports_nothing_heavy():
    probe = ("import sys\nfrom llmx.cli.app import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print([m for m in ('torch', 'transformers', 'pydantic', 'yaml', 'llmx.core.config') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().splitlines()[-1] == "[]"
