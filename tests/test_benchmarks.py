"""The benchmark scripts rerun on a user's text and model: one script end to end with ``--data`` on a small text file
and ``--model`` on a test-preset reference model (trained on that file first), in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROSE = "\n\n".join(__import__("pydoc_data.topics", fromlist=["topics"]).topics.values())


def test_bench_quant_on_a_text_file_and_a_test_preset_model(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(PROSE[:150_000], encoding="utf-8")
    results = tmp_path / "results"
    env = {**os.environ, "LLMX_BENCH_RESULTS": str(results), "LLMX_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_quant.py"), "--quick", "--data", str(notes),
           "--model", "ref:llama-test", "--seeds", "0", "1", "--max-tokens", "2048"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((results / "quant_ref_llama-test_on_notes.json").read_text())
    assert doc["data"] == str(notes) and doc["model"] == "ref:llama-test@notes"
    built = json.loads((Path(doc["model_path"]) / "zoo.json").read_text())
    assert built["corpus"]["source"] == str(notes) and built["preset"] == "test"  # the preset, trained on the file
    gptq = [r for r in doc["rows"] if r["method"] == "gptq"]
    assert sorted({r["seed"] for r in gptq}) == [0, 1] and len({r["perplexity"] for r in gptq}) > 1
    assert all(r["seed"] is None for r in doc["rows"] if r["method"] in ("rtn", "bnb"))
    summary = {(r["method"], r["format"]): r for r in doc["summary"]}
    g = summary["gptq", "w4a16 g128"]
    assert g["runs"] == 2 and g["increase_min_pct"] <= g["increase_mean_pct"] <= g["increase_max_pct"]
    assert g["gptq_vs_rtn"] in ("GPTQ ahead", "RTN ahead", "within noise")
    assert doc["eval"] == {"seq_len": 128, "stride": 64, "max_tokens": 2048}
    assert (results / "quant_ref_llama-test_on_notes.md").read_text().startswith("ref:llama-test@notes on ")
    assert not list((ROOT / "benchmarks" / "results").glob("*_on_notes*"))  # the repository's results untouched
