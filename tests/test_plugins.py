"""Plugin isolation, disabling, loose files and real entry points."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import FIXTURES, TESTKIT, run_subprocess


def test_broken_plugin_file_does_not_break_help_and_shows_why(cli):
    with pytest.warns(UserWarning, match="bad_plugin"):
        assert cli("--plugins-dir", FIXTURES / "broken", "--help").code == 0
        r = cli("--json", "--plugins-dir", FIXTURES / "broken", "plugins")
    assert r.code == 0
    bad = next(p for p in r.json() if p["name"] == "bad_plugin")
    assert bad["status"] == "broken" and "broken on purpose" in bad["error"]
    assert {m["name"] for m in cli("--json", "--plugins-dir", FIXTURES / "broken", "methods").json()} >= {"rtn"}


def test_strict_plugins_reraises(cli, monkeypatch):
    monkeypatch.setenv("LLMX_STRICT_PLUGINS", "1")
    r = cli("--plugins-dir", FIXTURES / "broken", "plugins")
    assert r.code == 1 and "broken on purpose" in r.err


def test_disable_plugins_by_name(cli, monkeypatch):
    monkeypatch.setenv("LLMX_DISABLE_PLUGINS", "testkit,rtn")
    r = cli("--json", "--plugins-dir", TESTKIT, "plugins")
    status = {p["name"]: p["status"] for p in r.json()}
    assert status["testkit"] == "disabled" and status["rtn"] == "disabled" and status["evals"] == "ok"
    assert "echo" not in {m["name"] for m in cli("--json", "methods").json()}


def test_plugins_dir_from_environment(cli, monkeypatch):
    monkeypatch.setenv("LLMX_PLUGINS_DIR", str(TESTKIT))
    assert "echo" in {m["name"] for m in cli("--json", "methods").json()}


def test_hook_yielding_wrong_type_is_isolated(cli, tmp_path):
    (tmp_path / "weird.py").write_text(textwrap.dedent("""
        import llmx
        @llmx.hookimpl
        def llmx_methods():
            yield "not a spec"
    """))
    with pytest.warns(UserWarning):
        r = cli("--json", "--plugins-dir", tmp_path, "plugins")
    weird = next(p for p in r.json() if p["name"] == "weird")
    assert weird["status"] == "broken" and "expected MethodSpec" in weird["error"]


def test_duplicate_method_name_marks_second_plugin_broken(cli, tmp_path):
    (tmp_path / "dupe.py").write_text(textwrap.dedent("""
        import llmx
        from llmx.core.spec import MethodSpec, Stage
        @llmx.hookimpl
        def llmx_methods():
            yield MethodSpec("new-one", (Stage.EVAL,), "x:y")
            yield MethodSpec("RTN", (Stage.QUANTIZE,), "x:y")
    """))
    with pytest.warns(UserWarning):
        r = cli("--json", "--plugins-dir", tmp_path, "plugins")
    dupe = next(p for p in r.json() if p["name"] == "dupe")
    assert dupe["status"] == "broken" and "already provided by plugin rtn" in dupe["error"]
    assert "new-one" not in {m["name"] for m in cli("--json", "--plugins-dir", tmp_path, "methods").json()}


def test_entry_point_plugin_is_listed_and_runs(tmp_path):
    """A real distribution (dist-info with entry_points.txt) on sys.path, found by importlib.metadata."""
    site = tmp_path / "site"
    (site / "llmx_hello").mkdir(parents=True)
    (site / "llmx_hello" / "__init__.py").write_text(textwrap.dedent("""
        import llmx
        from llmx.core.spec import MethodSpec, Params, Stage

        class HelloParams(Params):
            times: int = 2

        @llmx.hookimpl
        def llmx_methods():
            yield MethodSpec("hello", (Stage.ANALYZE,), "llmx_hello:run", HelloParams, summary="says hello")

        def run(ctx, p):
            return {"greeting": "hello " * p.times}
    """))
    dist = site / "llmx_hello-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llmx-hello\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[llmx]\nhello = llmx_hello\n")
    env = {"PYTHONPATH": str(site)}
    listed = run_subprocess("-m", "llmx", "--json", "plugins", env=env)
    assert listed.returncode == 0, listed.stderr
    hello = next(p for p in json.loads(listed.stdout) if p["name"] == "hello")
    assert hello == {**hello, "source": "entrypoint", "status": "ok", "version": "1.2.3", "methods": ["hello"]}
    ran = run_subprocess("-m", "llmx", "--json", "analyze", "--method", "hello", "--set", "times=3",
                         "-o", str(tmp_path / "runs"), env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["stages"][0]["metrics"]["greeting"] == "hello hello hello "
    off = run_subprocess("-m", "llmx", "--json", "methods", env={**env, "LLMX_DISABLE_PLUGINS": "*"})
    assert "hello" not in {m["name"] for m in json.loads(off.stdout)}
