"""LIFT (Liu et al., ICML 2025): the supports, the sparse Adam, the refresh, the planted toy of the notes, the CLI
and the tracing task it is measured on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmx.core.eval import tracing
from llmx.core.train import sparse
from llmx.core.train.loop import TrainConfig, train
from llmx.plugins.lift.optimizer import LiftSparseAdamW


def planted(m: int, n: int, noise: float, seed: int, rank: int = 8):
    """The notes' toy: a rank-8 weight plus high-rank noise; the task amplifies its top-4 directions by 1.6."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, rank, generator=g))[0]
    v = torch.linalg.qr(torch.randn(n, rank, generator=g))[0]
    s = torch.linspace(3, 1, rank)
    weight = (u * s) @ v.T + noise * s.norm() * torch.randn(m, n, generator=g) / (m * n) ** 0.5
    return weight, 0.6 * (u[:, :4] * s[:4]) @ v[:, :4].T


def reference_support(weight: torch.Tensor, k: int, f: int | None) -> np.ndarray:
    """Top-k by numpy: |rank-f SVD reconstruction| (or |W|), stable descending sort, lower index first on ties."""
    w = weight.double().numpy()
    if f is not None:
        u, s, vh = np.linalg.svd(w, full_matrices=False)
        w = (u[:, :f] * s[:f]) @ vh[:f]
    order = np.argsort(-np.abs(w).reshape(-1), kind="stable")
    return np.sort(order[:k])


@pytest.mark.parametrize("shape,r", [((48, 32), 4), ((32, 96), 2), ((8, 6), 4)])
def test_support_holds_the_lora_budget_exactly(shape, r):
    w = torch.nn.Parameter(torch.randn(*shape))
    opt = LiftSparseAdamW([w], lr=1e-3, rank=r, filter_rank=2)
    index = opt.supports()[w]
    assert index.numel() == min(r * sum(shape), shape[0] * shape[1])
    assert index.unique().numel() == index.numel() and index.dtype == torch.int32


def test_lift_support_is_the_top_k_of_the_filtered_weight_not_of_the_weight():
    weight, _ = planted(96, 64, 1.5, 0)
    k = sparse.budget(96, 64, 4)
    lift = sparse.select(weight, k, "lift", filter_rank=8)
    assert np.array_equal(lift.numpy(), reference_support(weight, k, 8))
    magnitude = sparse.select(weight, k, "magnitude")
    assert np.array_equal(magnitude.numpy(), reference_support(weight, k, None))
    overlap = np.intersect1d(lift.numpy(), magnitude.numpy()).size / k
    assert overlap < 0.6  # noise decides the raw magnitudes, the rank-8 structure the filtered ones


def test_full_rank_filter_is_the_magnitude_mask_and_ties_go_to_the_lower_index():
    weight = torch.randn(24, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    k = sparse.budget(24, 16, 2)
    assert torch.equal(sparse.select(weight, k, "lift", filter_rank=16), sparse.select(weight, k, "magnitude"))
    ties = torch.tensor([3.0, 1.0, 3.0, 2.0, 3.0, 3.0])
    assert sparse.top_k(ties, 3).tolist() == [0, 2, 4]


def test_lowrank_svd_recovers_an_exactly_low_rank_matrix_and_is_seeded():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 6, generator=g) @ torch.randn(6, 40, generator=g)
    full = sparse.low_rank(w, 6)
    fast = sparse.low_rank(w, 6, "lowrank", seed=3)
    assert torch.allclose(fast, full, atol=1e-4) and torch.allclose(full, w, atol=1e-4)
    before = torch.random.get_rng_state()
    assert torch.equal(sparse.low_rank(w, 3, "lowrank", seed=5), sparse.low_rank(w, 3, "lowrank", seed=5))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_full_budget_step_is_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(6, 5))
    b = torch.nn.Parameter(a.detach().clone())
    ours = LiftSparseAdamW([a], lr=1e-3, rank=100, filter_rank=2, update_interval=0)
    theirs = torch.optim.AdamW([b], lr=1e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.0)
    assert ours.supports()[a].numel() == 30
    for step in range(5):
        g = torch.randn(6, 5, generator=torch.Generator().manual_seed(step))
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        assert (a - b).abs().max() < 1e-6
    assert not torch.equal(a, a.new_zeros(6, 5))


