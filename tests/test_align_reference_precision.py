"""A precomputed reference under bf16-mixed: scored under the policy's autocast, so the first step's DPO margin is
exactly 0 (batches of one sequence pair: the same shapes as when the reference was scored), and its held-out
baseline stays fp32 as ``evaluate`` runs the policy (the same drift as a live frozen copy)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import ROOT

DATA = ROOT / "configs" / "smoke" / "data" / "brackets_paired.jsonl"


def dpo_step(cli, out, *sets):
    r = cli("--json", "align", "--method", "dpo", "--model", "ref:llama-test", "--data", DATA, "--set", "steps=1",
            "--set", "batch_size=1", "--set", "max_len=96", "--set", "precision=bf16-mixed", "--set", "save=false",
            *sets, "-o", out)
    assert r.code == 0, r.err
    first = json.loads(next(out.glob("*/artifacts/0_dpo/metrics.jsonl")).read_text().splitlines()[0])
    return first, r.json()["stages"][0]["metrics"]


def test_precomputed_reference_matches_the_policy_under_bf16_mixed(cli, tmp_path):
    pre, pre_m = dpo_step(cli, tmp_path / "pre", "--set", "precompute_ref_log_probs=true")
    assert pre["reward_margin"] == 0.0  # fp32 reference scores: 0.018 here
    assert pre["loss"] == pytest.approx(math.log(2), abs=1e-7)
    _, live_m = dpo_step(cli, tmp_path / "live")
    assert pre_m["heldout_logratio_per_token"] == live_m["heldout_logratio_per_token"]  # bf16 baseline: 3x off
