"""Plugin isolation, disabling, loose files and real entry points."""

from __future__ import annotations

import contextlib
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


LAZY = """
import llmx
from llmx.core.spec import MethodSpec, Params, Stage

class HelloParams(Params):
    times: int = 2

@llmx.hookimpl
def llmx_methods():
    yield MethodSpec("hello-class", (Stage.ANALYZE,), "lazy:run", HelloParams, summary="config as a class")
    yield MethodSpec("hello-lazy", (Stage.ANALYZE,), "lazy:run", "lazy:HelloParams", summary="config by reference")

def run(ctx, p):
    return {"greeting": "hello " * p.times}
"""


def test_config_as_class_or_lazy_reference(cli, tmp_path):
    """A plugin may pass its parameter model (third-party plugins written before references) or "module:Class"."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "lazy.py").write_text(LAZY)
    d = tmp_path / "plugins"
    from llmx.core.plugins import host
    from llmx.core.spec import Params

    for name in ("hello-class", "hello-lazy"):
        (shown,) = cli("--json", "--plugins-dir", d, "methods", "show", name).json()
        assert [(p["name"], p["default"]) for p in shown["params"]] == [("times", 2)]
        r = cli("--json", "--plugins-dir", d, "analyze", "--method", name, "--set", "times=3", "-o", tmp_path / "runs")
        assert r.code == 0, r.err
        assert r.json()["stages"][0]["metrics"]["greeting"] == "hello " * 3
        bad = cli("--plugins-dir", d, "analyze", "--method", name, "--set", "times=x", "-o", tmp_path / "runs")
        assert bad.code == 2 and "pipeline.0.params.times" in bad.err
    lazy = host().methods.get("hello-lazy")  # (the file imports once per process; here once per cli call)
    assert lazy.config_ref == "lazy:HelloParams" and lazy.config_name == "lazy:HelloParams"
    assert issubclass(lazy.config, Params) and lazy.config.__name__ == "HelloParams"
    # every built-in method names its config by reference: nothing is imported until it is read
    assert all(isinstance(s.config_ref, str) for s in host().methods if s.plugin != "lazy"), "a built-in passes a class"


BAD_REFS = {
    "no_module": ('"llmx_no_such_module:P"', "No module named 'llmx_no_such_module'"),
    "no_class": ('"json:NoSuchParams"', "NoSuchParams"),
    "not_model": ('"json:dumps"', "is not a pydantic model class"),
    "malformed": ('"json NoSuchParams"', "config must be a pydantic model class or 'module:Class'"),
}


def _bad_plugin(folder, name: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(f"""
        import llmx
        from llmx.core.spec import MethodSpec, Stage
        @llmx.hookimpl
        def llmx_methods():
            yield MethodSpec("{name.replace('_', '-')}", (Stage.ANALYZE,), "json:dumps", {BAD_REFS[name][0]})
    """))


@pytest.mark.parametrize("name", list(BAD_REFS))
def test_bad_config_reference_is_a_broken_plugin(cli, monkeypatch, tmp_path, name):
    """A reference whose module is missing (or malformed) breaks the plugin at load; one whose class is missing or
    not a model is found when the config is first needed: `llmx plugins` imports every config and shows why, a
    command needing it stops with one message naming the plugin, strict mode raises at load."""
    d = tmp_path / "plugins"
    _bad_plugin(d, name)
    method = name.replace("_", "-")
    at_load = name in ("no_module", "malformed")
    with pytest.warns(UserWarning, match=f"llmx plugin '{name}' failed to load"):
        r = cli("--json", "--plugins-dir", d, "plugins")
    info = next(p for p in r.json() if p["name"] == name)
    assert info["status"] == "broken" and BAD_REFS[name][1] in info["error"] and info["methods"] == []
    with pytest.warns(UserWarning) if at_load else contextlib.nullcontext():
        listed = {m["name"] for m in cli("--json", "--plugins-dir", d, "methods").json()}
    assert (method in listed) is not at_load and "rtn" in listed
    if not at_load:  # listed (nothing imported), but using it names the plugin and the reference
        for args in (("methods", "show", method), ("analyze", "--method", method, "-o", tmp_path / "runs")):
            r = cli("--plugins-dir", d, *args)
            assert r.code == 1 and f"plugin '{name}': method '{method}': config" in r.err, r.err
            assert BAD_REFS[name][1] in r.err and f"LLMX_DISABLE_PLUGINS={name}" in r.err
    monkeypatch.setenv("LLMX_STRICT_PLUGINS", "1")
    r = cli("--plugins-dir", d, "methods")
    assert r.code == 1 and BAD_REFS[name][1] in r.err, r.err


def test_no_plugin_imports_another():
    """Shared code lives in core: a plugin disabled or removed must never break another (DESIGN.md)."""
    import ast
    from pathlib import Path

    import llmx.plugins

    root = Path(llmx.plugins.__file__).parent
    crossing = []
    for path in root.rglob("*.py"):
        own = path.relative_to(root).parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" if node.module == "llmx.plugins" else node.module
                           for a in node.names] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["llmx", "plugins"] and len(parts) > 2 and parts[2] != own:
                    crossing.append(f"{path.relative_to(root)} imports {name}")
    assert not crossing, crossing