def test_entries_outside_the_support_never_change():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(32, 24))
    start = w.detach().clone()
    opt = LiftSparseAdamW([w], lr=1e-2, rank=2, filter_rank=3, update_interval=0)
    for _ in range(10):
        w.grad = torch.randn_like(w)
        opt.step()
    outside = ~sparse.dense_mask(opt.supports()[w], w.shape)
    assert torch.equal(w.detach()[outside], start[outside])
    assert not torch.equal(w.detach()[~outside], start[~outside])
    assert w.grad is None  # the dense gradient lives only until the step


def test_a_refresh_keeps_surviving_moments_and_zeroes_new_ones():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(20, 16))
    opt = LiftSparseAdamW([w], lr=0.5, rank=2, filter_rank=2, update_interval=0)
    for _ in range(3):
        w.grad = torch.randn_like(w)
        opt.step()
    st = opt.state[w]
    old = dict(zip(st["index"].tolist(), zip(st["exp_avg"].tolist(), st["exp_avg_sq"].tolist(), strict=True),
                   strict=True))
    opt.refresh()
    new = st["index"].tolist()
    assert set(new) != set(old) and set(new) & set(old)  # a large rate moved the principal weights, not all of them
    for i, m, v in zip(new, st["exp_avg"].tolist(), st["exp_avg_sq"].tolist(), strict=True):
        assert (m, v) == (old[i] if i in old else (0.0, 0.0))
    assert st["step"] == 3 and opt.param_groups[0]["refreshes"] == 1


def test_the_refresh_counts_optimiser_steps_not_micro_batches():
    torch.manual_seed(0)
    model = torch.nn.Linear(12, 10, bias=False)
    x = torch.randn(64, 12)
    held = {}

    def factory(groups, c):
        held["opt"] = LiftSparseAdamW(groups, lr=c.lr, rank=1, filter_rank=2, update_interval=3)
        return held["opt"]

    train(model, dict(model.named_parameters()), lambda i: model(x[i % 64:i % 64 + 4]).square().mean(),
          TrainConfig(steps=7, lr=1e-2, grad_accum=2), optimizer=factory)
    assert held["opt"].param_groups[0]["steps_done"] == 7 and held["opt"].param_groups[0]["refreshes"] == 2


def test_no_refresh_after_the_last_step_and_a_due_one_runs_before_the_next():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(20, 16))
    opt = LiftSparseAdamW([w], lr=0.5, rank=2, filter_rank=2, update_interval=3)
    for _ in range(3):
        w.grad = torch.randn_like(w)
        opt.step()
    before = opt.state[w]["index"].clone()
    assert opt.param_groups[0]["refreshes"] == 0 and opt.param_groups[0]["refresh_due"]
    w.grad = torch.randn_like(w)
    opt.step()
    assert opt.param_groups[0]["refreshes"] == 1 and not torch.equal(before, opt.state[w]["index"])


def test_random_supports_differ_between_matrices_of_one_shape():
    ws = [torch.nn.Parameter(torch.randn(32, 32)) for _ in range(3)]
    opt = LiftSparseAdamW(ws, lr=1e-3, rank=2, filter_rank=2, mask="random")
    supports = [opt.state[w]["index"] for w in ws]
    assert not torch.equal(supports[0], supports[1]) and not torch.equal(supports[1], supports[2])


def test_state_dict_round_trip_keeps_integer_supports_past_2_24_and_the_moments():
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4100, 4100, generator=g))  # 16.8M entries: indices past float32's 2^24
    with torch.no_grad():
        w[-1, -3:] = 100.0
    opt = LiftSparseAdamW([w], lr=1e-2, rank=1, filter_rank=1, mask="magnitude")
    w.grad = torch.randn_like(w)
    opt.step()
    unrelated = torch.nn.Parameter(torch.randn(4100, 4100, generator=g))
    other = LiftSparseAdamW([unrelated], lr=1e-2, rank=1, filter_rank=1, mask="magnitude")
    assert not torch.equal(other.state[unrelated]["index"], opt.state[w]["index"])
    other.load_state_dict(opt.state_dict())
    (a,), (b,) = opt.state.values(), other.state.values()
    assert b["index"].dtype == torch.int32 and torch.equal(a["index"], b["index"])
    assert int(b["index"][-1]) == 4100 * 4100 - 1 and int(b["index"][-1]) > 2**24
    assert torch.equal(a["exp_avg"], b["exp_avg"]) and b["step"] == 1


