"""The upcycling law's fitter on planted data (notes §5.1), its intervals, raw against normalised token counts, the
budget guidance against closed forms, and ``analyze --method upcycling-law`` on good and bad grids."""

import json

import numpy as np
import pytest

from llmx.plugins.upcycling import guidance, law

PLANTED = np.array([1.9, 0.693, 0.10, 0.35, 0.03])  # E, log A, alpha1, alpha2, alpha3 with D in billions


def notes_grid(x=PLANTED, noise=0.002, seed=0):
    """D1 in {1..128}B, D2 in {0.5..32}B (56 runs), multiplicative noise: the notes' synthetic grid (raw tokens)."""
    d1, d2 = (a.ravel() * 1e9 for a in np.meshgrid(2.0 ** np.arange(8), 0.5 * 2.0 ** np.arange(7)))
    truth = law.Fit("interaction", 1e9, np.asarray(x, float), 0.0, np.zeros(0), np.zeros((0, 5))).predict(d1, d2)
    return d1, d2, truth * np.exp(np.random.default_rng(seed).normal(0.0, noise, len(d1)))


def test_the_fit_recovers_the_planted_law_and_the_interaction_matters():
    d1, d2, loss = notes_grid()
    inter = law.fit("interaction", loss, d1, d2, unit=1e9)
    sep = law.fit("separable", loss, d1, d2, unit=1e9)
    p = inter.params
    assert abs(p["alpha3"] - 0.03) < 0.005 and abs(p["E"] - 1.9) < 0.05
    assert abs(p["alpha1"] - 0.10) < 0.01 and abs(p["alpha2"] - 0.35) < 0.02
    assert sep.log_rmse() > 5 * inter.log_rmse()
    assert inter.log_rmse() < 0.003  # the planted noise, not more


def test_alpha3_intervals_contain_zero_when_none_is_planted_and_exclude_it_when_it_is():
    x0 = PLANTED.copy()
    x0[4] = 0.0
    d1, d2, loss = notes_grid(x0, seed=1)
    f0 = law.fit("interaction", loss, d1, d2, unit=1e9)
    boot0 = law.bootstrap("interaction", loss, d1, d2, 1e9, 1e-3, 40, 0.95, 0, f0)
    assert boot0["alpha3"][0] < 0 < boot0["alpha3"][1]
    lo, hi = f0.intervals(0.95)["alpha3"]
    assert lo < 0 < hi
    d1, d2, loss = notes_grid(seed=1)
    f = law.fit("interaction", loss, d1, d2, unit=1e9)
    assert law.bootstrap("interaction", loss, d1, d2, 1e9, 1e-3, 40, 0.95, 0, f)["alpha3"][0] > 0
    assert f.intervals(0.95)["alpha3"][0] > 0


def test_raw_and_normalised_token_counts_agree_on_the_predictions():
    d1, d2, loss = notes_grid()
    raw = law.fit("interaction", loss, d1, d2, unit=1.0)
    norm = law.fit("interaction", loss, d1, d2, unit=1e9)
    for a, b in ((d1, d2), (np.array([3e9, 256e9]), np.array([64e9, 0.25e9]))):
        assert np.allclose(raw.predict(a, b), norm.predict(a, b), rtol=1e-4)
    # the same law in other units: alpha3 is unit-free, alpha1 absorbs alpha3 ln(unit)
    assert raw.params["alpha3"] == pytest.approx(norm.params["alpha3"], abs=1e-4)
    assert raw.params["alpha1"] == pytest.approx(norm.params["alpha1"] + norm.params["alpha3"] * np.log(1e9), abs=1e-3)


def test_the_scratch_power_law_fit_is_exact_on_exact_data():
    d = np.geomspace(1e6, 1e9, 7)
    loss = 2.0 + np.exp(1.5) * (d / 1e6) ** -0.3
    f = law.fit("scratch", loss, d, unit=1e6)
    assert f.params["E"] == pytest.approx(2.0, abs=1e-4) and f.params["beta"] == pytest.approx(0.3, abs=1e-4)


def fixed(form, x, unit=1.0):
    return law.Fit(form, unit, np.asarray(x, float), 0.0, np.zeros(0), np.zeros((0, len(x))))


