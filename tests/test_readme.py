"""The README's code runs as written: the Python API example and the plugin example."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def snippet(section: str) -> str:
    text = (ROOT / "README.md").read_text()
    body = text[text.index(f"## {section}"):]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_the_python_api_example_runs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # its data paths are the repository's
    namespace: dict = {}
    exec(compile(snippet("Python API"), "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    fp, w4 = re.search(r"perplexity ([\d.]+) \(FP\) -> ([\d.]+) \(W4 GPTQ", out).groups()
    assert float(fp) > 1 and float(w4) > 1 and namespace["quant"]["layers"] > 0
    assert namespace["cut"] and namespace["fit"]["steps"] == 4 and namespace["pref"]
    assert namespace["result"]["stages"] and namespace["cache"]


def test_the_plugin_example_runs_as_written(cli, tmp_path):
    (tmp_path / "my_plugin.py").write_text(snippet("Writing a plugin"))
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
