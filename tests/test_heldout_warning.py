"""A held-out split carved from a small data file is too small to report on without saying so (issue 66): align
and sft warn with the counts and the hint to pass eval_data; a large file, or eval_data, gets no warning."""

from __future__ import annotations

import json


def _pairs(path, n):
    path.write_text("".join(json.dumps({"prompt": f"q{i} =", "chosen": f" {i}", "rejected": f" {i + 1}"}) + "\n"
                            for i in range(n)))
    return path


def _sft_rows(path, n):
    path.write_text("".join(json.dumps({"prompt": f"q{i} =", "completion": f" {i}"}) + "\n" for i in range(n)))
    return path


def _align(cli, tmp_path, data, *sets):
    r = cli("align", "--method", "dpo", "--model", "tiny:llama", "--data", data, "--set", "steps=1",
            "--set", "batch_size=4", "--set", "max_len=32", *sets, "-o", tmp_path / "out")
    assert r.code == 0, r.err
    return r.err


def _sft(cli, tmp_path, data, *sets):
    r = cli("train", "--method", "sft", "--model", "tiny:llama", "--data", data, "--set", "steps=1",
            "--set", "batch_size=4", "--set", "max_length=32", "--set", "max_prompt_length=16", *sets,
            "-o", tmp_path / "out")
    assert r.code == 0, r.err
    return r.err


def test_align_warns_of_a_tiny_held_out_split(cli, tmp_path):
    err = _align(cli, tmp_path, _pairs(tmp_path / "eight.jsonl", 8))
    assert "held-out split" in err and "of 8 rows" in err and "eval_data" in err


def test_align_on_a_large_file_or_with_eval_data_does_not_warn(cli, tmp_path):
    assert "held-out split" not in _align(cli, tmp_path, _pairs(tmp_path / "many.jsonl", 400))
    small = _pairs(tmp_path / "eight.jsonl", 8)
    assert "held-out split" not in _align(cli, tmp_path, small, "--set", f"eval_data={small}")


def test_sft_warns_of_a_tiny_held_out_split_and_not_on_a_large_file(cli, tmp_path):
    err = _sft(cli, tmp_path, _sft_rows(tmp_path / "eight.jsonl", 8))
    assert "held-out split" in err and "of 8 rows" in err and "eval_data" in err
    assert "held-out split" not in _sft(cli, tmp_path, _sft_rows(tmp_path / "many.jsonl", 400))
