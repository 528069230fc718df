"""The reference zoo: real training beats the unigram floor, builds are deterministic and keyed by everything that
determines them, users build on their own text under a name, corruption and concurrent builds are handled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from llmx.core import zoo
from llmx.core.zoo.request import RefRequest


def weights(path):
    """A copy of the weights (load_file may map the file, which a test then corrupts in place)."""
    return {k: v.clone() for k, v in load_file(str(path / "model.safetensors")).items()}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("LLMX_CACHE_DIR", str(root))
    return root / "zoo"


def test_test_preset_learns_far_below_unigram(cli):
    r = cli("--json", "zoo", "build", "llama", "--preset", "test")
    assert r.code == 0, r.err
    info = r.json()
    assert info["val_perplexity"] < 0.85 * info["unigram_perplexity"]
    assert info["params"] > 100_000 and info["vocab"] == 512 and info["name"] == "ref:llama-test"
    listed = cli("--json", "zoo", "list").json()
    assert any(e["ok"] and e["arch"] == "llama" and e["preset"] == "test" and "ref:llama-test" in e["names"]
               for e in listed)


def test_build_on_a_text_file_under_a_name_reuse_and_other_corpus(cli, cache, notes, prose, tmp_path):
    args = ["--json", "zoo", "build", "llama", "--preset", "test", "--data", notes, "--steps", "30", "--name", "notes"]
    first = cli(*args)
    assert first.code == 0, first.err
    made = first.json()
    assert made["built"] and made["name"] == "ref:notes" and made["corpus"]["source"] == str(notes)
    again = cli(*args).json()
    assert not again["built"] and again["path"] == made["path"]
    r = cli("--json", "eval", "--method", "perplexity", "--model", "ref:notes", "--data", notes,
            "--set", "max_tokens=2048", "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    assert r.json()["stages"][0]["metrics"]["perplexity"] < made["unigram_perplexity"]
    other = tmp_path / "other.txt"
    other.write_text(prose[120_000:240_000], encoding="utf-8")
    moved = cli("--json", "zoo", "build", "llama", "--preset", "test", "--data", other, "--steps", "30", "--name",
                "notes").json()
    assert moved["built"] and moved["path"] != made["path"]
    assert zoo.locate("ref:notes") == zoo.cache_root() / os.path.basename(moved["path"])  # the name follows
    listed = {e["entry"]: e["names"] for e in cli("--json", "zoo", "list").json()}
    assert listed[os.path.basename(made["path"])] == [] and listed[os.path.basename(moved["path"])] == ["ref:notes"]


def test_cache_key_covers_what_determines_the_model():
    a = RefRequest("llama", "test")
    assert a.key("corpus1") != a.key("corpus2")
    assert a.key("c") != a.key("c", tokenizer_fingerprint="t")
    for changed in (dict(steps=10), dict(seed=3), dict(preset="small"), dict(tokens=9000), dict(layers=3),
                    dict(hidden=128), dict(heads=2), dict(kv_heads=1), dict(vocab=600), dict(seq_len=32)):
        assert a.key("c") != RefRequest(**{"arch": "llama", "preset": "test", **changed}).key("c"), changed
    assert a.key("c") == RefRequest("llama", "test", name="mine").key("c")  # a name is an alias, not a build
    same = [RefRequest("llama", "test", kv_heads=2), RefRequest("llama", "test", steps=150),  # defaults made explicit
            RefRequest("llama", "test", tokens=150 * 8 * 64)]  # a budget of exactly the preset's steps
    assert {r.key("c") for r in same} == {a.key("c")} and {r.path("c") for r in same} == {a.path("c")}
    assert RefRequest("llama", "test", tokens=1000).key("c") == RefRequest("llama", "test", tokens=1024).key("c")


def test_shape_options_and_token_budget_reach_the_model(cli, cache, notes):
    r = cli("--json", "zoo", "build", "qwen2", "--preset", "test", "--data", notes, "--layers", "3", "--hidden", "128",
            "--heads", "8", "--kv-heads", "2", "--vocab", "400", "--seq-len", "32", "--tokens", "2560")
    assert r.code == 0, r.err
    info = r.json()
    config = json.loads((zoo.cache_root() / os.path.basename(info["path"]) / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (3, 128, 8, 2, 400)
    assert info["steps_run"] == 10 and info["tokens_seen"] == 2560  # 2560 tokens / (batch 8 x 32)
    assert info["weights_step"] == info["steps_run"]


def test_bad_input_is_one_line_exit_2_and_leaves_no_entry(cli, cache, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 20)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 50)
    cases = {("--data", empty): "empty.txt: the file is empty", ("--data", binary): "NUL byte",
             ("--data", latin): "latin.txt:1: not UTF-8",
             ("--seq-len", "0"): "--seq-len must be at least 2", ("--heads", "3"): "3 heads do not divide hidden 64",
             ("--kv-heads", "3"): "do not divide 4 heads", ("--tokens", "100", "--steps", "3"): "give one",
             ("--tokenizer", "ref:me", "--name", "me"): "names the model being built",
             ("--name", "llama-test"): "built-in", ("--text-split", "line"): "Did you mean 'lines'?",
             ("--validation-percent", "0"): "between 1 and 50"}
    for extra, message in cases.items():
        r = cli("zoo", "build", "llama", "--preset", "test", *extra)
        assert r.code == 2 and message in r.err, (extra, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert cli("zoo", "build", "opt", "--preset", "test", "--kv-heads", "2").code == 2  # no GQA in OPT
    assert "no attention heads" in cli("zoo", "build", "mamba2", "--preset", "test", "--heads", "2").err
    assert cli("zoo", "build", "llama", "--tokenizer", "ref:llama-test", "--vocab", "600").code == 2
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a few words only")
    r = cli("zoo", "build", "llama", "--preset", "test", "--data", tiny)
    assert r.code == 2 and "no text in its validation split (raise data.validation_percent" in r.err
    r = cli("zoo", "build", "llama", "--preset", "test", "--data", tiny, "--text-split", "legacy")
    assert r.code == 2 and "too few for one window" in r.err
    assert not cache.exists() or [p.name for p in cache.iterdir() if not p.name.startswith(".locks")] == []


def test_an_unwritable_cache_fails_before_training(cli, monkeypatch, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("LLMX_CACHE_DIR", str(blocked))
    r = cli("zoo", "build", "llama", "--preset", "test", "--steps", "5")
    assert r.code == 2 and "cannot write the zoo cache" in r.err and "training" not in r.err


def test_latin1_jsonl_for_evaluation_is_exit_2_with_file_and_line(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    r = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--data", bad, "-o", tmp_path / "runs")
    assert r.code == 2 and "bad.jsonl:2: not UTF-8" in r.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_text_files_utf8_in_full_and_utf16_named(tmp_path):
    from llmx.core.data.files import json_lines, read_text
    from llmx.errors import UsageError

    rows = [{"text": "a\u2028b\u2029c\x85d"}, {"text": "\ufeffsecond"}]
    f = tmp_path / "sep.jsonl"
    f.write_text("\ufeff" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    assert [row for _, row in json_lines(f)] == rows  # separators inside strings, a BOM, CRLF
    u16 = tmp_path / "cjk.txt"
    u16.write_text("\u65e5\u672c\u8a9e" * 10, encoding="utf-16")
    with pytest.raises(UsageError, match="UTF-16"):
        read_text(u16)


def test_same_seed_same_weights_other_seed_differs(monkeypatch, tmp_path):
    first = zoo.ensure(RefRequest("mamba2", "test"), show_progress=False)
    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / "other"))
    again, built = zoo.provide(RefRequest("mamba2", "test"), show_progress=False)
    assert built and again != first and again.name == first.name
    a, b = weights(first), weights(again)
    assert all(torch.equal(a[k], b[k]) for k in a)
    seeded = zoo.ensure(RefRequest("mamba2", "test", seed=1), show_progress=False)
    assert seeded.name != first.name and not torch.equal(weights(seeded)["lm_head.weight"], a["lm_head.weight"])


def test_fresh_processes_with_other_thread_counts_build_the_same_bytes(notes, tmp_path):
    """Same seed, same weights on any machine with the same versions: two builds in fresh processes, one and two
    threads (torch and the tokenizer trainer), from a text file, give identical files."""
    cmd = [sys.executable, "-m", "llmx", "--json", "zoo", "build", "llama", "--preset", "test", "--data", str(notes),
           "--steps", "40"]
    built = []
    for threads in ("1", "2"):
        env = {**os.environ, "LLMX_CACHE_DIR": str(tmp_path / f"c{threads}"), "OMP_NUM_THREADS": threads,
               "RAYON_NUM_THREADS": threads}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-500:]
        built.append(json.loads(out.stdout))
    a, b = (Path(d["path"]) for d in built)
    assert a != b and a.name == b.name
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert built[0]["environment"] == built[1]["environment"]
    assert built[0]["val_perplexity"] == built[1]["val_perplexity"]


def test_an_entry_built_under_other_versions_is_reused_with_a_warning(cache, caplog):
    from llmx.core import manifest

    req = RefRequest("llama", "test", steps=5)
    path = zoo.ensure(req, show_progress=False)
    recorded = json.loads((path / "zoo.json").read_text())
    assert recorded["environment"]["torch"] == torch.__version__ and recorded["environment"]["cpu_capability"]
    recorded["environment"]["torch"] = "0.0"
    (path / "zoo.json").write_text(json.dumps(recorded))
    manifest.write(path)
    again, built = zoo.provide(req, show_progress=False)
    assert again == path and not built
    assert "built under other versions (torch 0.0 -> " in caplog.text


def test_corrupted_entry_is_detected_and_rebuilt(cache, caplog):
    req = RefRequest("llama", "test", steps=40)
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


def test_a_named_entry_lost_is_built_again_from_its_request(cache, notes, caplog, monkeypatch, tmp_path):
    monkeypatch.chdir(notes.parent)
    path = zoo.ensure(RefRequest("llama", "test", steps=20, data=notes.name, name="mine"), show_progress=False)
    good = weights(path)
    (path / "model.safetensors").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the relative data path was stored absolute
    with caplog.at_level("WARNING", logger="llmx.zoo"):
        again = zoo.locate("ref:mine")
    assert "building it again" in caplog.text and again == path
    assert all(torch.equal(good[k], weights(again)[k]) for k in good)
    (path / "model.safetensors").unlink()
    notes.write_text(notes.read_text() + " and more text", encoding="utf-8")
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match="has changed since it was built"):  # not a different model under the name
        zoo.locate("ref:mine")


def test_rm_removes_entries_and_their_names(cli, cache, notes):
    assert cli("zoo", "build", "llama", "--preset", "test", "--data", notes, "--steps", "10", "--name", "gone").code == 0
    r = cli("zoo", "rm", "ref:gne")
    assert r.code == 2 and "Did you mean 'ref:gone'?" in r.err
    r = cli("--json", "zoo", "rm", "ref:gone")
    assert r.code == 0 and len(r.json()["removed"]) == 1
    assert cli("--json", "zoo", "list").json() == []
    r = cli("eval", "--method", "perplexity", "--model", "ref:gone", "-o", "runs")
    assert r.code == 2 and "unknown model 'ref:gone'" in r.err


def test_stale_and_shared_entries(cli, cache, notes, monkeypatch):
    old = cache / "llama-test-s0-0123456789ab"
    old.mkdir(parents=True)
    (old / "zoo.json").write_text(json.dumps({"name": "ref:llama", "zoo_version": 1, "preset_spec": {"hidden": 64}}))
    from llmx.core import manifest

    manifest.write(old)
    r = cli("zoo", "list")
    assert r.code == 0 and "stale" in r.out
    assert cli("--json", "zoo", "list").json()[0]["names"] == []
    monkeypatch.setattr(os, "umask", lambda mask=0: 0o022)
    from llmx.core import atomic

    atomic._umask.cache_clear()
    path = zoo.ensure(RefRequest("llama", "test", steps=5, data=str(notes)), show_progress=False)
    assert path.stat().st_mode & 0o777 == 0o755 and (path / "zoo.json").stat().st_mode & 0o044  # readable by others
    assert {p.stat().st_mode & 0o777 for p in path.iterdir()} == {0o644}  # the weights too (safetensors writes 0600)


def test_a_foreign_tokenizer_without_pad_keeps_eos_trainable():
    from llmx.core.models.archs import config
    from llmx.core.tokenizer import byte_tokenizer
    from llmx.core.zoo.corpus import special_ids

    tok = byte_tokenizer()
    tok.pad_token = tok.eos_token  # as GPT-2's and base Qwen2's tokenizers come
    assert special_ids(tok) == (None, tok.bos_token_id, tok.eos_token_id)
    from transformers import AutoModelForCausalLM

    for arch in ("llama", "qwen2", "opt", "moe"):
        model = AutoModelForCausalLM.from_config(config(arch, len(tok), special_ids=special_ids(tok)))
        emb = model.get_input_embeddings()
        assert emb.padding_idx is None and emb.weight[tok.eos_token_id].abs().sum() > 0


def test_tokenizer_fingerprint_covers_the_special_ids():
    from llmx.core.tokenizer import byte_tokenizer
    from llmx.core.zoo.corpus import tokenizer_fingerprint

    a, b = byte_tokenizer(), byte_tokenizer()
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    b.pad_token = b.eos_token  # same vocabulary, another padding id: another model config
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(b)


def test_a_named_tokenizer_is_reused_not_retrained(cache, notes):
    base = zoo.ensure(RefRequest("llama", "test", steps=10, data=str(notes), name="base"), show_progress=False)
    other = zoo.ensure(RefRequest("gpt2", "test", steps=10, data="pydoc", tokenizer="ref:base"), show_progress=False)
    assert (base / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()
    trained = zoo.ensure(RefRequest("gpt2", "test", steps=10, data="pydoc"), show_progress=False)
    assert trained != other and (trained / "tokenizer.json").read_text() != (other / "tokenizer.json").read_text()


def test_concurrent_builds_of_one_entry_train_it_once(cache, notes):
    env = {**os.environ, "LLMX_CACHE_DIR": str(cache.parent)}
    cmd = [sys.executable, "-m", "llmx", "--json", "zoo", "build", "llama", "--preset", "test", "--data", str(notes),
           "--steps", "40"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    docs = [json.loads(o[0]) for o in outs]
    assert sorted(d["built"] for d in docs) == [False, True]
    assert docs[0]["built_by"] == docs[1]["built_by"] and docs[0]["path"] == docs[1]["path"]
    assert zoo.verify(zoo.cache_root() / os.path.basename(docs[0]["path"])) is None
    assert [p.name for p in cache.iterdir() if p.name.startswith(".") and p.name != ".locks"] == []  # no tmp folders


def test_byte_level_bpe_has_no_unknown_tokens(prose):
    from llmx.core.tokenizer import train_bpe

    tok = train_bpe([prose[:50_000]], 400)
    for text in ("na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001f600 \u0000\t\r\n", "\u202e\ufeff\U0010ffff"):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_pydoc_is_prose_split_by_topic_with_a_tenth_held_out():
    from llmx.core.data import documents
    from llmx.core.data.pydoc import shingles

    train, val = documents("pydoc", "train"), documents("pydoc", "validation")
    seen = set().union(*map(shingles, train))
    held = set().union(*map(shingles, val))
    assert len(val) >= 5 and len(held & seen) < 0.01 * len(held)  # nested topics (with inside compound) dropped
    share = sum(map(len, val)) / sum(map(len, train + val))
    assert 0.09 < share < 0.2
    assert sum(d.count(" the ") for d in train) > 1000  # English prose, not code


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


def test_a_recipe_builds_its_reference_model_first(cli, cache, notes, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: ref:recipe\nzoo: {{arch: gpt2, preset: test, data: {notes}, steps: 10, name: recipe}}\n"
                      f"data: {{source: {notes}, seq_len: 64}}\npipeline:\n  - method: perplexity\n"
                      "    params: {max_tokens: 1024}\n")
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    assert "ref:recipe" in zoo.known_names()
    recipe.write_text("model: ref:recipe\nzoo: {arch: lama, preset: test}\npipeline:\n  - method: perplexity\n")
    r = cli("run", recipe, "-o", tmp_path / "runs")
    assert r.code == 2 and "zoo.name" in r.err
    recipe.write_text("model: ref:other\nzoo: {arch: llama, preset: test, name: recipe}\npipeline:\n  - method: perplexity\n")
    r = cli("run", recipe, "-o", tmp_path / "runs")
    assert r.code == 2 and "load it with model: ref:recipe" in r.err
    recipe.write_text("model: ref:x\nzoo: {arch: lama, name: x, hidden: wide}\npipeline:\n  - method: perplexity\n")
    r = cli("config", "validate", recipe)
    assert r.code == 2 and "zoo.hidden" in r.err


def test_the_icl_preset_trains_on_episodes_without_early_stopping():
    """``ref:llama-icl`` is the in-context episode model: its corpus is icl-episodes unless --data says otherwise,
    and it trains every step (the induction circuit forms after a plateau an early stop would cut)."""
    from llmx.core.zoo.request import parse_builtin

    req = parse_builtin("llama-icl")
    assert req.data == "icl-episodes" and req.builtin and req.ref_name == "ref:llama-icl"
    assert req.spec.patience is None and req.spec.layers == 2
    assert RefRequest("llama", "icl", data="icl-episodes") == req
    assert RefRequest("llama", "icl", data="stdlib").ref_name is None
    assert RefRequest("llama").data == "stdlib" and "data" not in RefRequest("llama").options()


def test_the_shipped_step_is_the_best_with_early_stopping_and_the_last_without():
    from llmx.core.train.loop import TrainResult
    from llmx.core.zoo.build import weights_step

    result = TrainResult(steps=40000, best_step=26000, best_eval=2.3, seconds=1.0, last_loss=2.3)
    assert (weights_step(result, 4), weights_step(result, None)) == (26000, 40000)
