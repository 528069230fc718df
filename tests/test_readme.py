"""The documentation's code runs as written (the Python API example in docs/python-api.md, the plugin example in
docs/writing-a-plugin.md), and the README stays short: under 250 lines, every relative link resolving to a file,
its comparison table generated from the published results."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def snippet(page: str) -> str:
    """The first Python block of a docs page, as written."""
    return re.search(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S).group(1)


def test_the_python_api_example_runs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # its data paths are the repository's
    namespace: dict = {}
    exec(compile(snippet("python-api.md"), "docs/python-api.md", "exec"), namespace)
    out = capsys.readouterr().out
    fp, w4 = re.search(r"perplexity ([\d.]+) \(FP\) -> ([\d.]+) \(W4 GPTQ", out).groups()
    assert float(fp) > 1 and float(w4) > 1 and namespace["quant"]["layers"] > 0
    assert namespace["cut"] and namespace["fit"]["steps"] == 4 and namespace["pref"]
    assert namespace["result"]["stages"] and namespace["cache"]


def test_the_plugin_example_runs_as_written(cli, tmp_path):
    (tmp_path / "my_plugin.py").write_text(snippet("writing-a-plugin.md"))
    r = cli("--json", "analyze", "--method", "hello", "--model", "tiny:llama", "--plugins-dir", tmp_path,
            "-o", tmp_path / "runs")  # --plugins-dir after the command, like any global flag
    assert r.code == 0, r.err
    assert r.json()["stages"][0]["metrics"]["greeting"] == "hello hello "


def test_api_errors_are_the_clis(tmp_path):
    import pytest

    import llmx

    with pytest.raises(llmx.ConfigError, match="Did you mean 'gptq'"):
        llmx.quantize("tiny:llama", method="gptqq")
    with pytest.raises(llmx.ConfigError, match="calib_sample"):
        llmx.quantize("tiny:llama", method="gptq", calib_sample=3)
    with pytest.raises(llmx.UsageError, match="tokenizer"):
        llmx.evaluate(object(), method="perplexity")
    with pytest.raises(llmx.ConfigError, match="file not found"):
        llmx.train("tiny:llama", method="sft", data=str(tmp_path / "missing.jsonl"))


def test_the_readme_comparison_table_is_generated_from_the_published_results():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import publish_comparisons as publish

    text = (ROOT / "README.md").read_text()
    assert publish.readme_with(text, publish.table()) == text, "run: python benchmarks/publish_comparisons.py"


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250, "the README's detail belongs in docs/ (issue 71)"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    assert len(relative) > 40  # the methods table links every technique's page
    missing = [link for link in relative if not (ROOT / link.split("#")[0]).is_file()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_readme_first_run_times_are_the_results_files():
    import json

    first = json.loads((ROOT / "benchmarks" / "results" / "first_run.json").read_text())
    text = (ROOT / "README.md").read_text()
    quoted = re.findall(r"took ([\d.]+) s and ([\d.]+) s", text)
    assert quoted == [tuple(f"{s:.1f}" for s in first["wall_s"])], "README's first-run times differ from first_run.json"


def test_the_readme_demo_build_time_is_the_results_files():
    import json

    rows = json.loads((ROOT / "benchmarks" / "results" / "zoo_small.json").read_text())["rows"]
    (llama,) = [r for r in rows if r["name"] == "ref:llama"]
    quoted = re.findall(r"build of `ref:llama`, ([\d.]+) s of wall time", " ".join((ROOT / "README.md").read_text().split()))
    assert quoted == [f"{llama['build_wall_seconds']:.1f}"], "README's ref:llama build time differs from zoo_small.json"
