"""FunBO test functions: agreement with BoTorch's definitions, the known optima (at the argmin and as a lower bound
on random points), the seeded scale/shift instances, name lookup and sets."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from llmx.errors import UsageError
from llmx.plugins.funbo import functions as F


def _uniform(f, n, seed=0):
    return np.random.default_rng(seed).uniform(f.lower, f.upper, (n, f.dim))


BOTORCH_CASES = [
    ("Ackley", F.ackley, 1), ("Ackley", F.ackley, 2), ("Ackley", F.ackley, 5),
    ("Levy", F.levy, 1), ("Levy", F.levy, 3),
    ("Rastrigin", F.rastrigin, 1), ("Rastrigin", F.rastrigin, 4),
    ("Rosenbrock", F.rosenbrock, 2), ("Rosenbrock", F.rosenbrock, 3),
    ("StyblinskiTang", F.styblinski_tang, 2), ("StyblinskiTang", F.styblinski_tang, 3),
    ("Michalewicz", F.michalewicz, 2), ("Michalewicz", F.michalewicz, 5),
    ("Hartmann", F.hartmann, 3), ("Hartmann", F.hartmann, 6),
    ("Beale", lambda d: F.get("beale"), 2), ("Branin", lambda d: F.get("branin"), 2),
]


@pytest.mark.parametrize("cls,build,dim", BOTORCH_CASES, ids=[f"{c}-{d}" for c, _, d in BOTORCH_CASES])
def test_values_and_domains_match_botorch(cls, build, dim):
    torch = pytest.importorskip("torch")
    synthetic = pytest.importorskip("botorch.test_functions.synthetic")
    theirs = getattr(synthetic, cls)(**({} if cls in ("Beale", "Branin") else {"dim": dim}), negate=False)
    ours = build(dim)
    assert ours.dim == dim
    np.testing.assert_allclose(np.array([ours.lower, ours.upper]), theirs.bounds.double().numpy(), rtol=1e-6)
    x = _uniform(ours, 50)
    want = theirs.evaluate_true(torch.tensor(x, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(ours(x), want, rtol=1e-6, atol=1e-12)
    if theirs._optimal_value is not None:
        assert ours.optimum == pytest.approx(theirs.optimal_value, abs=1e-5)


def test_registry_holds_the_funbo_names():
    assert set(F.NAMES) == {
        "ackley-1d", "ackley-2d", "levy-1d", "schwefel-1d", "rastrigin-1d", "rosenbrock-1d", "rosenbrock-2d", "sphere-2d",
        "styblinski-tang-2d", "weierstrass-2d", "beale", "branin", "michalewicz-2d", "goldstein-price", "hartmann-3",
        "hartmann-6"}
    for name in F.NAMES:
        f = F.get(name)
        assert f.name == name and len(f.lower) == len(f.upper) == f.dim and f.argmins


@pytest.mark.parametrize("name", F.NAMES)
def test_known_argmin_attains_the_optimum_and_bounds_random_points(name):
    f = F.get(name)
    for a in f.argmins:
        assert np.all((np.array(a) >= f.lower) & (np.array(a) <= f.upper))
        assert f(np.array([a]))[0] == pytest.approx(f.optimum, abs=1e-4)
    values = f(_uniform(f, 20_000))
    assert values.shape == (20_000,) and values.dtype == np.float64
    assert values.min() >= f.optimum - 1e-6


def test_hand_written_functions_at_reference_points():
    # SFU values: Goldstein-Price(0, 0) = 600, Schwefel-1d(0) = 418.9829, Sphere(1, 2) = 5, Weierstrass peaks at ±0.5.
    assert F.get("goldstein-price")(np.array([[0.0, 0.0]]))[0] == pytest.approx(600.0)
    assert F.get("schwefel-1d")(np.array([[0.0]]))[0] == pytest.approx(418.9829)
    assert F.get("sphere-2d")(np.array([[1.0, 2.0]]))[0] == pytest.approx(5.0)
    w = F.get("weierstrass-2d")
    top = 2 * 2 * sum(0.5**k for k in range(21))
    assert w(np.array([[0.5, -0.5]]))[0] == pytest.approx(top)
    assert F.rosenbrock(1)(np.array([[3.0]]))[0] == pytest.approx(4.0)


def test_on_unit_maps_the_cube_onto_the_domain():
    f = F.get("branin")
    u = np.random.default_rng(1).uniform(size=(10, 2))
    np.testing.assert_allclose(f.on_unit(u), f(np.array(f.lower) + u * (np.array(f.upper) - np.array(f.lower))))
    assert f.on_unit(np.array([[(math.pi + 5) / 15, 2.275 / 15]]))[0] == pytest.approx(f.optimum)


def test_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        F.get("beale")(np.zeros(2))


def test_instances_are_seeded_and_scale_and_shift_the_base():
    f = F.get("ackley-2d")
    x = _uniform(f, 100)
    a, b, c = f.instance(3), f.instance(3), f.instance(4)
    assert a.name == "ackley-2d#3" and a == b
    np.testing.assert_array_equal(a(x), b(x))
    assert not np.allclose(a(x), c(x))
    assert 0.9 <= a.scale <= 1.1 and all(-0.1 <= t <= 0.1 for t in a.shift)
    shift = np.array(a.shift) * (np.array(f.upper) - np.array(f.lower))
    np.testing.assert_allclose(a(x), a.scale * f.base(x - shift))
    identity = dataclasses.replace(f, scale=1.0, shift=(0.0, 0.0))
    np.testing.assert_array_equal(identity(x), f.base(x))
    np.testing.assert_array_equal(f(x), f.base(x))
    with pytest.raises(ValueError, match="already an instance"):
        a.instance(5)


@pytest.mark.parametrize("name", F.NAMES)
def test_instance_optimum_is_attained_at_the_shifted_argmin(name):
    f = F.get(name)
    for seed in range(5):
        g = f.instance(seed)
        if math.isnan(g.optimum):
            assert g.argmins == ()
            continue
        assert g.optimum == pytest.approx(g.scale * f.optimum)
        for a in g.argmins:
            assert np.all((np.array(a) >= g.lower) & (np.array(a) <= g.upper))
            assert g(np.array([a]))[0] == pytest.approx(g.optimum, abs=1e-4)
        assert g(_uniform(g, 2_000, seed)).min() >= g.optimum - 1e-6


def test_instance_optimum_is_nan_when_the_argmin_leaves_the_domain():
    f = F.get("rosenbrock-1d")  # argmin 1 in [-5, 10] stays inside under any shift of at most 1.5
    assert all(not math.isnan(f.instance(s).optimum) for s in range(20))
    edge = dataclasses.replace(f, argmins=((10.0,),))  # a minimiser on the upper face leaves under any positive shift
    seeds = [s for s in range(20) if edge.instance(s).shift[0] > 0]
    assert seeds and all(math.isnan(edge.instance(s).optimum) for s in seeds)


def test_get_suggests_the_closest_name():
    with pytest.raises(UsageError, match="did you mean 'ackley-1d'"):
        F.get("ackly-1d")
    with pytest.raises(UsageError, match="known: ackley-1d"):
        F.get("zzzz")


def test_parse_set_splits_commas_and_lists():
    assert [f.name for f in F.parse_set("branin, hartmann-3,")] == ["branin", "hartmann-3"]
    assert [f.name for f in F.parse_set(["beale", "levy-1d,sphere-2d"])] == ["beale", "levy-1d", "sphere-2d"]
    with pytest.raises(UsageError, match="did you mean 'branin'"):
        F.parse_set("branin,brannin2")
    with pytest.raises(UsageError, match="no function names"):
        F.parse_set(" , ")
