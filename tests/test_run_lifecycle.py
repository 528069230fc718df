"""How a run begins and ends (issue 66): SIGTERM ends it as Ctrl-C does, lock files go with their holders, a
method that never reads ``ctx.model`` loads no model, and a model's load (or zoo build) is not a stage's time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

KIT = '''
import time

import llmx
from llmx import MethodSpec, Params, Stage


class P(Params):
    seconds: float = 0.0


@llmx.hookimpl
def llmx_methods():
    for name in ("greet", "wait", "touch"):
        yield MethodSpec(name=name, stages=(Stage.ANALYZE,), impl=f"lifecycle_kit:{name}", config=P,
                         summary="a test method", paper="none", requires=())


def greet(ctx, p):
    ctx.artifact("hello.txt").write_text("hello")
    return {"greeting": "hello"}


def wait(ctx, p):
    (ctx.run_dir / "waiting").touch()
    time.sleep(p.seconds)
    return {}


def touch(ctx, p):
    return {"params": sum(t.numel() for t in ctx.model.parameters())}
'''


@pytest.fixture
def kit(tmp_path) -> Path:
    folder = tmp_path / "kit"
    folder.mkdir()
    (folder / "lifecycle_kit.py").write_text(KIT)
    return folder


def _recipe(tmp_path: Path, *methods: str, model: str = "tiny:llama", **params) -> Path:
    pipeline = [{"stage": "analyze", "method": m, "params": params.get(m, {})} for m in methods]
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps({"name": "life", "model": model, "pipeline": pipeline}))  # JSON is YAML
    return path


def _only_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


@pytest.mark.parametrize("json_", [False, True])
def test_sigterm_ends_a_run_as_interrupted_with_exit_143(tmp_path, kit, json_):
    recipe = _recipe(tmp_path, "greet", "wait", wait={"seconds": 120})
    runs_dir = tmp_path / "runs"
    cmd = [sys.executable, "-m", "llmx", *(["--json"] if json_ else []), "--plugins-dir", str(kit), "run", str(recipe),
           "-o", str(runs_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # a bound on waiting for the stage to start, not a timing assertion
    while time.monotonic() < deadline and not list(runs_dir.glob("*/waiting")):
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["error: interrupted (SIGTERM)"], err
    run = _only_run(runs_dir)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "interrupted"
    assert (run / "artifacts" / "0_greet" / "hello.txt").read_text() == "hello"  # the finished stage's artifact
    assert [s["method"] for s in json.loads((run / "metrics.json").read_text())["stages"]] == ["greet"]
    assert not (run / ".running.lock").exists()
    if json_:
        doc = json.loads(out)  # exactly one document
        assert doc["ok"] is False and doc["exit_code"] == 143
    else:
        assert out == ""


def test_the_sigterm_handler_is_restored_after_a_command(cli, tmp_path, kit):
    before = signal.getsignal(signal.SIGTERM)
    assert cli("--plugins-dir", kit, "run", _recipe(tmp_path, "greet"), "-o", tmp_path / "runs").code == 0
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_finished_run_keeps_no_lock_file(cli, tmp_path, kit):
    r = cli("--plugins-dir", kit, "run", _recipe(tmp_path, "greet"), "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    run = _only_run(tmp_path / "runs")
    assert json.loads((run / "meta.json").read_text())["status"] == "ok"
    assert not (run / ".running.lock").exists()


def test_a_lock_taken_again_after_its_file_was_removed_excludes_others(tmp_path):
    from filelock import FileLock, Timeout

    from llmx.core import runs

    path = tmp_path / "x.lock"
    first = runs.take(path)
    assert path.exists()
    with pytest.raises(Timeout):
        runs.take(path, timeout=0)
    runs.drop(first)
    assert not path.exists()
    second = runs.take(path)
    with pytest.raises(Timeout):  # a plain FileLock (another llmx version) sees it held too
        FileLock(str(path)).acquire(timeout=0)
    runs.drop(second)
    assert not path.exists()


def test_a_waiter_on_a_removed_lock_file_takes_the_current_one(tmp_path, monkeypatch):
    """A process that waited on the old file wakes holding a file no longer at the path: it is not current, and
    ``take`` lets it go and locks the path's file again."""
    from llmx.core import runs

    path = tmp_path / "x.lock"
    lock = runs.take(path)
    assert runs._current(lock)
    os.unlink(path)  # its holder's drop, while a waiter had the old file open
    assert not runs._current(lock)
    path.touch()  # a newcomer's fresh file
    assert not runs._current(lock)
    lock.release()

    seen = []
    real = runs._current
    monkeypatch.setattr(runs, "_current", lambda lk: bool(seen.append(lk)) or len(seen) > 1 and real(lk))
    lock = runs.take(path)
    assert len(seen) == 2 and lock.is_locked and not seen[0].is_locked  # the stale one let go, the current one held
    runs.drop(lock)
    assert not path.exists()