def test_planted_toy_lift_captures_the_update_that_magnitude_and_random_miss():
    """Notes §5: noise 1.5, r 4 (density 7.8%), f 8. At noise 0.3 raw and filtered magnitudes agree (the control)."""
    k = sparse.budget(256, 64, 4)
    share = {kind: [] for kind in sparse.KINDS}
    for seed in range(3):
        weight, delta = planted(256, 64, 1.5, seed)
        for kind in sparse.KINDS:
            index = sparse.select(weight, k, kind, filter_rank=8, generator=torch.Generator().manual_seed(seed))
            share[kind].append(sparse.captured(delta, index))
    mean = {kind: sum(v) / 3 for kind, v in share.items()}
    assert mean["lift"] > 1.5 * mean["magnitude"] and mean["lift"] > 3 * mean["random"]
    weight, delta = planted(256, 64, 0.3, 0)
    low = [sparse.captured(delta, sparse.select(weight, k, kind, filter_rank=8)) for kind in ("lift", "magnitude")]
    assert abs(low[0] - low[1]) < 0.1 * low[0]


def test_planted_toy_lift_fine_tunes_best():
    """Notes §5: a 64-256-64 tanh student fine-tuned to the teacher with task B's weights, equal budgets, 300 steps.
    This construction separates the supports less than the notes' (held-out loss 0.955x the best baseline, not
    0.87x): the test holds the order and the gain over no fine-tuning."""
    w1, d1 = planted(256, 64, 1.5, 1)
    w2, d2 = planted(64, 256, 1.5, 2)
    x = torch.randn(1024, 64, generator=torch.Generator().manual_seed(9))
    target = torch.tanh(x @ (w1 + d1).T * 2) @ (w2 + d2).T
    losses = {"none": float((torch.tanh(x[768:] @ w1.T * 2) @ w2.T - target[768:]).square().mean())}
    for kind in sparse.KINDS:
        a, b = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())
        opt = LiftSparseAdamW([a, b], lr=3e-3, rank=4, filter_rank=8, mask=kind, update_interval=0)
        for _ in range(300):
            (torch.tanh(x[:768] @ a.T * 2) @ b.T - target[:768]).square().mean().backward()
            opt.step()
        with torch.no_grad():
            losses[kind] = float((torch.tanh(x[768:] @ a.T * 2) @ b.T - target[768:]).square().mean())
    assert losses["lift"] < 0.97 * losses["magnitude"] < 0.97 * losses["random"] < 0.6 * losses["none"], losses


def test_tracing_splits_are_disjoint_balanced_and_judged_exactly():
    train_rows, test_rows = tracing.rows("train", 0), tracing.rows("test", 1)
    assert len(train_rows) == tracing.SIZES["train"] and len(test_rows) == tracing.SIZES["test"]
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in test_rows}
    shares = np.bincount([int(r["answer"]) for r in train_rows], minlength=10) / len(train_rows)
    assert shares.max() < 0.13  # no constant answer scores well
    row = test_rows[0]
    assert row["prompt"].endswith(")\n") and row["prompt"].startswith(">>> ")
    assert tracing.judge(row, f" {row['answer']}\n>>> x") and not tracing.judge(row, f"{row['answer']}0\n")
    env: dict = {}
    for r in train_rows[:200]:  # the answer is what Python prints
        lines = [line[4:] for line in r["prompt"].splitlines()]
        exec("\n".join(lines[:-1]), env)
        assert str(eval(lines[-1][6:-1], env)) == r["answer"]


def tracing_rows(cli, tmp_path):
    r = cli("--json", "analyze", "--method", "tracing", "--set", "train=48", "--set", "validation=16", "--set",
            "test=16", "-o", tmp_path / "data")
    assert r.code == 0, r.err
    return r.json()["stages"][0]["metrics"]["data_dir"]


def test_cli_lift_trains_its_support_only_and_exports_shira(cli, tmp_path):
    from llmx.core import models

    data = tracing_rows(cli, tmp_path)
    r = cli("--json", "train", "--method", "lift", "--model", "ref:llama-test", "--data", f"{data}/train.jsonl",
            "--set", f"eval_data={data}/validation.jsonl", "--set", "steps=4", "--set", "batch_size=8",
            "--set", "lr=1e-2", "--set", "filter_rank=4", "--set", "update_interval=0", "--set", "shira=true",
            "-o", tmp_path / "run")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    base, _ = models.load("ref:llama-test")
    tuned, _ = models.load(m["model_dir"])
    changed = 0
    for (name, a), b in zip(base.named_parameters(), tuned.parameters(), strict=True):
        if ".layers." in name and name.endswith("proj.weight"):
            changed += int((a != b).sum())
        else:
            assert torch.equal(a, b), name  # embeddings, head, norms untouched
    assert 0 < changed <= m["trainable_params"] and m["refreshes"] == 0 and m["shira_kept"] == pytest.approx(1.0)
    assert m["optimizer_bytes"] == m["trainable_params"] * (4 + 4 + 4)  # int32 support, exp_avg, exp_avg_sq
    shira, _ = models.load(m["shira_dir"])
    ids = torch.arange(1, 40)[None]
    with torch.no_grad():
        assert torch.allclose(shira(ids).logits, tuned(ids).logits, atol=1e-5)
    r = cli("--json", "eval", "--method", "tracing", "--model", m["model_dir"], "--set", "limit=8",
            "-o", tmp_path / "eval")
    assert r.code == 0, r.err
    assert 0 <= r.json()["stages"][0]["metrics"]["score"] <= 1


