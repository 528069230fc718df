"""The benchmark scripts rerun on a user's text and model: one script end to end with ``--data`` on a small text file
and ``--model`` on a test-preset reference model (trained on that file first), in a fresh process; and the verdict
that decides "ahead" against the seed range."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPO_RESULTS = ROOT / "benchmarks" / "results"


def _listing(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_bench_quant_on_a_text_file_and_a_test_preset_model(notes, tmp_path):
    results, before = tmp_path / "results", _listing(REPO_RESULTS)
    env = {**os.environ, "LLMX_BENCH_RESULTS": str(results), "LLMX_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_quant.py"), "--quick", "--data", str(notes),
           "--model", "ref:llama-test", "--seeds", "0", "1", "--max-tokens", "2048"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert _listing(REPO_RESULTS) == before  # the repository's results untouched
    doc = json.loads((results / "quant_ref_llama-test_on_notes.json").read_text())
    assert doc["data"] == str(notes) and doc["model"] == "ref:llama-test@notes"
    built = json.loads((Path(doc["model_path"]) / "zoo.json").read_text())
    assert built["corpus"]["source"] == str(notes) and built["preset"] == "test"  # the preset, trained on the file

    import llmx

    direct = llmx.evaluate(doc["model_path"], data=str(notes), max_tokens=2048)  # the FP row scored notes.txt
    assert doc["rows"][0]["method"] == "fp" and doc["rows"][0]["perplexity"] == pytest.approx(direct["perplexity"])
    gptq = [r for r in doc["rows"] if r["method"] == "gptq"]
    assert sorted({r["seed"] for r in gptq}) == [0, 1] and len({r["perplexity"] for r in gptq}) > 1
    assert all(r["seed"] is None for r in doc["rows"] if r["method"] in ("rtn", "bnb"))
    g = {(r["method"], r["format"]): r for r in doc["summary"]}["gptq", "w4a16 g128"]
    runs = [r["ppl_increase_pct"] for r in gptq if r["format"] == "w4a16 g128"]
    assert g["runs"] == 2 and (g["increase_min_pct"], g["increase_max_pct"]) == (min(runs), max(runs))
    assert g["gptq_vs_rtn"] == "n/a (fewer than 3 seeds)"
    assert (results / "quant_ref_llama-test_on_notes.md").read_text().startswith("ref:llama-test@notes on ")


def test_verdict_calls_ahead_only_outside_the_seed_range():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import verdict

    names = ("new", "old")
    assert verdict([1.0, 1.1, 1.2], [1.3], names) == "new ahead"  # lower is better; old has no seed
    assert verdict([1.0, 1.1, 1.4], [1.3], names) == "within noise"
    assert verdict([1.0, 1.1, 1.2], [0.5, 0.6, 0.9], names) == "old ahead"
    assert verdict([1.0, 1.1, 1.2], [0.5, 0.6, 0.9], names, lower_is_better=False) == "new ahead"
    assert verdict([1.0, 1.1], [1.3], names) == "n/a (fewer than 3 seeds)"


def test_bench_feeder_model_free_sections_alone(tmp_path):
    """``bench_feeder.py --only cuts copy`` needs no trained model (ref:llama-icl is not built): at the default pool
    the tree never cuts, the old 400-row pool does, and the exact copier keeps one row per cue, sufficient, each
    member necessary for exactly its cue. The repository's results are untouched."""
    results, before = tmp_path / "results", _listing(REPO_RESULTS)
    env = {**os.environ, "LLMX_BENCH_RESULTS": str(results), "LLMX_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_feeder.py"), "--only", "cuts", "copy", "--maps", "2",
           "--seeds", "0", "--work", str(tmp_path / "work")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert _listing(REPO_RESULTS) == before and not (tmp_path / "cache").exists()  # no model was built
    doc = json.loads((results / "feeder_defaults.json").read_text())
    default = [r for r in doc["cuts"] if r["pool"] == "default"]
    assert len(default) == 4 and all(r["whole_pool_fits"] and r["truncations"] == 0 for r in default)
    assert all(r["truncations"] > 0 for r in doc["cuts"] if r["pool"] == "old 400-row")
    exact = [v for v in doc["copy_verdict"] if v["noise"] == 0]
    assert [v["verdict"] for v in exact] == ["pass"] * 3 and all(v["passed"] > 0 == v["failed"] for v in exact)
    assert doc["machine"]["torch_cpu_capability"] and (results / "feeder_defaults.md").is_file()
