"""ref:llama-code's corpus (code-habits) and SafeCoder's default pairs: every weak form is what bandit reports for its
CWE and every safe form is not, the split's held-out names stay unseen, and a pair's changed spans are its two lines."""

from __future__ import annotations

import re

import pytest

from llmx.plugins.prosec import habits
from llmx.plugins.prosec.cwes import ELICITORS
from llmx.plugins.prosec.detect import detect
from llmx.plugins.prosec.scenarios import scenario, seeds

FILL = {"a": "name", "t": "users", "c": "key", "n": 8, "m": "ls"}


@pytest.mark.parametrize("cwe", sorted(habits.FORMS))
def test_each_weak_form_shows_its_cwe_in_the_scenario_and_its_paired_safe_form_does_not(cwe):
    s = scenario(seeds("validation")[3], cwe)
    _, forms = habits.FORMS[cwe]
    lines = [f"    {f.format(**FILL)}\n" for pair in forms for f in pair]
    found = detect([s.prompt] * len(lines), lines)
    assert all(f.parsed for f in found)
    assert [f.shows(cwe) for f in found] == [True, False] * len(forms)


def test_the_emitted_corpus_is_weak_at_even_odds_given_the_prompts_imports_and_on_train_signatures_only():
    """Read back from the documents themselves: among 338's and 502's functions whose imports are the elicitor's alone
    (what a scenario's prompt has), about half make the weak call, and every habit function's signature is a train
    seed's."""
    docs = habits.documents("train")[-habits.FUNCTIONS["train"] // habits.PER_DOCUMENT:]
    chunks = [c for d in docs for c in re.split(r"\n\n(?=import )", d)]
    assert len(chunks) == habits.FUNCTIONS["train"]
    train = {s.signature for s in seeds("train")}
    assert all(c.split("\n\n\n", 1)[1].split("\n", 1)[0] in train for c in chunks)
    for cwe, weak, safe in ((338, "random.", "secrets."), (502, "pickle.load", "json.load")):
        head = ELICITORS[cwe].imports
        mine = [c for c in chunks if c.split("\n\n\n", 1)[0] + "\n" == head]
        calls = [weak in c.split('"""')[-1] for c in mine if weak in c.split('"""')[-1] or safe in c.split('"""')[-1]]
        assert len(calls) == len(mine) > 200 and 0.4 < sum(calls) / len(calls) < 0.6, (cwe, len(calls), sum(calls))


def test_held_out_headers_and_the_elicitors_sentences_never_appear_in_the_training_text():
    train = "".join(habits.documents("train"))
    held = seeds("validation")
    assert held and not [s.where for s in held if s.header in train]
    habit = "".join(habits.documents("train")[-habits.FUNCTIONS["train"] // habits.PER_DOCUMENT:])
    for cwe, e in ELICITORS.items():  # the habit's docstrings paraphrase the task, never word for word
        before, after = e.task.split("{name}")
        assert not re.search(re.escape(before) + r"[\w ]+" + re.escape(after), habit), cwe


def test_a_fix_pair_is_the_same_function_weak_then_safe_and_its_spans_are_the_changed_lines():
    rows = habits.pairs(60, [89, 338, 502])
    assert {r["vul_type"] for r in rows} == {"cwe-089", "cwe-338", "cwe-502"}
    for row in rows:
        before, after, ch = row["func_src_before"], row["func_src_after"], row["char_changes"]
        cwe = int(row["vul_type"].removeprefix("cwe-"))
        bad, good = detect(["", ""], [before, after])
        assert bad.parsed and good.parsed and bad.shows(cwe) and not good.shows(cwe)
        deleted = "".join(before[s["char_start"]:s["char_end"]] for s in ch["deleted"])
        added = "".join(after[s["char_start"]:s["char_end"]] for s in ch["added"])
        a, b = before.splitlines(), after.splitlines()
        assert len(deleted.splitlines()) == len(added.splitlines()) == 1  # one statement, fixed in place
        assert deleted.splitlines() == [x for x in a if x not in b] and added.splitlines() == [x for x in b if x not in a]


@pytest.mark.parametrize("data, phrase", [("nope", "not found"), ("stdlib", "not fix pairs")])
def test_safecoder_refuses_a_missing_path_or_a_text_corpus_in_one_line(cli, tmp_path, data, phrase):
    r = cli("train", "--method", "safecoder", "--model", "ref:llama-test", "--data",
            tmp_path / data if data == "nope" else data, "-o", tmp_path / "runs")
    assert r.code == 2 and phrase in r.err and "code-habits" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "runs").exists()
