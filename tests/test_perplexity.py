"""Sliding-window perplexity: exact tiling, agreement with a direct computation, and the CLI stage."""

from __future__ import annotations

import math

import pytest
import torch

from llmx.core.eval.lm import sequence_nll, windows


@pytest.mark.parametrize("n,seq_len,stride", [(100, 16, 8), (100, 16, 16), (17, 16, 5), (5, 16, 8), (64, 16, 3)])
def test_windows_score_every_target_exactly_once(n, seq_len, stride):
    scored = []
    for begin, end, first in windows(n, seq_len, stride):
        assert end - begin <= seq_len and begin < first <= end
        scored += range(first, end)
    assert scored == list(range(1, n))


def test_matches_direct_loss_on_one_and_two_windows():
    from llmx.core.models.archs import build_random as build

    model, _ = build("llama")
    torch.manual_seed(1)
    tokens = torch.randint(3, 259, (48,))
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        first = model(input_ids=tokens[None, :32], labels=tokens[None, :32]).loss.item() * 31
        # the second window starts one token early so its first target (position 32) has context
        second = ce(model(input_ids=tokens[None, 31:]).logits[0, :-1], tokens[32:], reduction="sum").item()
    total, count = sequence_nll(model, tokens[:32], seq_len=32, stride=16, batch_size=4)
    assert count == 31 and math.isclose(total, first, rel_tol=1e-4)
    total, count = sequence_nll(model, tokens, seq_len=32, stride=32, batch_size=4)
    assert count == 47 and math.isclose(total, first + second, rel_tol=1e-4)


def test_eval_cli_writes_metrics(cli, tmp_path):
    r = cli("--json", "eval", "--method", "perplexity", "--model", "tiny:llama", "--set", "max_tokens=300",
            "--set", "seq_len=32", "-o", tmp_path)
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["tokens"] == 299 and m["perplexity"] == pytest.approx(math.exp(m["nll"]))
    assert 4.0 < m["bits_per_byte"] < 12.0  # a random byte-level model is near log2(259) bits per byte


def test_windows_out_reports_each_windows_span():
    from llmx.core.models.archs import build_random as build

    model, _ = build("llama")
    tokens = torch.randint(3, 259, (70,), generator=torch.Generator().manual_seed(2))
    out: list = []
    total, count = sequence_nll(model, tokens, seq_len=32, stride=16, batch_size=2, windows_out=out)
    assert [span for span, _, _ in out] == windows(70, 32, 16)
    assert [n for (_, end, first), _, n in out] == [end - first for _, end, first in windows(70, 32, 16)]
    assert sum(s for _, s, _ in out) == pytest.approx(total) and sum(n for _, _, n in out) == count


def test_every_window_row_carries_its_item(cli, tmp_path):
    """``windows.jsonl``'s ``item`` digests what a window scores: the same under another model, another under
    another seq_len."""
    import json
    from pathlib import Path

    def items(model, seq_len, out):
        r = cli("--json", "eval", "--method", "perplexity", "--model", model, "--set", "max_tokens=200",
                "--set", f"seq_len={seq_len}", "-o", tmp_path / out)
        assert r.code == 0, r.err
        rows = [json.loads(x) for x in Path(r.json()["run_dir"], "artifacts", "0_perplexity", "windows.jsonl").open()]
        ids = [row["item"] for row in rows]
        assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids) == len(rows) > 1
        return ids

    llama = items("tiny:llama", 32, "a")
    assert items("tiny:gpt2", 32, "b") == llama
    assert not set(items("tiny:llama", 48, "c")) & set(llama)