@pytest.mark.parametrize("sets,words", [
    (["filter_rank=0"], "filter_rank"),
    (["filter_rank=65"], "exceeds the rank"),
    (["mask=topk"], "mask"),
    (["weight_decay=0.1"], "weight decay"),
    (["adapter=lora"], "adapter must be none"),
])
def test_bad_input_is_exit_2_without_a_run_folder(cli, tmp_path, sets, words):
    data = tracing_rows(cli, tmp_path)
    out = tmp_path / "runs"
    r = cli("train", "--method", "lift", "--model", "ref:llama-test", "--data", f"{data}/train.jsonl",
            "--set", "steps=2", *[a for s in sets for a in ("--set", s)], "-o", out)
    assert r.code == 2 and words in r.err, r.err
    assert len(r.err.strip().splitlines()) <= 3
    assert not out.exists() or list(out.iterdir()) == []


def test_a_model_without_linear_weights_in_its_blocks_is_exit_2(cli, tmp_path):
    data = tracing_rows(cli, tmp_path)
    r = cli("train", "--method", "lift", "--model", "tiny:gpt2", "--data", f"{data}/train.jsonl", "--set", "steps=2",
            "-o", tmp_path / "runs")
    assert r.code == 2 and "no nn.Linear weights" in r.err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", sparse.KINDS)
@pytest.mark.parametrize("svd", ["full", "lowrank"])
def test_optimizer_on_cuda_matches_cpu(kind, svd):
    torch.manual_seed(0)
    w = torch.randn(2048, 512)
    grads = [torch.randn_like(w) for _ in range(4)]
    out = {}
    for device in ("cpu", "cuda"):
        p = torch.nn.Parameter(w.to(device))
        opt = LiftSparseAdamW([p], lr=1e-3, rank=8, filter_rank=16, mask=kind, svd=svd, update_interval=2)
        for g in grads:
            p.grad = g.to(device)
            opt.step()
        out[device] = (p.detach().cpu(), opt.supports()[p].cpu())
    assert out["cpu"][1].numel() == out["cuda"][1].numel() == 8 * (2048 + 512)
    overlap = np.intersect1d(out["cpu"][1].numpy(), out["cuda"][1].numpy()).size / out["cpu"][1].numel()
    assert overlap > (0.99 if kind != "lift" or svd == "full" else 0.8)  # SVDs differ in the last bits: ties flip
    moved = {d: (out[d][0] - w).abs() > 0 for d in out}
    both = moved["cpu"] & moved["cuda"]
    assert (out["cpu"][0] - w).abs().max() > 1e-3 and both.float().mean() > 0.8 * moved["cpu"].float().mean()
    assert (out["cpu"][0] - out["cuda"][0])[both].abs().max() < 1e-5


def test_without_data_lift_trains_on_tracing_programs_it_writes_to_the_run(cli, tmp_path):
    """What ``llmx compare lift`` runs: no data named, so the tracing task's first training programs (and as many
    validation programs, the held-out rows) are written to the run's artifacts and trained on."""
    import json

    r = cli("--json", "train", "--method", "lift", "--model", "ref:llama-test", "--set", "tracing_rows=24",
            "--set", "steps=2", "--set", "batch_size=4", "--set", "save=false", "-o", tmp_path / "run")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    folder = next((tmp_path / "run").glob("*/artifacts/0_lift"))
    train = [json.loads(x) for x in (folder / "tracing_train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (folder / "tracing_validation.jsonl").read_text().splitlines()]
    assert [row["prompt"] for row in train] == [row["prompt"] for row in tracing.rows("train", 0)[:24]]
    assert len(held) == m["eval_rows"] == 24 and m["train_rows"] == 24
    assert not {row["prompt"] for row in train} & {row["prompt"] for row in held}