def test_the_sunk_crossover_is_where_the_closed_form_puts_it():
    """Separable upcycling law against a scratch law with the same E and N: A d1^-a1 d2^-a2 = B d2^-b at
    d2* = (A d1^-a1 / B)^(1 / (a2 - b)); below it upcycling is ahead."""
    a, a1, a2, b_coef, b = 4.0, 0.2, 0.1, 40.0, 0.3
    up = fixed("separable", [1.0, np.log(a), a1, a2])
    scratch = fixed("scratch", [1.0, np.log(b_coef), b])
    costs = guidance.Costs(dense=1.0, moe=2.0)
    d1 = 50.0
    expected = (a * d1 ** -a1 / b_coef) ** (1 / (a2 - b))
    got = guidance.crossover_tokens(up, (scratch, costs.moe), costs, d1, 6 * costs.moe * 1.0, 6 * costs.moe * 1e9)
    assert got["D2"] == pytest.approx(expected, rel=1e-6)
    below = guidance.compare(6 * costs.moe * expected / 2, up, {"moe": (scratch, costs.moe)}, costs, (d1, d1), True,
                             d1)
    assert below["upcycled"]["loss"] < below["moe"]["loss"]


def test_charging_the_dense_phase_picks_the_best_split_and_refuses_budgets_that_cannot_pay_for_it():
    up = fixed("separable", [1.0, np.log(4.0), 0.2, 0.3])
    costs = guidance.Costs(dense=1.0, moe=2.0)
    assert guidance.upcycled(up, 6 * 1.0 * 10, costs, (10.0, 100.0), False, 0.0) is None
    best = guidance.upcycled(up, 6 * 1.0 * 1000, costs, (10.0, 100.0), False, 0.0)
    d1 = np.geomspace(10.0, 100.0, 2000)
    d2 = (6000 - 6 * d1) / 12
    assert best["loss"] == pytest.approx(float(up.predict(d1, d2).min()), rel=1e-4)
    assert best["loss"] == pytest.approx(float(up.predict(np.array([best["D1"]]), np.array([best["D2"]]))[0]))


