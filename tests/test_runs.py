"""Run folders, atomic artifacts, exit codes and the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import TESTKIT

from llmx.core import atomic


def only_run(root: Path) -> Path:
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    return run


def test_run_folder_contents_and_rerun(cli, tmp_path):
    out = tmp_path / "runs"
    r = cli("--json", "--plugins-dir", TESTKIT, "analyze", "--method", "echo", "--set", "value=4", "--seed", "3", "-o", out)
    assert r.code == 0, r.err
    run = only_run(out)
    assert re.fullmatch(r"\d{8}T\d{12}Z_analyze_[0-9a-f]{8}", run.name)
    assert {p.name for p in run.iterdir()} == {"config.yaml", "meta.json", "metrics.json", "log.txt", "artifacts"}
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["seed"] == 3 and meta["device"] == "cpu"
    assert {"python", "llmx", "pydantic"} <= set(meta["versions"]) and "git_commit" in meta
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["stages"][0]["metrics"] == {"value": 4, "label": "x"}
    assert (run / "artifacts" / "0_echo" / "echo.txt").read_text() == "x=4\n"
    assert "stage 0: analyze echo" in (run / "log.txt").read_text()
    # config.yaml is complete and re-runnable as is: same config, same hash
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["pipeline"][0] == {"method": "echo", "stage": "analyze", "params": {"value": 4, "label": "x"}}
    again = tmp_path / "again"
    assert cli("--plugins-dir", TESTKIT, "run", run / "config.yaml", "-o", again).code == 0
    assert only_run(again).name.split("_")[-1] == run.name.split("_")[-1]


def test_failed_stage_exit_1_keeps_log(cli, tmp_path):
    r = cli("--plugins-dir", TESTKIT, "analyze", "--method", "boom", "-o", tmp_path)
    assert r.code == 1
    assert "stage 0:boom (analyze) failed: RuntimeError: kaboom" in r.err and "Traceback" not in r.err
    run = only_run(tmp_path)
    assert json.loads((run / "meta.json").read_text())["status"] == "failed"
    assert "Traceback" in (run / "log.txt").read_text()


def test_verbose_shows_traceback(cli, tmp_path):
    r = cli("-v", "--plugins-dir", TESTKIT, "analyze", "--method", "boom", "-o", tmp_path)
    assert r.code == 1 and "Traceback" in r.err


def test_missing_requirement_exit_3_before_writing(cli, tmp_path):
    r = cli("--plugins-dir", TESTKIT, "analyze", "--method", "needs-missing", "-o", tmp_path / "runs")
    assert r.code == 3 and "llmx_no_such_package" in r.err
    assert not (tmp_path / "runs").exists()


def test_interrupt_exit_130_leaves_no_half_written_artifact(cli, tmp_path):
    r = cli("--plugins-dir", TESTKIT, "analyze", "--method", "interrupt", "-o", tmp_path)
    assert r.code == 130
    run = only_run(tmp_path)
    assert json.loads((run / "meta.json").read_text())["status"] == "interrupted"
    leftovers = [p for p in (run / "artifacts").rglob("*")]
    assert leftovers == [run / "artifacts" / "0_interrupt"]


def test_usage_error_inside_the_first_stage_removes_the_run_folder(cli, tmp_path):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9 " * 100)  # there, so only reading it in the stage fails
    r = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--data", latin, "-o", tmp_path / "runs")
    assert r.code == 2 and "not UTF-8" in r.err
    assert list((tmp_path / "runs").iterdir()) == []


def test_atomic_folder_replaces_only_on_success(tmp_path):
    target = tmp_path / "model"
    with atomic.folder(target) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(RuntimeError), atomic.folder(target) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError
    assert (target / "a").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic.write_json(tmp_path / "m.json", {"a": 1})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_report_formats(cli, tmp_path):
    for v in (1, 2):
        assert cli("--plugins-dir", TESTKIT, "analyze", "--method", "echo", "--set", f"value={v}", "-o", tmp_path).code == 0
    rows = cli("--json", "report", tmp_path).json()
    assert sorted(r["metrics"]["value"] for r in rows) == [1, 2]
    md = cli("report", tmp_path, "--format", "md", "--metrics", "value").out
    assert md.splitlines()[0] == "| run | status | stage | seconds | value |"
    csv_out = cli("report", *sorted(tmp_path.iterdir()), "--format", "csv").out
    assert csv_out.splitlines()[0] == "run,status,stage,seconds,value,label"
    bad = cli("report", tmp_path / "nope")
    assert bad.code == 2 and "nope: does not exist" in bad.err
    (tmp_path / "empty").mkdir()
    bad = cli("report", tmp_path / "empty")
    assert bad.code == 2 and "not a run folder" in bad.err


def test_versions_name_llmx_when_run_from_a_checkout(monkeypatch):
    """A checkout on PYTHONPATH (as the device check runs it) has no package metadata: the version still shows."""
    from importlib import metadata

    from llmx import __version__
    from llmx.core import runs

    real = metadata.version

    def version(dist):
        if dist == "llmx":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(metadata, "version", version)
    runs._versions.cache_clear()
    try:
        assert runs.versions()["llmx"] == __version__
    finally:
        runs._versions.cache_clear()