def test_sweep_removes_a_dead_runs_lock_file_and_marks_it_died(tmp_path):
    from llmx.core import runs

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / runs.META).write_text(json.dumps({"status": "running"}))
    (run / runs.LOCK).touch()
    assert runs.sweep(tmp_path / "runs") == [run]
    assert json.loads((run / runs.META).read_text())["status"] == "died"
    assert not (run / runs.LOCK).exists()


def test_a_method_that_never_reads_the_model_loads_none(cli, tmp_path, kit, monkeypatch):
    from llmx.core import models

    def no(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load", no)
    r = cli("--plugins-dir", kit, "run", _recipe(tmp_path, "greet"), "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    r = cli("--plugins-dir", kit, "analyze", "--method", "greet", "--model", "tiny:llama", "-o", tmp_path / "runs2")
    assert r.code == 0, r.err


def test_a_method_that_never_reads_a_ref_model_builds_and_loads_none(cli, tmp_path, kit, monkeypatch):
    from llmx.core import models, zoo

    def no(*a, **k):
        raise AssertionError("the model was built or loaded")

    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "load", no)
    monkeypatch.setattr(zoo, "_build", no)
    r = cli("--plugins-dir", kit, "analyze", "--method", "greet", "--model", "ref:llama", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    assert not list((tmp_path / "cache").glob("zoo/*"))


def test_a_zoo_build_and_the_model_load_are_not_the_stages_seconds(cli, tmp_path, kit, monkeypatch):
    """``make demo``'s first perplexity stage counted the reference model's build: now the build and the load are
    the stage's ``build_seconds`` and ``load_seconds``, on a line of their own, and ``seconds`` is the stage's work.
    A fake clock: it moves only in the build (90 s) and the load (10 s)."""
    import time as time_module

    from llmx.core import models, zoo
    from llmx.core.zoo import build as zoo_build

    now = [1000.0]
    monkeypatch.setattr(time_module, "perf_counter", lambda: now[0])
    real_load = models.load

    def fake_build(*a, **k):
        now[0] += 90.0

    def fake_load(name, **kw):
        assert name == "ref:llama-test"
        monkeypatch.setattr(zoo_build, "build", fake_build)
        zoo._build(None, None, None, tmp_path / "entry", False)  # what a first use of an entry does
        now[0] += 10.0
        return real_load("tiny:llama", **kw)

    monkeypatch.setattr(models, "load", fake_load)
    r = cli("--json", "--plugins-dir", kit, "run", _recipe(tmp_path, "touch", "touch", model="ref:llama-test"),
            "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    first, second = r.json()["stages"]
    assert (first["seconds"], first["load_seconds"], first["build_seconds"]) == (0.0, 10.0, 90.0)
    assert second["seconds"] == 0.0 and "load_seconds" not in second  # loaded once, by the first stage
    on_disk = json.loads((_only_run(tmp_path / "runs") / "metrics.json").read_text())["stages"]
    assert on_disk[0]["build_seconds"] == 90.0


def test_the_load_line_says_what_was_built(cli, tmp_path, kit, monkeypatch):
    from llmx.core import models, zoo

    real_load = models.load
    spent = [0.0]
    monkeypatch.setattr(zoo, "build_seconds", lambda: spent[0])

    def fake_load(name, **kw):
        spent[0] += 95.0
        return real_load("tiny:llama", **kw)

    monkeypatch.setattr(models, "load", fake_load)
    r = cli("--plugins-dir", kit, "run", _recipe(tmp_path, "touch", model="ref:llama-test"), "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    assert "model ref:llama-test: built in 1m35s (not counted in the stage's seconds), loaded in" in r.err


def test_an_interrupted_pool_of_programs_drops_the_queued_ones():
    """SIGTERM or Ctrl-C during a code eval: the programs already running finish, the queued ones never start."""
    import threading

    from llmx.core.eval.sandbox import cancelling_pool

    started, gate = [], threading.Event()

    def program(i: int) -> int:
        started.append(i)
        gate.wait(5)
        return i

    with pytest.raises(KeyboardInterrupt), cancelling_pool(1) as pool:
        futures = [pool.submit(program, i) for i in range(20)]
        threading.Timer(0.5, gate.set).start()  # the running program ends a little after the interrupt
        raise KeyboardInterrupt
    assert len(started) <= 1 and sum(f.cancelled() for f in futures) >= 19  # at most the one already running
