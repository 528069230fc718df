"""Config merging, --set, two-pass validation and error rendering."""

from __future__ import annotations

import glob

import pytest
import yaml
from conftest import ROOT

from llmx.core.config import apply_sets, deep_merge, parse_set, resolve
from llmx.errors import ConfigError, UsageError


def methods():
    from llmx.core.plugins import host

    return host().methods


def test_every_shipped_config_validates(cli):
    files = sorted(glob.glob(str(ROOT / "configs/**/*.yaml"), recursive=True))
    assert files
    r = cli("--json", "config", "validate", *files)
    assert r.code == 0, r.err
    assert all(item["ok"] for item in r.json())


def test_deep_merge_merges_mappings_and_replaces_lists():
    base = {"data": {"source": "stdlib", "seq_len": 64}, "pipeline": [{"method": "a"}, {"method": "b"}]}
    out = deep_merge(base, {"data": {"seq_len": 32}, "pipeline": [{"method": "c"}]})
    assert out == {"data": {"source": "stdlib", "seq_len": 32}, "pipeline": [{"method": "c"}]}
    assert base["data"]["seq_len"] == 64  # inputs untouched


def test_parse_set_splits_on_first_equals_and_keeps_strings():
    assert parse_set("a.b=c=d") == (["a", "b"], "c=d")
    assert parse_set("skip=[\"lm_head\", \"q\"]") == (["skip"], ["lm_head", "q"])
    assert parse_set("x=true") == (["x"], "true")
    with pytest.raises(UsageError):
        parse_set("novalue")


def test_precedence_defaults_files_flags_set(cli, tmp_path):
    a = tmp_path / "a.yaml"
    rtn32 = [{"method": "rtn", "params": {"group_size": 32}}]
    a.write_text(yaml.safe_dump({"seed": 1, "model": "tiny:llama", "pipeline": rtn32}))
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump({"seed": 2, "pipeline": [{"method": "rtn", "params": {"bits": "w3a16"}}]}))
    shown = cli("--json", "config", "show", a, b).json()
    assert shown["seed"] == 2
    params = shown["pipeline"][0]["params"]
    assert params["bits"] == "w3a16" and params["group_size"] is None  # lists replace: a's params are gone
    shown = cli("--json", "config", "show", a, "--seed", "5").json()
    assert shown["seed"] == 5 and shown["pipeline"][0]["params"]["group_size"] == 32
    shown = cli("--json", "config", "show", a, "--seed", "5", "--set", "seed=7", "--set", "rtn.group_size=64").json()
    assert shown["seed"] == 7 and shown["pipeline"][0]["params"]["group_size"] == 64
    # stage sugar: flags beat the file, --set beats flags, bare keys are the stage's params
    dry = cli("--json", "--dry-run", "quantize", "-c", a, "--bits", "w8a16", "--set", "bits=w2a16", "--set", "group_size=16")
    params = dry.json()["config"]["pipeline"][0]["params"]
    assert params["bits"] == "w2a16" and params["group_size"] == 16


def test_set_values_are_coerced_by_field_type():
    raw = apply_sets({"pipeline": [{"method": "rtn"}]}, ["seed=3", "rtn.symmetric=false", "rtn.group_size=64"])
    run = resolve(raw, methods())
    assert run.config.seed == 3
    assert run.stages[0].params.symmetric is False and run.stages[0].params.group_size == 64


def test_three_mistakes_reported_at_once_with_paths(cli, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"sed": 1, "data": {"seq_len": -4},
                                   "pipeline": [{"method": "rtn", "params": {"bits": "w5a3"}}]}))
    r = cli("run", cfg)
    assert r.code == 2
    assert "3 problems" in r.err
    assert "sed: unknown key 'sed'. Did you mean 'seed'?" in r.err
    assert "data.seq_len:" in r.err
    assert "pipeline.0.params.bits:" in r.err and "w4a16" in r.err
    assert "Traceback" not in r.err
    assert not (tmp_path / "runs").exists()


def test_unknown_method_did_you_mean_and_stage_mismatch(cli):
    r = cli("quantize", "--method", "rnt", "--model", "tiny:llama")
    assert r.code == 2 and "Did you mean 'rtn'?" in r.err
    r = cli("quantize", "--method", "qptq", "--model", "tiny:llama")
    assert r.code == 2 and "Did you mean 'gptq'?" in r.err
    r = cli("align", "--method", "rtn", "--model", "tiny:llama")
    assert r.code == 2 and "does not support stage 'align'" in r.err


def test_registry_did_you_mean_qptq_suggests_gptq():
    from llmx.core.registry import MethodRegistry
    from llmx.core.spec import MethodSpec, Stage

    reg = MethodRegistry([MethodSpec("gptq", (Stage.QUANTIZE,), "m:f"), MethodSpec("rtn", (Stage.QUANTIZE,), "m:f"),
                          MethodSpec("pipa-m", (Stage.ALIGN,), "m:f", aliases=("pipa",))])
    with pytest.raises(UsageError, match="Did you mean 'gptq'"):
        reg.get("qptq")
    assert reg.get("GPTQ").name == "gptq"
    assert reg.get("Pipa_M").name == "pipa-m" and reg.get("PIPA").name == "pipa-m"
    with pytest.raises(ValueError, match="already provided"):
        reg.add(MethodSpec("GPTQ", (Stage.QUANTIZE,), "m:f"))


def test_problems_are_config_errors_with_dotted_paths():
    with pytest.raises(ConfigError) as info:
        resolve({"pipeline": [{"method": "rtn", "params": {"group_size": -2}}, {"methd": "x"}]}, methods())
    paths = [p.path for p in info.value.problems]
    assert "pipeline.0.params.group_size" in paths and "pipeline.1.methd" in paths and "pipeline.1.method" in paths


def test_config_init_writes_a_valid_file_and_refuses_overwrite(cli, tmp_path):
    out = tmp_path / "q.yaml"
    assert cli("config", "init", "--method", "rtn", "--model", "tiny:llama", "-o", out).code == 0
    assert cli("config", "validate", out).code == 0
    r = cli("config", "init", "--method", "rtn", "-o", out)
    assert r.code == 2 and "exists" in r.err


def test_yaml_errors_are_usage_errors(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: [\n")
    r = cli("run", bad)
    assert r.code == 2 and "not valid YAML" in r.err
    assert cli("run", tmp_path / "missing.yaml").code == 2
    r = cli("--json", "config", "validate", bad)
    assert r.code == 2 and r.json()[0]["ok"] is False


def test_paths_in_a_recipe_resolve_from_its_folder(cli, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "recipes"
    folder.mkdir()
    shutil.copy(ROOT / "configs/smoke/data/sft_rows.jsonl", folder / "rows.jsonl")
    (folder / "notes.txt").write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(200)))
    (folder / "r.yaml").write_text("model: tiny:llama\ndata: {source: notes.txt, seq_len: 32}\npipeline:\n"
                                   "  - method: sft\n    params: {data: rows.jsonl, steps: 1, batch_size: 2, max_length: 64,"
                                   " max_prompt_length: 32, save: false}\n  - method: perplexity\n"
                                   "    params: {max_tokens: 256}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = cli("--json", "run", folder / "r.yaml", "-o", "runs")
    assert r.code == 0, r.err
    config = (next((elsewhere / "runs").iterdir()) / "config.yaml").read_text()
    assert str(folder / "rows.jsonl") in config and str(folder / "notes.txt") in config
