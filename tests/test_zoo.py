"""The reference zoo: real training beats the unigram floor, builds are deterministic, corruption is caught."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from llmx.core import zoo


def weights(path):
    """A copy of the weights (load_file may map the file, which a test then corrupts in place)."""
    return {k: v.clone() for k, v in load_file(str(path / "model.safetensors")).items()}


def test_test_preset_learns_far_below_unigram(cli):
    r = cli("--json", "zoo", "build", "llama", "--preset", "test")
    assert r.code == 0, r.err
    info = r.json()
    assert info["val_perplexity"] < 0.85 * info["unigram_perplexity"]
    assert info["params"] > 100_000 and info["vocab"] == 512
    listed = cli("--json", "zoo", "list").json()
    assert any(e["ok"] and e["arch"] == "llama" and e["preset"] == "test" for e in listed)


def test_same_seed_same_weights_other_seed_differs(monkeypatch, tmp_path):
    first = zoo.ensure(zoo.RefRequest("mamba2", "test"), show_progress=False)
    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / "other"))
    again = zoo.build(zoo.RefRequest("mamba2", "test"), show_progress=False)
    assert again != first and again.name == first.name
    a, b = weights(first), weights(again)
    assert all(torch.equal(a[k], b[k]) for k in a)
    seeded = zoo.build(zoo.RefRequest("mamba2", "test", seed=1), show_progress=False)
    assert seeded.name != first.name and not torch.equal(weights(seeded)["lm_head.weight"], a["lm_head.weight"])


def test_corrupted_entry_is_detected_and_rebuilt(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path))
    req = zoo.RefRequest("llama", "test", steps=40)
    path = zoo.ensure(req, show_progress=False)
    good = weights(path)
    blob = bytearray((path / "model.safetensors").read_bytes())
    blob[-100] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(blob))
    assert "does not match its checksum" in zoo.verify(path)
    assert any(not e["ok"] for e in zoo.entries())
    with caplog.at_level("WARNING", logger="llmx.zoo"):
        rebuilt = zoo.ensure(req, show_progress=False)
    assert "rebuilding" in caplog.text
    assert zoo.verify(rebuilt) is None
    assert all(torch.equal(good[k], weights(rebuilt)[k]) for k in good)
    (rebuilt / "tokenizer.json").unlink()
    assert zoo.verify(rebuilt) == "tokenizer.json is missing"


def test_cache_key_covers_what_determines_the_model():
    a = zoo.RefRequest("llama", "test")
    assert a.key("corpus1") != a.key("corpus2")
    assert a.key("c") != zoo.RefRequest("llama", "test", steps=10).key("c")
    assert a.key("c") != zoo.RefRequest("llama", "test", seed=3).key("c")
    assert a.key("c") != zoo.RefRequest("llama", "small").key("c")


def test_unknown_reference_names_are_exit_2(cli):
    r = cli("zoo", "build", "lama")
    assert r.code == 2 and "Did you mean 'llama'?" in r.err
    r = cli("eval", "--method", "perplexity", "--model", "ref:lama", "-o", "runs")
    assert r.code == 2 and "Did you mean 'ref:llama'?" in r.err
    assert cli("zoo", "build", "llama", "--preset", "huge").code == 2


def test_ref_model_loads_through_the_cli_and_evaluates(cli, tmp_path):
    r = cli("--json", "eval", "--method", "perplexity", "--model", "ref:llama-test", "--set", "max_tokens=2048",
            "-o", tmp_path)
    assert r.code == 0, r.err
    trained = r.json()["stages"][0]["metrics"]["perplexity"]
    r = cli("--json", "eval", "--method", "perplexity", "--model", "tiny:llama", "--set", "max_tokens=2048", "-o", tmp_path)
    assert trained < r.json()["stages"][0]["metrics"]["perplexity"]
