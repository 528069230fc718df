"""Model sources and text sources: tiny specs, local folders, stdlib split, files, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from llmx.core import data, models
from llmx.errors import UsageError


@pytest.mark.parametrize("name", ["tiny:llama", "tiny:mamba", "tiny:mamba2", "tiny:moe"])
def test_tiny_models_build_and_run(name):
    model, tok = models.load(name)
    ids = tok("def f(x):\n    return x", return_tensors="pt")["input_ids"]
    out = model(input_ids=ids)
    assert out.logits.shape == (1, ids.shape[1], len(tok))
    assert all(p.shape[-1] % 64 == 0 for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n
               and "lm_head" not in n and p.shape[-1] >= 64)


def test_tiny_models_are_deterministic():
    a, _ = models.load("tiny:llama")
    b, _ = models.load("tiny:llama")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_bad_model_paths(tmp_path):
    with pytest.raises(UsageError, match="model folder not found"):
        models.load(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no config.json"):
        models.load(str(tmp_path / "empty"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="cannot load model"):
        models.load(str(tmp_path / "broken"))


def test_saved_model_reloads_with_identical_outputs(tmp_path):
    model, tok = models.load("tiny:llama")
    models.save(model, tok, tmp_path / "m")
    again, tok2 = models.load(str(tmp_path / "m"))
    ids = torch.tensor([[1, 50, 60, 70]])
    assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
    assert tok2("abc")["input_ids"] == tok("abc")["input_ids"]


def test_quantized_run_artifact_reloads_and_evaluates_the_same(cli, tmp_path):
    r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "--set", "save=true", "--set", "group_size=32",
            "--eval", "perplexity", "--set", "perplexity.max_tokens=256", "-o", tmp_path / "a")
    assert r.code == 0, r.err
    doc = r.json()
    saved = next((tmp_path / "a").glob("*/artifacts/1_rtn/model"))  # after the starting model's evaluation
    r2 = cli("--json", "eval", "--method", "perplexity", "--model", saved, "--set", "max_tokens=256", "-o", tmp_path / "b")
    assert r2.code == 0, r2.err
    assert r2.json()["stages"][0]["metrics"]["nll"] == pytest.approx(doc["stages"][-1]["metrics"]["nll"], rel=1e-6)


def test_stdlib_split_is_stable_disjoint_and_skips_tests():
    from llmx.core.data import stdlib

    names = [p.as_posix() for p in stdlib.files()]
    assert names and not any("/test/" in n or "/tests/" in n for n in names)
    train, val = data.documents("stdlib", "train"), data.documents("stdlib", "validation")
    assert len(val) > 10 and len(train) > 5 * len(val)
    assert not set(train) & set(val)
    assert data.documents("stdlib", "validation") == val


def test_text_and_jsonl_files(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("x" * 90 + "y" * 10)
    assert data.documents(str(txt), "validation", data.TextSplit("legacy")) == ["y" * 10]
    rows = tmp_path / "r.jsonl"
    rows.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(50)) + "\n")
    train, val = data.documents(str(rows), "train"), data.documents(str(rows), "validation")
    assert len(train) + len(val) == 50 and val
    rows.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in reversed(range(50))) + "\n")
    assert sorted(data.documents(str(rows), "validation")) == sorted(val)  # the split ignores row order
    legacy = data.TextSplit("legacy")
    old = [f"doc {i}" for i in range(50) if data.in_validation(f"r.jsonl:{i}")]  # rows by file name and index
    rows.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(50)) + "\n")
    assert data.documents(str(rows), "validation", legacy) == old
    rows.write_text('{"text": "ok"}\n{"txt": "bad"}\n')
    with pytest.raises(UsageError, match=r"r.jsonl:2: expected an object with a string field 'text'"):
        data.documents(str(rows), "train")


def _paragraphs(n: int) -> list[str]:
    return [f"paragraph {i} about {'code' if i % 2 else 'prose'}\nsecond line {i * 7}" for i in range(n)]


@pytest.mark.parametrize("mode", ["auto", "blocks"])
def test_text_file_splits_by_block_whatever_the_order(tmp_path, mode):
    """A sorted or shuffled file validates on the same blocks; the splits are disjoint, cover the text, and runs of
    one side come back as the file had them."""
    blocks = _paragraphs(200)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n\n".join(blocks) + "\n")
    b.write_text("\n\n".join(sorted(blocks, key=lambda t: t[::-1])) + "\n")
    rule = data.TextSplit(mode)

    def pieces(path, split):
        return {blk for doc in data.documents(str(path), split, rule) for blk in doc.split("\n\n")}

    val, train = pieces(a, "validation"), pieces(a, "train")
    assert val == pieces(b, "validation") and train == pieces(b, "train")
    assert not val & train and val | train == set(blocks)
    assert 0.04 < len(val) / len(blocks) < 0.2
    wide = {blk for doc in data.documents(str(a), "validation", data.TextSplit(mode, 40)) for blk in doc.split("\n\n")}
    assert len(wide) > 2 * len(val)
    train_docs = data.documents(str(a), "train", rule)
    assert all(doc in a.read_text() for doc in train_docs)  # contiguous runs of the file


def test_text_file_without_blank_lines_splits_by_line(tmp_path):
    lines = [f"sentence number {i} of a corpus with one sentence per line" for i in range(300)]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n")
    assert data.text_units(path.read_text(), "auto") == [line + "\n" for line in lines]
    val = [ln for doc in data.documents(str(path), "validation") for ln in doc.split("\n")]
    train = [ln for doc in data.documents(str(path), "train") for ln in doc.split("\n")]
    assert sorted(val + train) == sorted(lines) and 10 < len(val) < 60
    with pytest.raises(UsageError, match="no text in its (train|validation) split"):  # one block: one side is empty
        [data.documents(str(path), split, data.TextSplit("blocks")) for split in ("train", "validation")]


def test_text_units_restore_the_text_and_keep_indentation():
    text = "\n\na b\nc\n\n\n  \nd e\n\n    def f():\n        pass\n\nf"
    for mode in ("blocks", "lines"):
        assert "".join(data.text_units(text, mode)) == text
    blocks = data.text_units(text, "blocks")
    assert [u.strip() for u in blocks] == ["a b\nc", "d e", "def f():\n        pass", "f"]
    assert blocks[2].startswith("    def f():")  # a block keeps its first line's indentation


def test_crlf_and_indented_blocks_come_back_whole(tmp_path):
    blocks = [f"class C{i}:\r\n    def m{i}(self):\r\n        return {i}" for i in range(300)]
    path = tmp_path / "code.txt"
    path.write_bytes("\r\n\r\n".join(blocks).encode() + b"\r\n")
    docs = data.documents(str(path), "validation") + data.documents(str(path), "train")
    pieces = [b for d in docs for b in d.split("\r\n\r\n")]
    assert sorted(pieces) == sorted(blocks)  # no stray \r, every block's indentation intact


def test_auto_takes_blocks_only_when_enough_of_them_are_held_out():
    per_block = 100 // 10 * data.EXPECTED_HELD_UNITS  # blocks needed at 10%
    many = "\n\n".join(f"b{i}\nline" for i in range(per_block))
    few = "\n\n".join(f"b{i}\nline" for i in range(per_block - 1))
    assert len(data.text_units(many, "auto")) == per_block
    assert len(data.text_units(few, "auto")) == 2 * (per_block - 1)  # lines
    assert len(data.text_units(many, "auto", percent=5)) == 2 * per_block


def test_the_run_config_split_reaches_evaluation(cli, tmp_path):
    path = tmp_path / "prose.txt"
    path.write_text("\n\n".join(f"paragraph {i}: " + "word " * (20 + i % 7) for i in range(400)))
    args = ["--json", "eval", "--method", "perplexity", "--model", "tiny:llama", "--data", path, "-o", tmp_path / "r"]
    default, wide = cli(*args), cli(*args, "--set", "data.validation_percent=40")
    assert default.code == 0 and wide.code == 0, default.err + wide.err
    tokens = [r.json()["stages"][0]["metrics"]["tokens"] for r in (default, wide)]
    assert tokens[1] > 2 * tokens[0]
    bad = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--data", path, "--set", "data.text_split=line",
              "-o", tmp_path / "r")
    assert bad.code == 2 and "text_split" in bad.err


def test_text_split_rule_checks_its_fields():
    with pytest.raises(UsageError, match="Did you mean 'lines'"):
        data.TextSplit("line")
    with pytest.raises(UsageError, match="between 1 and 50"):
        data.TextSplit("auto", 0)


def test_empty_or_missing_data_is_exit_2(cli, tmp_path):
    for name, body in (("empty.txt", ""), ("blank.jsonl", " \n\n")):
        empty = tmp_path / name
        empty.write_text(body)
        r = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--data", empty, "-o", tmp_path / "runs")
        assert r.code == 2 and f"{empty}: the file is empty" in r.err and len(r.err.strip().splitlines()) == 1, r.err
        with pytest.raises(UsageError, match="the file is empty"):  # the API, past the up-front check, too
            data.documents(str(empty), "train")
    assert not (tmp_path / "runs").exists()
    r = cli("eval", "--method", "perplexity", "--model", "tiny:llama", "--data", "stdlb", "-o", tmp_path / "runs")
    assert r.code == 2 and "Did you mean 'stdlib'?" in r.err
