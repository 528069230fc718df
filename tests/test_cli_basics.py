"""CLI start-up, listing, --json documents and help examples."""

from __future__ import annotations

import json
import time

from conftest import ROOT, TESTKIT, run_subprocess


def test_help_is_fast_and_imports_no_torch():
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "from llmx.cli.app import main\n"
        "for argv in (['--help'], ['methods', '--json'], ['plugins', '--json']):\n"
        "    rc = main(argv); assert rc == 0, (argv, rc)\n"
        "heavy = [m for m in ('torch', 'transformers', 'bitsandbytes') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    t0 = time.perf_counter()
    proc = run_subprocess("-c", code)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stderr
    assert elapsed < 5.0, f"llmx --help took {elapsed:.2f}s"


def test_methods_imports_no_method_config_and_no_torch():
    """`llmx methods` lists from the specs alone: no parameter model of any method is imported (nor torch)."""
    code = (
        "import sys\n"
        "from llmx.cli.app import main\n"
        "assert main(['methods']) == 0\n"
        "from llmx.core.plugins import host\n"
        "from llmx.core.spec import Params\n"
        "refs = {s.config_name.partition(':')[0] for s in host().methods}\n"
        "def subs(c): return [x for k in c.__subclasses__() for x in (k, *subs(k))]\n"
        "loaded = [m for m in sys.modules if m in refs or m.startswith('llmx.plugins.') and m.endswith('.config')\n"
        "          or m.split('.')[0] in ('torch', 'transformers')]\n"
        "print('LOADED', sorted(loaded), [c.__name__ for c in subs(Params)], len(refs), file=sys.stderr)\n"
    )
    proc = run_subprocess("-c", code)
    assert proc.returncode == 0, proc.stderr
    loaded = next(line for line in proc.stderr.splitlines() if line.startswith("LOADED "))
    assert loaded.startswith("LOADED [] [] ") and int(loaded.split()[-1]) > 25, loaded  # config modules


def test_methods_piped_is_one_whole_line_per_method():
    """Off a terminal: one line per method (name, stages, the whole summary), never wrapped at a width."""
    listed = json.loads(run_subprocess("-m", "llmx", "--json", "methods").stdout)
    proc = run_subprocess("-m", "llmx", "methods", env={"COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(listed) > 40
    for line, m in zip(lines, listed, strict=True):
        name, stages, summary = line.split(None, 2)
        assert (name, stages.split(","), summary) == (m["name"], m["stages"], " ".join(m["summary"].split())), line
    evals = run_subprocess("-m", "llmx", "methods", "--stage", "eval").stdout.splitlines()
    assert len(evals) == sum("eval" in m["stages"] for m in listed) and all(" eval" in line for line in evals)


def test_methods_on_a_terminal_is_a_table(cli, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    r = cli("methods", "--stage", "quantize")
    assert r.code == 0 and "methods" in r.out and "plugin" in r.out and "─" in r.out


def test_console_script_and_module_entry_points():
    proc = run_subprocess("-m", "llmx", "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("llmx ")


def test_methods_json_lists_builtins_with_stages(cli):
    r = cli("methods", "--json")
    assert r.code == 0
    data = {m["name"]: m for m in r.json()}
    assert data["rtn"]["stages"] == ["quantize"]
    assert data["perplexity"]["stages"] == ["eval"] and data["memory"]["stages"] == ["eval", "analyze"]


def test_methods_stage_filter_and_show(cli):
    r = cli("--json", "methods", "--stage", "eval")
    assert {m["name"] for m in r.json()} == {"perplexity", "speed", "memory", "generate", "task", "lm-eval",
                                             "scenes-vqa", "tracing", "length", "backdoor", "icl", "acquisition",
                                             "mmmb", "secure-code"}
    (shown,) = cli("--json", "methods", "show", "PPL").json()
    assert shown["name"] == "perplexity"
    assert [v["stages"] for v in cli("--json", "methods", "show", "clover").json()] == [["prune"], ["train"]]
    assert {p["name"] for p in shown["params"]} >= {"seq_len", "stride", "max_tokens"}
    bad = cli("methods", "--stage", "quantise")
    assert bad.code == 2 and "unknown stage" in bad.err


def test_every_command_help_has_examples(cli):
    from llmx.core.spec import Stage

    commands = [[], ["run"], ["methods"], ["methods", "show"], ["plugins"], ["config", "show"], ["config", "validate"],
                ["config", "init"], ["report"], ["env"]] + [[s.value] for s in Stage]
    for cmd in commands:
        r = cli(*cmd, "--help")
        assert r.code == 0, cmd
        assert "Examples:" in r.out and "llmx " in r.out.split("Examples:")[1], cmd


def test_json_documents_parse(cli, tmp_path):
    for args in (["methods"], ["plugins"], ["env"], ["config", "init", "--method", "rtn"],
                 ["config", "show", str(ROOT / "configs/smoke/rtn.yaml")],
                 ["--plugins-dir", str(TESTKIT), "analyze", "--method", "echo", "-o", str(tmp_path)]):
        r = cli("--json", *args)
        assert r.code == 0, (args, r.err)
        json.loads(r.out)  # exactly one document
    err = cli("--json", "quantize", "--method", "nope", "--model", "tiny:llama")
    assert err.code == 2 and json.loads(err.out)["ok"] is False


def test_global_flags_anywhere():
    from llmx.cli.app import hoist_global_flags

    assert hoist_global_flags(["methods", "--json"]) == ["--json", "methods"]
    assert hoist_global_flags(["run", "a.yaml", "-q", "--", "--json"]) == ["-q", "run", "a.yaml", "--", "--json"]


def test_every_stage_help_example_names_a_method_of_that_stage():
    import shlex

    import llmx.cli.app  # noqa: F401 - the commands register through the app (importing run_cmd alone is a cycle)
    from llmx.cli.run_cmd import STAGE_HELP
    from llmx.core.plugins import host

    for stage, (_, examples) in STAGE_HELP.items():
        for line in examples:
            words = shlex.split(line)
            method = words[words.index("--method") + 1]
            assert host().methods.get(method, stage).name, line  # raises on a method the stage does not have
