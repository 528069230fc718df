"""``llmx compare``: comparisons as data, one runner. A planted better arm is called ahead and an identical one
within noise; a rerun reuses finished arms (also after an interruption); bad input exits 2 before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmx.core.compare import runner
from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.eval import stats

QUICK_EVAL = {"method": "perplexity", "params": {"max_tokens": 1024}}
NOTES = "".join(f"Note {i}: the {['red', 'green', 'blue'][i % 3]} kettle boiled {i % 7} times before the train left "
                f"platform {i % 11}, and nobody wrote down why.\n" for i in range(400))  # a user's own text


def _spec(**kw) -> ComparisonSpec:
    """The starting model against itself (equal by construction) and against 2-bit RTN (worse by construction)."""
    base = dict(name="planted", summary="planted arms", target="start",
                arms=(Arm("start", cost=16.0), Arm("start-again", family="again", cost=16.0),
                      Arm("rtn-w2", ({"method": "rtn", "params": {"bits": "w2a16", "group_size": 32, "save": False}},))),
                evaluation=QUICK_EVAL, model="ref:llama-test", data={"source": "stdlib", "seq_len": 64}, seeds=(0, 1))
    return ComparisonSpec(**{**base, **kw})


def test_a_better_arm_is_ahead_an_identical_one_within_noise_and_the_results_are_written(tmp_path):
    import llmx

    model, tok = llmx.load("ref:llama-test")  # a model folder and a text file of the user's own
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "notes.txt").write_text(NOTES * 3)
    own = runner.run(runner.plan(_spec(seeds=(0,)), out=tmp_path / "own", model=str(tmp_path / "model"),
                                 data=str(tmp_path / "notes.txt")), progress=False)
    assert own["data"]["source"].endswith("notes.txt") and all(v["pairs"] > 10 for v in own["verdicts"])
    result = runner.run(runner.plan(_spec(), out=tmp_path / "cmp", model=str(tmp_path / "model")), progress=False)
    tmp_path = tmp_path / "cmp"
    verdicts = {v["baseline"]: v for v in result["verdicts"]}
    assert verdicts["rtn-w2"]["verdict"] == "ahead" and verdicts["rtn-w2"]["low"] > 0
    assert verdicts["start-again"]["verdict"] == "within noise" and verdicts["start-again"]["improvement"] == 0
    assert verdicts["rtn-w2"]["seeds"] == 2 and verdicts["rtn-w2"]["pairs"] > 20
    stored = json.loads((tmp_path / "result.json").read_text())
    assert [len(a["runs"]) for a in stored["arms"]] == [2, 2, 2]
    rtn = next(a for a in stored["arms"] if a["name"] == "rtn-w2")
    assert 2 < rtn["cost"] < 3.5  # measured: 2 bits and a scale per 32 weights
    assert "| rtn-w2 | rtn |" in (tmp_path / "result.md").read_text()
    assert (tmp_path / "result.png").read_bytes()[:4] == b"\x89PNG"


def test_a_rerun_reuses_finished_arms_even_after_an_interruption(tmp_path, monkeypatch):
    spec = _spec(seeds=(0,))
    real, calls = runner._execute, []

    def interrupted(planned, progress):
        if calls:
            raise KeyboardInterrupt
        calls.append(planned.arm.name)
        return real(planned, progress)

    monkeypatch.setattr(runner, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run(runner.plan(spec, out=tmp_path), progress=False)
    monkeypatch.setattr(runner, "_execute", lambda planned, progress: calls.append(planned.arm.name) or
                        real(planned, progress))
    said = []
    first = runner.run(runner.plan(spec, out=tmp_path), progress=False, say=said.append)
    assert calls == ["start", "start-again", "rtn-w2"] and "reused" in said[0]
    calls.clear()
    again = runner.run(runner.plan(spec, out=tmp_path), progress=False)
    assert calls == [] and again["verdicts"] == first["verdicts"]
    changed = runner.plan(spec, out=tmp_path, sets=["rtn-w2.group_size=64"])
    runner.run(changed, progress=False)
    assert calls == ["rtn-w2"]  # a changed arm is a new run; the others are reused


def test_an_interruption_inside_an_arms_pipeline_reruns_that_arm_alone(tmp_path, monkeypatch):
    import llmx.plugins.evals.perplexity as perplexity

    spec = _spec(seeds=(0,))
    clean = runner.run(runner.plan(spec, out=tmp_path / "clean"), progress=False)
    real, calls = perplexity.run, []

    def killed(ctx, p):  # the third evaluation is rtn-w2's, after its quantization stage finished
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(ctx, p)

    monkeypatch.setattr(perplexity, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.run(runner.plan(spec, out=tmp_path / "cut"), progress=False)
    monkeypatch.setattr(perplexity, "run", real)
    said = []
    again = runner.run(runner.plan(spec, out=tmp_path / "cut"), progress=False, say=said.append)
    assert [s.split(": ")[-1].split()[0] for s in said] == ["reused", "reused", "running"]
    assert again["verdicts"] == clean["verdicts"]


def test_a_model_folder_or_text_changed_in_place_is_not_reused_and_each_run_says_where_it_ran(tmp_path):
    import llmx

    model, tok = llmx.load("ref:llama-test")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "notes.txt").write_text(NOTES * 2)
    spec = _spec(seeds=(0,), arms=(Arm("start", cost=16.0), Arm("start-again", cost=16.0)))

    def ran() -> list[str]:
        said: list[str] = []
        result = runner.run(runner.plan(spec, out=tmp_path / "cmp", model=str(tmp_path / "model"),
                                        data=str(tmp_path / "notes.txt")), progress=False, say=said.append)
        assert all(r["machine"]["torch_cpu_capability"] and "git_commit" in r for a in result["arms"]
                   for r in a["runs"])
        return ["reused" in s for s in said]

    assert ran() == [False, False] and ran() == [True, True]
    (tmp_path / "notes.txt").write_text(NOTES * 3)  # the user's text, edited
    assert ran() == [False, False]
    import torch

    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)
    model.save_pretrained(tmp_path / "model")  # the model, retrained in place
    assert ran() == [False, False] and ran() == [True, True]


def test_items_are_paired_by_what_was_scored_not_by_position(tmp_path):
    own = {"method": "perplexity", "params": {"max_tokens": 1024}}
    spec = _spec(seeds=(0,), evaluation=None, items="windows.jsonl", target="a",
                 arms=(Arm("a", (own,), cost=16.0), Arm("b", (own,), cost=16.0)))
    same = runner.run(runner.plan(spec, out=tmp_path / "same"), progress=False)
    assert same["verdicts"][0]["improvement"] == 0 and same["verdicts"][0]["pairs"] > 5
    shifted = runner.plan(spec, out=tmp_path / "shifted", sets=["b.seq_len=32"])  # b scores other windows
    verdict = runner.run(shifted, progress=False)["verdicts"][0]
    assert verdict["verdict"].startswith("unpaired: seed 0:") and verdict["improvement"] is None
    assert (tmp_path / "shifted" / "result.json").is_file()  # the other baselines' verdicts are still written


def test_a_changed_arm_loses_its_declared_cost(tmp_path):
    spec = _spec(seeds=(0,), tolerance=1.0, arms=(Arm("start", cost=16.0), Arm("start-again", cost=16.0),
                 Arm("rtn-w8", ({"method": "rtn", "params": {"bits": "w8a16", "save": False}},), cost=16.0)))
    changed = runner.plan(spec, out=tmp_path, sets=["rtn-w8.bits=w2a16"])
    assert [r.declared for r in changed.runs] == [16.0, 16.0, None]  # measured instead: about 2.5 bits
    verdicts = {v["baseline"]: v["verdict"] for v in runner.run(changed, progress=False)["verdicts"]}
    assert verdicts["rtn-w8"].startswith("unmatched")


def test_a_baseline_whose_measured_cost_is_not_matched_is_not_judged(tmp_path):
    result = runner.run(runner.plan(_spec(seeds=(0,), tolerance=1.0), out=tmp_path), progress=False)
    verdicts = {v["baseline"]: v["verdict"] for v in result["verdicts"]}
    assert verdicts["start-again"] == "within noise (one seed)" and verdicts["rtn-w2"].startswith("unmatched")
    assert "| rtn-w2 | rtn |" in (tmp_path / "result.md").read_text()


def test_quick_overrides_reach_every_stage_with_the_field_or_only_the_named_methods():
    assert runner._quick_for({"max_tokens": 64, "rtn.group_size": 16}, "rtn") == {"max_tokens": 64, "group_size": 16}
    assert runner._quick_for({"max_tokens": 64, "rtn.group_size": 16}, "perplexity") == {"max_tokens": 64}


def _judged(table):
    """``runner._verdict`` on per-seed rows of paired differences (the baseline scoring 0 on every item)."""
    target = {seed: {(str(i), 0): float(d) for i, d in enumerate(row)} for seed, row in enumerate(table)}
    rows = [{"seed": seed, "items": dict.fromkeys(target[seed], 0.0)} for seed in target]
    return runner._verdict("b", target, rows, 1.0)


def test_the_interval_covers_a_noisy_null_with_few_seeds_and_one_seed_says_it_covers_items_only():
    import numpy as np

    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):  # 3 seeds that shift every item alike (sd 0.5), 40 items each (sd 1): zero in truth
        v = _judged(rng.normal(0, 1, size=(3, 40)) + rng.normal(0, 0.5, size=(3, 1)))
        covered += v["low"] <= 0 <= v["high"]
    assert covered / 200 >= 0.90  # the bootstrap alone covered about 0.80 here
    one = _judged(rng.normal(0.5, 0.1, size=(1, 40)))
    assert one["verdict"] == "ahead (one seed)"


def test_a_handful_of_items_gets_no_verdict_however_they_fall():
    assert _judged([[0.01, 0.5]])["verdict"] == "too few items (2 per seed)"
    assert _judged([[0.0] * 8, [0.0] * 8])["verdict"] == "too few items (8 per seed)"
    assert _judged([[0.1 + 0.01 * i for i in range(7)]] * 3)["verdict"] == "too few items (7 per seed)"


def test_a_relative_tolerance_scales_with_the_targets_cost():
    spec = _spec(tolerance=0.05, relative=True)
    assert spec.matched(1.04e6, 1.0e6) and not spec.matched(1.06e6, 1.0e6)
    assert _spec(tolerance=0.05).matched(1.0, 1.04) and not _spec(tolerance=0.05).matched(1.0e6, 1.04e6)


def test_the_bootstrap_reduces_to_the_items_with_one_seed_gains_nothing_from_repeats_and_widens_with_seed_spread():
    one = stats.clustered([[1.0, 2.0, 3.0, 4.0]], seed=0)
    assert one[0] == 2.5 and one[1] < 2.5 < one[2]
    import numpy as np

    items = list(np.random.default_rng(1).normal(0.03, 0.3, 128))
    alone, repeated = stats.clustered([items], seed=0), stats.clustered([items] * 3, seed=0)
    assert abs((repeated[2] - repeated[1]) / (alone[2] - alone[1]) - 1) < 0.15  # a deterministic arm's seeds
    agree = stats.clustered([[1.0, 1.1, 0.9]] * 3, seed=0)
    spread = stats.clustered([[0.0, 0.1, -0.1], [1.0, 1.1, 0.9], [2.0, 2.1, 1.9]], seed=0)
    assert spread[2] - spread[1] > 5 * (agree[2] - agree[1])


@pytest.mark.parametrize("kw,sets,match", [
    ({}, ["rtn-w3.group_size=64"], "no arm 'rtn-w3'. Did you mean 'rtn-w2'"),
    ({}, ["rtn-w2.no_such_param=1"], "no stage of 'rtn-w2' has a param 'no_such_param'"),
    ({}, ["rtn-w2.bits=w9a16"], "bits"),
    ({"kinds": ("mamba",)}, [], "runs on mamba models"),
    ({"tolerance": 0.5, "arms": (Arm("start", cost=16.0), Arm("small", ({"method": "rtn", "params": {}},), cost=4.0))},
     [], "not matched"),
])
def test_bad_input_is_refused_before_any_run(tmp_path, kw, sets, match):
    from llmx.errors import ConfigError, UsageError

    with pytest.raises((UsageError, ConfigError), match=match):
        runner.plan(_spec(**kw), out=tmp_path, sets=sets)
    assert not (tmp_path / "arms").exists()


def test_a_kv_comparison_refuses_a_mamba_and_one_with_its_own_data_refuses_data(tmp_path):
    from llmx.core.plugins import host
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match="runs on .*llama.*ref:mamba2-test is mamba2"):
        runner.plan(host().comparison("lexico"), out=tmp_path, model="ref:mamba2-test", quick=True)
    with pytest.raises(UsageError, match="reads data of its own"):
        runner.plan(host().comparison("align"), out=tmp_path, data="notes.txt", quick=True)
    assert runner.plan(host().comparison("llava"), out=tmp_path, quick=True).model == "ref:llava-test"
    with pytest.raises(UsageError, match="runs on llava models"):
        runner.plan(host().comparison("parrot"), out=tmp_path, model="ref:llama-test", quick=True)
    assert not (tmp_path / "arms").exists()


def test_a_set_must_say_which_stage_and_costs_both_unknown_are_unmatched(tmp_path):
    from llmx.core.plugins import host
    from llmx.errors import UsageError

    crow = host().comparison("crow")  # its arms plant a backdoor (LoRA training) before the defence trains
    with pytest.raises(UsageError, match="all have 'lr'"):
        runner.plan(crow, out=tmp_path, quick=True, sets=["crow.lr=0.002"])
    p = runner.plan(crow, out=tmp_path, quick=True, sets=["crow.crow.lr=0.002", "sft.2.lr=0.0001"])
    stages = {r.arm.name: [s.params for s in r.run.stages] for r in p.runs}
    plain = {r.arm.name: [s.params for s in r.run.stages] for r in runner.plan(crow, out=tmp_path, quick=True).runs}
    assert stages["crow"][:-2] == plain["crow"][:-2] and stages["sft"][:2] == plain["sft"][:2]  # the implants
    assert stages["crow"][-2].lr == 0.002 and stages["sft"][2].lr == 0.0001
    assert [r.declared for r in p.runs if r.arm.name != "backdoored"] == [None, None]
    rows = {"crow": [{"seed": 0, "cost": None, "items": {}, "value": 0.0, "machine": None}],
            "sft": [{"seed": 0, "cost": None, "items": {}, "value": 0.0, "machine": None}],
            "backdoored": [{"seed": 0, "cost": 0.0, "items": {}, "value": 0.0, "machine": None}]}
    verdict = next(v for v in runner._judge(p, rows)["verdicts"] if v["baseline"] == "sft")
    assert verdict["verdict"].startswith("unmatched")  # neither cost known: not "matched"


def test_a_missing_model_folder_or_data_file_is_refused_before_any_run(tmp_path):
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match="model folder not found: ./no-such-model"):
        runner.plan(_spec(), out=tmp_path, model="./no-such-model")
    with pytest.raises(UsageError, match="data file not found: notes-missing.txt"):
        runner.plan(_spec(), out=tmp_path, data="notes-missing.txt")


def test_a_missing_package_stops_the_comparison_before_its_first_arm(tmp_path, monkeypatch):
    import importlib.util

    from llmx.core.plugins import host
    from llmx.errors import MissingRequirement

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bandit" else real(name, *a))
    with pytest.raises(MissingRequirement, match="bandit"):
        runner.plan(host().comparison("prosec"), out=tmp_path, quick=True)
    assert not (tmp_path / "arms").exists()


def test_every_registered_comparison_is_listed_shown_and_resolves(cli):
    listed = cli("--json", "compare", "list")
    names = [d["name"] for d in listed.json()]
    assert "gptq" in names
    shown = cli("--json", "compare", "show", "gptq").json()
    assert shown["target"] == "gptq-w3" and shown["baselines"] == ["rtn-w3"]
    from llmx.core.plugins import host

    for name in names:
        spec = host().comparison(name)
        for quick in (False, True):
            plan = runner.plan(spec, out=Path("unused"), model=spec.quick_model, quick=quick)
            assert len(plan.runs) == len(spec.arms) * len(spec.quick_seeds if quick else spec.seeds)


def test_the_cli_runs_a_quick_comparison_and_refuses_bad_names_with_exit_2(cli, tmp_path):
    r = cli("--json", "compare", "gptq", "--quick", "--seeds", "0", "-o", tmp_path)
    assert r.code == 0, r.err
    out = r.json()
    assert out["comparison"] == "gptq" and out["quick"] and {a["name"] for a in out["arms"]} >= {"gptq-w3", "rtn-w3"}
    assert (tmp_path / "gptq" / "ref-llama-test-quick" / "result.md").is_file()  # per comparison, model and form
    typo = cli("compare", "gtpq", "--quick")
    assert typo.code == 2 and "Did you mean 'gptq'" in typo.err
    bad = cli("compare", "gptq", "--quick", "--set", "gptq-w9.bits=w4a16", "-o", tmp_path / "bad")
    assert bad.code == 2 and "no arm 'gptq-w9'" in bad.err and not (tmp_path / "bad").exists()


def test_summary_tabulates_every_result_under_a_folder_and_refuses_an_empty_one(cli, tmp_path):
    spec = _spec(seeds=(0,))
    runner.run(runner.plan(spec, out=tmp_path / "cmp" / "planted" / "m"), progress=False)
    r = cli("--json", "compare", "summary", tmp_path / "cmp")
    assert r.code == 0, r.err
    rows = {row["baseline"]: row for row in r.json()}
    assert rows["rtn-w2"]["verdict"] == "ahead (one seed)"
    assert rows["rtn-w2"]["baseline_value"] > rows["rtn-w2"]["target_value"]
    import torch

    assert rows["start-again"]["improvement"] == 0
    assert rows["start-again"]["machines"] == [rows["rtn-w2"]["machines"][0]]  # one machine ran every arm
    assert torch.backends.cpu.get_cpu_capability() in rows["rtn-w2"]["machines"][0]
    empty = cli("compare", "summary", tmp_path / "nothing")
    assert empty.code == 2 and "no comparison result" in empty.err


def test_no_comparison_scores_text_its_calibration_or_training_drew():
    """Calibration and training read the train split; every evaluation stage reads another one (issue 67)."""
    from llmx.core.plugins import host

    for name, spec in host().comparisons.items():
        for planned in runner.plan(spec, out=Path("unused"), quick=True).runs:
            scoring = planned.run.stages[-1].params
            assert getattr(scoring, "split", "validation") != "train", (name, planned.arm.name)
            for stage in planned.run.stages[:-1]:
                assert getattr(stage.params, "calib_split", "train") == "train", (name, stage.spec.name)


def test_the_calibration_windows_never_occur_in_the_text_perplexity_scores(tmp_path):
    import llmx
    from llmx.core.data import random_windows, token_stream

    _, tok = llmx.load("ref:llama-test")
    import random

    rng = random.Random(0)
    words = "kettle train platform river lamp garden window letter bridge market cloud stone winter harbour".split()
    (tmp_path / "notes.txt").write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(30))
                                                     for _ in range(300)))  # paragraphs that share no long run
    calib = random_windows(tok, str(tmp_path / "notes.txt"), 32, 64, seed=0)  # GPTQ's draw: its default split

    def grams(split: str) -> set:
        ids = token_stream(tok, str(tmp_path / "notes.txt"), split, None).tolist()
        return {tuple(ids[i:i + 40]) for i in range(len(ids) - 39)}  # about 8 words: no two paragraphs share one

    pieces = [tuple(w[i:i + 40]) for w in calib.tolist() for i in (0, 24)]
    assert sum(p in grams("train") for p in pieces) > len(pieces) // 2  # the check sees text it was drawn from
    assert not any(p in grams("validation") for p in pieces)  # perplexity's split holds none of it


def test_hub_ids_and_hub_data_pass_planning_and_a_data_file_of_any_suffix_is_fingerprinted(tmp_path, monkeypatch):
    from llmx.core.compare import provenance

    p = runner.plan(_spec(seeds=(0,)), out=tmp_path, model="some-org/some-model",
                    data="hf:some-org/some-text:config")  # org/name is a hub id, not a missing folder
    assert p.model == "some-org/some-model" and p.data["source"] == "hf:some-org/some-text:config"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.md").write_text(NOTES)
    config = {"model": "ref:llama-test", "data": {"source": "notes.md"}, "pipeline": []}
    before = provenance.inputs(config)
    (tmp_path / "notes.md").write_text(NOTES * 2)
    assert "notes.md" in before["paths"] and provenance.inputs(config) != before


def test_an_arms_reported_interval_covers_a_noisy_mean_with_few_seeds_and_groups_mixed_values():
    """``_interval`` (the per-arm report and by-group figures) widens as the verdicts do: 3 seeds that shift every
    item alike are covered; items are crossed with the seeds only where every seed scored the same ones; ``by``
    groups are the values as text (89 and "89" one group), numbers first by value."""
    import numpy as np

    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        table = rng.normal(0, 1, size=(3, 40)) + rng.normal(0, 0.5, size=(3, 1))
        x = runner._interval([{(str(i), 0): float(v) for i, v in enumerate(row)} for row in table])
        covered += x["low"] <= 0 <= x["high"]
    assert covered / 200 >= 0.90  # the two-level bootstrap alone: about 0.80
    same = [{(str(i), 0): float(i % 5) for i in range(30)} for s in range(3)]  # equal seeds: no t-widening
    own = [{(f"{s}-{i}", 0): v for (i, _), v in g.items()} for s, g in enumerate(same)]  # same values, own items
    expect = runner._spread([[g[k] for k in sorted(g)] for g in own], False)
    assert tuple(runner._interval(own)[k] for k in ("mean", "low", "high")) == expect
    assert runner._spread([[g[k] for k in sorted(g)] for g in same], True) != expect
    rare = [{(str(i), 0): float(s == 2 and i < 3) for i in range(30)} for s in range(3)]  # a share, one seed's 3
    x, free = runner._interval(rare, share=True), runner._interval(rare)
    assert x["low"] == 0.0 < x["mean"] < x["high"] <= 1.0 and free["low"] < 0  # the t-widening reaches below 0
    assert (x["mean"], x["high"]) == (free["mean"], free["high"])
    with pytest.raises(ValueError, match="share"):
        _spec(shares=("parse_rate",))
    spec = _spec(by="cwe")
    keys = [(str(i), 0) for i in range(6)]
    row = {"seed": 0, "items": {k: float(i) for i, k in enumerate(keys)},
           "extra": {"cwe": dict(zip(keys, [89, "89", 502, 502, "path", 89], strict=True))}}
    by = runner._reported(spec, [row])["by"]
    assert list(by) == ["89", "502", "path"] and by["89"]["items"] == 3 and by["89"]["mean"] == pytest.approx(2.0)


def test_a_method_qualified_cost_key_reads_that_methods_stage_where_an_earlier_one_reports_the_key(tmp_path):
    """RePer's arms open with a captioner's 600 steps before the method's own: ``reper.steps`` is the latter."""
    stages = [{"index": 0, "method": "llava", "metrics": {"steps": 600}},
              {"index": 1, "method": "reper", "metrics": {"steps": 150, "kl.mean": 0.25}},
              {"index": 2, "method": "reper", "metrics": {"score": 0.5}}]
    (tmp_path / "metrics.json").write_text(json.dumps({"stages": stages}))
    (tmp_path / "meta.json").write_text("{}")
    (tmp_path / "artifacts" / "2_reper").mkdir(parents=True)
    (tmp_path / "artifacts" / "2_reper" / "items.jsonl").write_text('{"item": "a", "score": 0.5}\n')
    planned = runner.Planned(Arm("x"), 0, tmp_path, None)
    costs = {key: runner._collect(_spec(items="items.jsonl", metric="score", cost_key=key), planned, tmp_path)["cost"]
             for key in ("steps", "reper.steps", "llava.steps", "kl.mean")}
    assert costs == {"steps": 600, "reper.steps": 150, "llava.steps": 600, "kl.mean": 0.25}  # no method kl: a plain key
