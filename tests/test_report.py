"""``llmx report``: one row per run and stage, readable at 80 columns, and plots a test can see."""

from __future__ import annotations

import csv

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """The rtn recipe (perplexity, rtn, perplexity) and the lm recipe (a loss curve), run once."""
    from llmx.cli.app import main

    out = tmp_path_factory.mktemp("runs")
    for recipe in ("rtn", "lm"):
        assert main(["-q", "run", str(ROOT / "configs" / "smoke" / f"{recipe}.yaml"), "-o", str(out)]) == 0
    return out


def test_default_table_fits_80_columns(cli, smoke_runs, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("report", smoke_runs)
    assert r.code == 0, r.err
    assert max(map(len, r.out.splitlines())) <= 80
    assert "smoke-rtn" in r.out and "0:perplexity" in r.out and "bits w4a16" in r.out and "heldout_loss" in r.out


def test_failed_runs_show_their_status_and_half_written_curves_are_read(cli, smoke_runs, tmp_path):
    import json
    import shutil

    runs_dir = tmp_path / "runs"
    shutil.copytree(smoke_runs, runs_dir)
    lm = next(p for p in runs_dir.iterdir() if "smoke-lm" in p.name)
    meta = json.loads((lm / "meta.json").read_text())
    (lm / "meta.json").write_text(json.dumps({**meta, "status": "failed"}))
    with (lm / "artifacts" / "0_lm" / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 11, "lo')  # a killed run's last line
    r = cli("report", runs_dir)
    assert r.code == 0 and "[failed]" in r.out, r.err
    assert cli("report", runs_dir, "--plot", tmp_path / "plots").code == 0


def test_chosen_metrics_and_machine_formats(cli, smoke_runs):
    md = cli("report", smoke_runs, "--metrics", "perplexity,bits", "--format", "md").out.splitlines()
    assert md[0] == "| run | status | stage | seconds | perplexity | bits |"
    assert len(md) == 2 + 3 + 2  # a row per stage: rtn's three, lm's two
    rows = list(csv.DictReader(cli("report", smoke_runs, "--format", "csv").out.splitlines()))
    assert {r["stage"] for r in rows} >= {"0:perplexity", "1:rtn", "0:lm"} and "quantized_bytes" in rows[0].keys()
    doc = cli("--json", "report", smoke_runs).json()
    assert len(doc) == 5 and all("metrics" in d for d in doc)


def test_plots_are_pictures_with_their_data_beside_them(cli, smoke_runs, tmp_path):
    from matplotlib.image import imread

    r = cli("report", smoke_runs, "--plot", tmp_path / "plots")
    assert r.code == 0, r.err
    for name in ("pareto", "loss", "bars"):
        png, table = tmp_path / "plots" / f"{name}.png", tmp_path / "plots" / f"{name}.csv"
        pixels = imread(png)
        assert pixels.shape[0] >= 300 and pixels.shape[1] >= 400, name
        ink = (pixels[..., :3] < 0.9).any(axis=-1).mean()
        assert 0.01 < ink < 0.6, (name, ink)  # drawn on, not blank and not a solid block
        assert len(list(csv.DictReader(table.open()))) >= 2, name
    pareto = list(csv.DictReader((tmp_path / "plots" / "pareto.csv").open()))
    assert {(p["method"], p["weight_bits"]) for p in pareto} >= {("fp", "16"), ("rtn", "4"), ("lm (train)", "16")}


def test_a_quantizing_run_says_which_column_is_fp_and_which_quantized(cli, tmp_path):
    r = cli("run", ROOT / "configs" / "smoke" / "rtn.yaml", "-o", tmp_path)
    assert r.code == 0, r.err
    head = " ".join(r.out.splitlines()[:4])
    assert "(FP)" in head and "(W4A16)" in head and "change" in head
    assert "%" in next(line for line in r.out.splitlines() if line.strip("│ ").startswith("perplexity"))


def test_a_path_that_does_not_exist_says_so(cli, tmp_path):
    r = cli("report", tmp_path / "typo")
    assert r.code == 2 and f"{tmp_path / 'typo'}: does not exist" in r.err and len(r.err.strip().splitlines()) == 1
    r = cli("report", tmp_path)
    assert r.code == 2 and "not a run folder" in r.err  # there, but holds no runs


def test_stages_of_one_method_are_labelled_by_the_params_that_differ():
    from pathlib import Path

    from llmx.core.report import StageRow, distinguish

    def row(method, params):
        return StageRow("r", "ok", 0, method, "quantize", 1.0, {}, Path("."), params=params)

    rows = distinguish([row("quamba2", {"recipe": "naive", "bits": "w4a8"}),
                        row("quamba2", {"recipe": "quamba2", "bits": "w4a8"}), row("perplexity", {"max_tokens": 64}),
                        row("perplexity", {"max_tokens": 64})])
    assert [r.label for r in rows] == ["0:quamba2 recipe=naive", "0:quamba2 recipe=quamba2", "0:perplexity",
                                       "0:perplexity"]
