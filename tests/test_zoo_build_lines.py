"""A zoo build's lines and leftovers (issue 66): its estimate is timed on the machine at hand, never "about 0s",
and its lock file goes with the build."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from safetensors.torch import load_file

from llmx.core import zoo
from llmx.core.progress import clock
from llmx.core.zoo import build
from llmx.core.zoo.presets import PRESETS
from llmx.core.zoo.request import RefRequest


@pytest.fixture
def cache(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("LLMX_CACHE_DIR", str(root))
    return root / "zoo"


def test_the_estimate_is_never_about_0s():
    spec = PRESETS["test"]["llama"]
    assert build.estimate_seconds(0.0, spec, 150, 8000) == 1.0
    assert clock(build.estimate_seconds(1e-6, spec, 150, 8000)) == "1s"


def test_the_estimate_scales_with_the_measured_step():
    spec = PRESETS["small"]["llama"]
    fast, slow = (build.estimate_seconds(s, spec, spec.max_steps, 40_000) for s in (0.1, 0.3))
    assert slow == pytest.approx(3 * fast)
    assert fast > spec.max_steps * 0.1  # the evaluations and the final scoring come on top of the steps


def test_the_step_is_timed_on_this_machine_without_touching_the_model(monkeypatch):
    """A fake clock: the first (allocating) step takes 5 s, the timed ones 2 s and 3 s: the estimate's step is their
    median, 2.5 s."""
    from transformers import AutoModelForCausalLM

    from llmx.core.models.archs import config

    spec = PRESETS["test"]["llama"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config("llama", 128, spec.hidden, spec.layers, heads=spec.heads))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 128, (2000,))
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks))
    rng = torch.get_rng_state()
    assert build.step_seconds(model, ids, spec, steps=3) == 2.5
    assert torch.equal(torch.get_rng_state(), rng)  # the build's random stream is untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_build_says_its_measured_estimate_and_leaves_no_lock_file(cache, notes, monkeypatch, tmp_path):
    log, seen = logging.getLogger("llmx.progress"), _Lines()
    monkeypatch.setattr(log, "level", logging.INFO)
    log.addHandler(seen)
    req = RefRequest("llama", "test", steps=5, data=str(notes))
    try:
        path = zoo.ensure(req, show_progress=True)
    finally:
        log.removeHandler(seen)
    lines = seen.lines
    first = next(m for m in lines if m.startswith("building"))
    assert first.startswith("building llama (test preset), once: it is cached after; 5 steps of 8x64 tokens, "
                            "about ") and "about 0s" not in first
    assert list((cache / ".locks").glob("*")) == []  # the build's lock file went with it
    monkeypatch.setenv("LLMX_CACHE_DIR", str(tmp_path / "quiet"))
    quiet = zoo.ensure(req, show_progress=False)  # the warm-up does not change the bits
    a, b = (load_file(str(p / "model.safetensors")) for p in (path, quiet))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
