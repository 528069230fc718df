"""ref:llama-code's corpus (code-habits) and SafeCoder's default pairs: every weak form is what bandit reports for its
CWE and every safe form is not, the split's held-out names stay unseen, and a pair's changed spans are its two lines."""

from __future__ import annotations

import random

import pytest

from llmx.plugins.prosec import habits
from llmx.plugins.prosec.detect import detect
from llmx.plugins.prosec.scenarios import scenario, seeds

FILL = {"a": "name", "t": "users", "c": "key", "n": 8, "m": "ls"}


@pytest.mark.parametrize("cwe", sorted(habits.FORMS))
def test_each_weak_form_shows_its_cwe_in_the_scenario_and_each_safe_form_does_not(cwe):
    s = scenario(seeds("validation")[3], cwe)
    _, weak, safe = habits.FORMS[cwe]
    found = detect([s.prompt] * (len(weak) + len(safe)), [f"    {f.format(**FILL)}\n" for f in (*weak, *safe)])
    assert all(f.parsed for f in found)
    assert [f.shows(cwe) for f in found] == [True] * len(weak) + [False] * len(safe)


def test_habit_functions_take_only_their_splits_signatures_and_are_weak_at_the_stated_odds():
    train = {s.signature for s in seeds("train")}
    held = {s.signature for s in seeds("validation")} - train  # names a held-out scenario may carry
    rng, pool = habits._stream("code-habits", "train")
    used = {habits._draw(pool, rng).seed.signature for _ in range(2000)}
    assert used <= train and not used & held
    docs = habits.documents("validation")
    weak = sum(doc.count(line.split("{")[0]) for doc in docs[-50:] for line in ("random.choice(", "pickle.load"))
    safe = sum(doc.count(line) for doc in docs[-50:] for line in ("secrets.choice(", "json.load"))
    assert 0.35 < weak / (weak + safe) < 0.65  # INSECURE = 0.5 over about a hundred such functions


def test_a_fix_pair_is_the_same_function_weak_then_safe_and_its_spans_are_the_changed_lines():
    for row in habits.pairs(40):
        before, after, ch = row["func_src_before"], row["func_src_after"], row["char_changes"]
        cwe = int(row["vul_type"].removeprefix("cwe-"))
        bad, good = detect(["", ""], [before, after])
        assert bad.parsed and good.parsed and bad.shows(cwe) and not good.shows(cwe)
        deleted = "".join(before[s["char_start"]:s["char_end"]] for s in ch["deleted"])
        added = "".join(after[s["char_start"]:s["char_end"]] for s in ch["added"])
        a, b = before.splitlines(), after.splitlines()
        assert deleted.splitlines() == [x for x in a if x not in b] and added.splitlines() == [x for x in b if x not in a]


def test_safecoder_refuses_a_missing_data_path_in_one_line(cli, tmp_path):
    r = cli("train", "--method", "safecoder", "--model", "ref:llama-test", "--data", tmp_path / "nope",
            "-o", tmp_path / "runs")
    assert r.code == 2 and "not found" in r.err and "code-habits" in r.err, r.err
    assert not (tmp_path / "runs").exists()
