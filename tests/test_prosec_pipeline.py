"""ProSec's pipeline on a scripted policy: a fake generator that, per CWE, writes an unparseable, a vulnerable or a
fixed statement at known rates (drawn per (prompt, sample) from a seeded hash, so the draw does not depend on the
order of the calls) and a fixer that writes the known fix. bandit is the real analyser. The pipeline's counts and
rates must equal what the policy wrote, exactly; every security pair must be a vulnerable statement the policy wrote
for that prompt against a fix without the CWE. (The policy's draw is fixed by its hash, so how close its rates come
to the script is the fixture's business, not asserted.)"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from llmx.plugins.prosec import pipeline
from llmx.plugins.prosec.cwes import ELICITORS
from llmx.plugins.prosec.detect import detect
from llmx.plugins.prosec.scenarios import seeds

# per CWE: (unparsed rate, vulnerable rate), the rest fixed; the continuations after the elicitor's statement start
RATES = {89: (0.2, 0.5), 78: (0.1, 0.3), 502: (0.3, 0.4), 338: (0.0, 0.6)}
WRITES = {
    89: {"vulnerable": '"SELECT c{k} FROM t WHERE a = " + x)\n    return 1\n',
         "fixed": '"SELECT c{k} FROM t WHERE a = ?", (x,))\n    return 1\n',
         "unparsed": '"SELECT c{k} FROM t WHERE a = " + x\n    return 1\n'},
    78: {"vulnerable": '"ls -{k} " + path, shell=True)\n', "fixed": '["ls", "-{k}", path])\n',
         "unparsed": '"ls -{k} " + path, shell=True\n'},
    502: {"vulnerable": " pickle.loads(f.read()[{k}:])\n", "fixed": " json.loads(f.read()[{k}:])\n",
          "unparsed": " pickle.loads(f.read()[{k}:]\n"},  # the start ends in 'return', the space is the model's
    338: {"vulnerable": "random.choice(string.ascii_letters) for _ in range({k} + 8))\n",
          "fixed": "secrets.choice(string.ascii_letters) for _ in range({k} + 8))\n",
          "unparsed": "random.choice(string.ascii_letters) for _ in range({k} + 8)\n"},
}
SCENARIOS, SAMPLES = 5, 10


def _draw(prompt: str, k: int) -> float:
    return int.from_bytes(hashlib.blake2b(f"{prompt}:{k}".encode(), digest_size=8).digest(), "big") / 2 ** 64


class Policy:
    """The scripted model: what it wrote, per CWE and prompt, is logged."""

    def __init__(self):
        self.log: dict[int, dict[str, list[str]]] = {c: {} for c in RATES}  # cwe -> prompt -> kinds written

    def cwe_of(self, prompt: str) -> int | None:
        return next((c for c in RATES if prompt.endswith(ELICITORS[c].start)), None)

    def sample(self, prompts: list[str], n: int) -> list[list[str]]:
        out = []
        for prompt in prompts:
            cwe = self.cwe_of(prompt)
            if cwe is None:  # a benign original: plain code
                out.append([f"    return {k}\n" for k in range(n)])
                continue
            unparsed, vulnerable = RATES[cwe]
            kinds = ["unparsed" if u < unparsed else "vulnerable" if u < unparsed + vulnerable else "fixed"
                     for u in (_draw(prompt, k) for k in range(n))]
            self.log[cwe].setdefault(prompt[:-len("    " + ELICITORS[cwe].start)], []).extend(kinds)
            out.append([WRITES[cwe][kind].format(k=k) for k, kind in enumerate(kinds)])
        return out

    def fix(self, todo, n: int) -> list[list[str]]:
        """The known fix of each vulnerable statement (502's and 338's read a module the prompt does not import,
        so the filter drops them and the rule's rewrite, which imports it, stands in)."""
        return [[WRITES[s.cwe]["fixed"].format(k=next(k for k in range(SAMPLES) if _statement(s.cwe, k) == r))] * n
                for s, r in todo]


def _statement(cwe: int, k: int, kind: str = "vulnerable") -> str:
    """The response the pipeline keeps of a write: the statement start and the write's first line."""
    return "    " + ELICITORS[cwe].start + WRITES[cwe][kind].format(k=k).split("\n")[0] + "\n"


def _run(policy: Policy):
    stages = pipeline.Stages(policy.sample, detect, lambda texts: np.zeros((len(texts), 1)), policy.fix)
    return pipeline.run(seeds("train", limit=SCENARIOS), list(RATES), per_cwe=SCENARIOS, samples=SAMPLES,
                        fix_samples=1, stages=stages)


@pytest.fixture(scope="module")
def scripted():
    policy = Policy()
    return policy, _run(policy)


def test_the_counts_are_what_the_policy_wrote_and_the_rates_the_scripted_ones(scripted):
    policy, result = scripted
    total = {"samples": 0, "parsed": 0}
    for cwe in RATES:
        written = [k for kinds in policy.log[cwe].values() for k in kinds]
        row = result.stats["per_cwe"][str(cwe)]
        n, bad, vul = len(written), written.count("unparsed"), written.count("vulnerable")
        assert (row["scenarios"], row["samples"]) == (SCENARIOS, SCENARIOS * SAMPLES) == (len(policy.log[cwe]), n)
        assert (row["unparsed"], row["vulnerable"]) == (bad, vul), cwe
        assert row["parse_rate"] == (n - bad) / n and row["vulnerable_rate"] == vul / (n - bad)
        assert row["benign_vulnerable_rate"] == 0.0
        assert row["pairs"] == sum(min(pipeline.PER_PROMPT, kinds.count("vulnerable"))
                                   for kinds in policy.log[cwe].values())  # distinct statements, three a prompt
        total["samples"] += n
        total["parsed"] += n - bad
    assert result.stats["parse_rate"] == total["parsed"] / total["samples"]
    pairs = sum(r["pairs"] for r in result.stats["per_cwe"].values())
    assert pairs > 0 and result.stats["security_pairs"] == pairs == result.stats["utility_pairs"]
    assert len(result.rows) == 2 * pairs  # every scenario has benign answers: the mix keeps every pair, 1:1
    by_cwe = {c: sum(1 for r in result.security if r["cwe"] == c) for c in RATES}
    model = by_cwe[89] + by_cwe[78]  # their known fixes survive the filters; 502's and 338's need the rule
    assert result.stats["fix_sources"] == {"model": model, "rule": pairs - model}


def test_each_pair_is_a_vulnerable_statement_written_for_its_prompt_against_a_fix_without_the_cwe(scripted):
    policy, result = scripted
    for r in result.security:
        kinds = policy.log[r["cwe"]][r["prompt"]]
        wrote = {_statement(r["cwe"], k) for k, kind in enumerate(kinds) if kind == "vulnerable"}
        assert r["rejected"] in wrote, r
        chosen, rejected = detect([r["prompt"]] * 2, [r["chosen"], r["rejected"]])
        assert chosen.parsed and not chosen.shows(r["cwe"]) and rejected.shows(r["cwe"]), r
    utility = [r for r in result.rows if r["benign"]]
    assert all(r["chosen"].startswith("    return ") and r["rejected"] in {s["chosen"] for s in result.security}
               for r in utility)


def test_the_comparison_measures_per_cwe_rates_utility_and_parse_rate_on_three_arms_and_seeds(tmp_path):
    """The spec: prosec judged against safecoder and the unaligned model on 3 seeds; its items carry the reported
    fields; per arm, the metric by CWE and each reported field are the items' means, inside their intervals."""
    from llmx import api
    from llmx.core.compare import runner
    from llmx.core.plugins import host

    spec = host().comparison("prosec")
    assert {a.name for a in spec.arms} == {"prosec", "safecoder", "unaligned"} and spec.target == "prosec"
    assert set(spec.judged) == {"safecoder", "unaligned"} and len(spec.seeds) == 3 and spec.by == "cwe"
    assert set(spec.report) >= {"parse_rate", "benign_logp"} and spec.counts == ("security_pairs", "security_pairs_kept")
    assert spec.evaluation["params"]["completion"] == "statement"
    api.run({"model": "ref:llama-test", "threads": 1, "seed": 0, "pipeline": [
        {"method": "secure-code", "params": {"cwes": [89, 502], "scenarios": 2, "samples": 2}}]},
        output_dir=tmp_path / "runs")
    (items,) = (tmp_path / "runs").glob("*/artifacts/0_secure-code/items.jsonl")
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    assert all({spec.metric, spec.by, *spec.report} <= set(r) for r in rows)
    assert all(r["parse_rate"] == r["parsed"] / r["samples"] for r in rows)
    assert all(r["parsed_vulnerable_share"] == (r["vulnerable"] / r["parsed"] if r["parsed"] else None) for r in rows)
    benign = [r for r in rows if r["benign_logp"] is not None]  # each benign original once, on the first CWE's rows
    assert [r["cwe"] for r in benign] == [89, 89] and all(r["benign_logp"] < 0 for r in benign)
    assert all(r["benign_parse_rate"] is None for r in rows if r["benign_logp"] is None)

    def run(seed, shift):
        keys = [(f"i{c}-{k}", 0) for c in (89, 502) for k in range(4)]
        return {"seed": seed, "items": {key: (0.5 if "89" in key[0] else 0.1) + shift for key in keys},
                "extra": {"cwe": {key: 89 if "89" in key[0] else 502 for key in keys},
                          **{f: {key: (0.9 - shift if f in spec.shares else -1.0 - shift) for key in keys}
                             for f in spec.report}},
                "counts": {"security_pairs": 7}}

    out = runner._reported(spec, [run(0, 0.0), run(1, 0.1), run(2, 0.2)])
    assert out["by"]["89"]["mean"] == pytest.approx(0.6) and out["by"]["502"]["mean"] == pytest.approx(0.2)
    assert all(v["low"] <= v["mean"] <= v["high"] for v in [*out["by"].values(), *out["report"].values()])
    assert out["report"]["benign_logp"]["mean"] == pytest.approx(-1.1) and out["by"]["89"]["items"] == 12
    assert out["report"]["benign_logp"]["low"] < -1.2 and out["report"]["parse_rate"]["high"] == 1.0  # shares held
    assert set(spec.shares) == {spec.metric, *spec.report} - {"benign_logp"}
    md = "\n".join(runner._reported_md({"metric": spec.metric, "by": "cwe", "arms": [
        {"name": "prosec", **out, "runs": [{"seed": 0, "counts": {"security_pairs": 7}}]}]}))
    assert "| prosec | " in md and f"{spec.metric} (cwe 89)" in md and "security_pairs 7" in md


def _arm_rows(seeds, value, counts=None):
    """One arm's collected runs: 24 items (12 per CWE) scoring ``value(seed, k)``, with the reported fields."""
    keys = [(f"i{c}-{k}", 0) for c in (89, 502) for k in range(12)]
    return [{"seed": s, "run_dir": "x", "cost": 0.0, "value": None, "split": None, "machine": None,
             "items": {key: value(s, k) for k, key in enumerate(keys)},
             "extra": {"cwe": {key: int(key[0][1:].split("-")[0]) for key in keys},
                       **{f: {key: 0.5 for key in keys} for f in ("parse_rate", "parsed_vulnerable_share", "benign_logp",
                                                                  "benign_parse_rate")}},
             **({"counts": counts(s)} if counts else {})} for s in seeds]


@pytest.mark.parametrize("void", [(0, 1, 2), (1,)])
def test_a_prosec_arm_that_made_no_pairs_is_not_judged_as_prosec(tmp_path, void):
    """empty: skip leaves the model unaligned on a seed without kept pairs: its verdicts must say so ("void" where
    every seed is), not read as ProSec within noise of the model it did not change."""
    from llmx.core.compare import runner
    from llmx.core.plugins import host

    spec = host().comparison("prosec")
    seeds = (0, 1, 2)

    def unaligned(s, k):
        return 0.25 + 0.02 * ((k * 7 + s) % 5)

    def prosec(s, k):
        return unaligned(s, k) if s in void else 0.05

    def counts(s):
        return {"security_pairs": 0 if s in void else 9, "security_pairs_kept": 0 if s in void else 8}

    rows = {"unaligned": _arm_rows(seeds, unaligned), "safecoder": _arm_rows(seeds, lambda s, k: 0.2),
            "prosec": _arm_rows(seeds, prosec, counts)}
    result = runner._judge(runner.Plan(spec, "m", {}, seeds, False, tmp_path), rows)
    assert [v["baseline"] for v in result["verdicts"]] == ["safecoder", "unaligned"]
    for v in result["verdicts"]:
        assert v["void_seeds"] == sorted(void)
        if len(void) == len(seeds):
            assert v["verdict"].startswith("void: prosec made no security_pairs, security_pairs_kept on any seed")
        else:
            assert v["verdict"].endswith("; prosec untrained on seed 1 (security_pairs, security_pairs_kept 0)")
        assert v["verdict"] in runner.markdown(result)
    rows["prosec"] = _arm_rows(seeds, prosec, lambda s: {"security_pairs": 3, "security_pairs_kept": 3})
    trained = runner._judge(runner.Plan(spec, "m", {}, seeds, False, tmp_path), rows)["verdicts"]
    assert not any("void_seeds" in v or "untrained" in v["verdict"] for v in trained)
