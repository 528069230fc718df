"""No comparison scores text its calibration saw (issue 67). The quick forms of the comparisons whose arms calibrate,
learn dictionaries or prune from data run with the data layer recorded: every calibration draw reads the train split,
every scored stream the validation split, of one source; and those two splits share no document."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

# Each comparison whose arms draw calibration windows, and the module that reads its scored stream by name.
CALIBRATED = {"gptq": "llmx.plugins.evals.perplexity", "guidedquant": "llmx.plugins.evals.perplexity",
              "quamba2": "llmx.plugins.evals.perplexity", "clover-prune": "llmx.plugins.evals.perplexity",
              "lexico": "llmx.plugins.lexico.measure"}
# Draws made to measure, not to learn from (Lexico's dictionary error on vectors it never saw): read as scored.
MEASURING = {"_held_out_errors"}


def _split_of(args: tuple, kwargs: dict) -> str:
    """``random_windows(tokenizer, source, n_samples, seq_len, seed=0, split="train", ...)``'s split."""
    return kwargs.get("split", args[5] if len(args) > 5 else "train")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CALIBRATED))
def test_a_comparison_scores_only_text_its_calibration_never_saw(name, cli, tmp_path, monkeypatch):
    import importlib

    import llmx.core.data as data

    seen: list[tuple[str, str, str]] = []
    draw, stream = data.random_windows, data.token_stream

    def recorded_draw(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_name
        seen.append(("scored" if caller in MEASURING else "calibration", args[1], _split_of(args, kwargs)))
        return draw(*args, **kwargs)

    def recorded_stream(tokenizer, source, split, *args, **kwargs):
        seen.append(("scored", source, split))
        return stream(tokenizer, source, split, *args, **kwargs)

    monkeypatch.setattr(data, "random_windows", recorded_draw)
    monkeypatch.setattr(importlib.import_module(CALIBRATED[name]), "token_stream", recorded_stream)
    r = cli("--json", "compare", name, "--quick", "-o", tmp_path)
    assert r.code == 0, r.err
    calibration = {(source, split) for kind, source, split in seen if kind == "calibration"}
    scored = {(source, split) for kind, source, split in seen if kind == "scored"}
    assert calibration and scored, seen  # both were recorded: a moved reader must be named here
    assert {split for _, split in calibration} == {"train"} and {split for _, split in scored} == {"validation"}
    result = json.loads(r.out)
    assert result["split"] == "validation", result["split"]


def test_the_train_and_validation_splits_share_no_document(tmp_path):
    """The guarantee the comparisons rest on, for the corpus they run on and for a local text file in each mode."""
    from llmx.core.data import TextSplit, documents

    def digests(source: str, split: str, splitting=None) -> set[str]:
        return {hashlib.sha1(d.encode()).hexdigest() for d in documents(source, split, splitting)}

    assert digests("stdlib", "validation") and not digests("stdlib", "train") & digests("stdlib", "validation")
    text = tmp_path / "notes.txt"
    blocks = [f"block {i}\nline {i} of a note, with words {i * 7}" for i in range(400)]
    text.write_text("\n\n".join(blocks) + "\n")
    for mode, sep in (("blocks", "\n\n"), ("lines", "\n")):
        units = {split: {u.strip() for d in documents(str(text), split, TextSplit(mode=mode)) for u in d.split(sep)} - {""}
                 for split in ("train", "validation")}
        assert units["train"] and units["validation"] and not units["train"] & units["validation"], mode
        everything = set(blocks) if mode == "blocks" else {line for b in blocks for line in b.split("\n")}
        assert units["train"] | units["validation"] == everything, mode