def write_grid(path, d1, d2, loss, scratch=True):
    rows = [{"kind": "upcycled", "D1": a, "D2": b, "loss": c, "active_params": 1.2e6, "dense_params": 8e5}
            for a, b, c in zip(d1.tolist(), d2.tolist(), loss.tolist(), strict=True)]
    if scratch:
        d = np.geomspace(5e8, 64e9, 6)
        rows += [{"kind": "moe", "tokens": t, "loss": 1.9 + 3.0 * (t / 1e9) ** -0.3, "active_params": 1.2e6}
                 for t in d.tolist()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_cli_fits_holds_out_the_largest_d2_and_guides(cli, tmp_path):
    d1, d2, loss = notes_grid()
    grid = write_grid(tmp_path / "grid.jsonl", d1, d2, loss)
    r = cli("--json", "analyze", "--method", "upcycling-law", "--model", "tiny:llama", "-o", tmp_path / "runs",
            "--set", f"runs={grid}", "--set", "bootstrap=20", "--set", "power_sims=10")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert m["fitted_rows"] == 48 and m["heldout_rows"] == 8
    assert m["alpha3"]["excludes_zero"] and m["alpha3"]["interval"][0] > 0
    assert m["rmse_ratio_heldout"] > 5 and m["power"]["power"] >= 0.9 and m["power"]["false_positive_rate"] <= 0.2
    assert m["fits"]["interaction"]["at_bounds"] == [] and m["alpha3"]["interval_kind"] == "bootstrap over runs"
    effective = [r["effective_alpha2"] for r in m["per_d1"]]
    assert effective == sorted(effective, reverse=True)  # alpha3 > 0: D2 buys less as D1 grows
    g = m["guidance"]
    assert g["sunk_dense"] and "moe" in g["scratch_fits"]
    assert all(c["D2"] is None or c["D2"] > 0 for c in g["crossover_d2_by_d1"])
    noisy = cli("--json", "analyze", "--method", "upcycling-law", "--model", "tiny:llama", "-o", tmp_path / "runs2",
                "--set", f"runs={grid}", "--set", "bootstrap=0", "--set", "power_sims=10", "--set", "power_noise=0.05",
                "--set", "huber_scale=auto")
    assert noisy.code == 0, noisy.err
    auto = noisy.json()["stages"][0]["metrics"]["fits"]["interaction"]
    assert auto["huber_scale"] != 1e-3 and abs(auto["params"]["alpha3"] - 0.03) < 0.005
    assert [b["extrapolated"] for b in g["budgets"]][0] is False and g["budgets"][-1]["extrapolated"]
    assert all(isinstance(c["extrapolated"], bool) for c in g["crossover_d2_by_d1"] + g["crossovers"])
    weak = noisy.json()["stages"][0]["metrics"]["power"]
    assert weak["noise_from"] == "given" and weak["noise_log_sd"] == 0.05 and weak["power"] < m["power"]["power"]


def test_a_grid_that_cannot_fit_the_law_or_has_bad_rows_is_exit_2_with_nothing_left(cli, tmp_path):
    d1, d2, loss = notes_grid()
    pick = (d1 <= 4e9) & (d2 <= 1e9)  # 3 D1 x 2 D2 below the held-out column: 3 points to fit
    small = write_grid(tmp_path / "small.jsonl", d1[pick], d2[pick], loss[pick], scratch=False)
    one = d1 == 8e9
    single = write_grid(tmp_path / "single.jsonl", d1[one], d2[one], loss[one], scratch=False)
    bad = write_grid(tmp_path / "bad.jsonl", d1, d2, loss)
    lines = bad.read_text().splitlines()
    lines[3] = lines[3].replace('"D2": ', '"D2": -')
    bad.write_text("\n".join(lines) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"kind": "upcycled", "D1": 1\n')
    for path, words in ((small, "needs more points"), (single, "vary both D1 and D2"),
                        (bad, "bad.jsonl:4: D2 must be a positive"),
                        (broken, "broken.jsonl:1 is not JSON")):
        out = tmp_path / f"runs_{path.stem}"
        r = cli("analyze", "--method", "upcycling-law", "--model", "tiny:llama", "-o", out, "--set", f"runs={path}")
        assert r.code == 2 and words in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1
        assert not out.exists() or list(out.iterdir()) == []


def test_with_the_dense_phase_sunk_the_dense_baseline_is_that_model_continued():
    up = fixed("separable", [1.0, np.log(4.0), 0.2, 0.3])
    dense = fixed("scratch", [1.0, np.log(30.0), 0.3])
    costs = guidance.Costs(dense=1.0, moe=2.0)
    row = guidance.compare(600.0, up, {"dense": (dense, 1.0)}, costs, (10.0, 100.0), True, 50.0)
    assert row["dense"]["tokens"] == pytest.approx(50.0 + 100.0)
    charged = guidance.compare(600.0, up, {"dense": (dense, 1.0)}, costs, (10.0, 100.0), False, 50.0)
    assert charged["dense"]["tokens"] == pytest.approx(100.0)


def test_without_a_crossing_the_guidance_says_which_side_upcycling_stays_on():
    costs = guidance.Costs(dense=1.0, moe=1.0)
    up = fixed("separable", [1.0, np.log(4.0), 0.2, 0.3])
    for b_coef, side in ((100.0, "always"), (0.01, "never")):
        scratch = fixed("scratch", [1.0, np.log(b_coef), 0.3])  # the same exponent: the gap never closes
        got = guidance.crossover_tokens(up, (scratch, 1.0), costs, 10.0, 6.0, 6e6)
        assert got == {"D2": None, "compute": None, "upcycling_ahead": side}


def test_the_run_bootstrap_keeps_the_design_and_scales_each_runs_residuals_by_one_weight(monkeypatch):
    d1, d2, loss = notes_grid()
    f = law.fit("interaction", loss, d1, d2, unit=1e9)
    seen, real = [], law.fit
    monkeypatch.setattr(law, "fit", lambda form, lo, a, *rest, **kw: seen.append((lo, a)) or real(form, lo, a, *rest,
                                                                                                   **kw))
    law.bootstrap("interaction", loss, d1, d2, 1e9, 1e-3, 10, 0.95, 0, f, groups=d1)
    assert len(seen) == 10
    base = np.log(f.predict(d1, d2))
    for boot, design in seen:
        assert np.array_equal(design, d1)
        w = (base - np.log(boot)) / f.residuals
        for run in np.unique(d1):
            mine = w[d1 == run]
            assert np.allclose(mine, mine[0]) and np.isclose(np.abs(law.WEBB), abs(mine[0])).any()
    seen.clear()
    law.bootstrap("interaction", loss, d1, d2, 1e9, 1e-3, 10, 0.95, 0, f)
    assert any(len(np.unique(a)) < 8 or not np.array_equal(np.sort(a), np.sort(d1)) for _, a in seen)


def test_a_parameter_on_its_bound_is_flagged():
    d = np.geomspace(1e6, 1e9, 7)
    f = law.fit("scratch", np.exp(1.5) * (d / 1e6) ** -0.3, d, unit=1e6)  # E = 0 planted
    assert "E" in f.at_bounds()
    g = law.fit("scratch", 2.0 + np.exp(1.5) * (d / 1e6) ** -0.3, d, unit=1e6)
    assert g.at_bounds() == []
