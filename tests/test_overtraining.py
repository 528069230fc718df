"""Catastrophic overtraining: exact restore, the noise's scale and pattern, S's limits, one batch order for every
checkpoint, turning points, the notes' Markov toy, and the CLI over a real checkpoint series with its bad inputs."""

import json
import shutil
from itertools import pairwise

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmx.core.train.lm.data import TokenWindows
from llmx.core.train.loop import TrainConfig, train
from llmx.errors import UsageError
from llmx.plugins.overtraining import noise, series, turning
from llmx.plugins.overtraining.config import FinetuneParams
from llmx.plugins.overtraining.finetune import finetune


def small(seed: int = 0, vocab: int = 48, bias: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_bias=bias, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def markov(seed: int, vocab: int = 48, sharp: float = 3.0) -> torch.Tensor:
    """A random second-order chain: next-token probabilities for every (a, b)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(vocab, vocab, vocab, generator=g), -1)


def sample(chain: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = chain.shape[0]
    out = torch.empty(n, dtype=torch.long)
    out[:2] = torch.randint(v, (2,), generator=g)
    for i in range(2, n):
        out[i] = torch.multinomial(chain[out[i - 2], out[i - 1]], 1, generator=g)
    return out


def loss_on(model, windows: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(input_ids=windows, labels=windows).loss)


def noise_of(model, gamma, draw, scale="init_std", perturb="matrices", std=0.02):
    chosen = noise.targets(model, perturb)
    saved = {n: p.detach().clone() for n, (p, _) in chosen.items()}
    with noise.perturbed(model, chosen, saved, gamma, 0, draw, scale, std):
        return {n: p.detach() - saved[n] for n, (p, _) in chosen.items()}, saved


def test_the_state_dict_is_bitwise_equal_after_measuring():
    model = small(bias=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(48, (4, 16))
    base, rows = noise.sensitivity(model, lambda: loss_on(model, x), [0.5, 3.0], 3, 0, "param_rms", "all", 0.02)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert rows[1]["S"] > 0 and base == loss_on(model, x)


@pytest.mark.parametrize("scale", ["init_std", "param_rms", "absolute"])
def test_the_injected_noise_has_std_gamma_sigma_per_tensor(scale):
    model = small(bias=True)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(5)  # a tensor whose RMS is not the init std
    delta, saved = noise_of(model, 0.7, 0, scale, "all")
    chosen = noise.targets(model, "all")
    kinds = {kind for _, kind in chosen.values()}
    assert kinds == {"matrix", "gain", "bias"}
    for name, d in delta.items():
        p, kind = chosen[name]
        if d.numel() < 64 or kind == "bias" and scale == "param_rms":
            continue  # a zero bias has RMS 0: no noise, checked below
        want = 0.7 * noise.sigma(saved[name], scale, 0.02)
        assert abs(float(d.std()) / want - 1) < 0.2, (name, float(d.std()), want)
    if scale == "param_rms":
        up = "model.layers.0.mlp.up_proj.weight"
        assert abs(float(delta[up].std()) / (0.7 * float(saved[up].pow(2).mean().sqrt())) - 1) < 0.05


def test_matrices_leave_gains_and_biases_alone():
    model = small(bias=True)
    assert {kind for _, kind in noise.targets(model, "matrices").values()} == {"matrix"}
    one_d = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 1}
    chosen = noise.targets(model, "matrices")
    saved = {n: p.detach().clone() for n, (p, _) in chosen.items()}
    with noise.perturbed(model, chosen, saved, 4.0, 0, 0, "init_std", 0.02):
        now = dict(model.named_parameters())
        assert one_d and all(torch.equal(now[n], v) for n, v in one_d.items())
        assert not torch.equal(now["lm_head.weight"], saved["lm_head.weight"])


def test_another_seed_draws_other_noise():
    model = small(0)
    chosen = noise.targets(model, "matrices")
    saved = {n: p.detach().clone() for n, (p, _) in chosen.items()}
    deltas = []
    for seed in (0, 1):
        with noise.perturbed(model, chosen, saved, 1.0, seed, 0, "init_std", 0.02):
            deltas.append(model.lm_head.weight.detach() - saved["lm_head.weight"])
    assert not torch.allclose(deltas[0], deltas[1], rtol=0, atol=1e-3)


def test_two_checkpoints_receive_identical_noise_and_draws_differ():
    a, _ = noise_of(small(0), 1.0, 2)
    b, _ = noise_of(small(1), 1.0, 2)
    c, _ = noise_of(small(0), 1.0, 3)
    # theta + e - theta is e up to the weights' rounding (~1e-9 here); another draw differs at the noise's scale
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-7) for k in a)
    assert not torch.allclose(a["lm_head.weight"], c["lm_head.weight"], rtol=0, atol=1e-3)


def test_sensitivity_vanishes_as_gamma_goes_to_0_and_grows_with_gamma_on_fixed_draws():
    model = small()
    chain = markov(0)
    x = sample(chain, 16 * 33, 1)[: 16 * 32].view(16, 32)
    train(model, dict(model.named_parameters()), lambda i: model(input_ids=x, labels=x).loss,
          TrainConfig(steps=60, lr=3e-3, schedule="constant"))
    model.eval()
    _, rows = noise.sensitivity(model, lambda: loss_on(model, x), [1e-4, 0.5, 1.0, 2.0, 4.0], 3, 0, "init_std",
                                "matrices", 0.02)
    s = [r["S"] for r in rows]
    assert abs(s[0]) < 1e-3
    assert all(b > a for a, b in pairwise(s)), s


def test_the_finetuning_recipe_sees_the_same_batches_for_every_checkpoint():
    stream = sample(markov(5), 4000, 2)
    f = FinetuneParams(steps=4, warmup=0, batch_size=4, seq_len=16, lrs=[1e-3])
    digests = {finetune(small(s), TokenWindows(stream, 16, 0), f, 1e-3) for s in (0, 1)}
    other = finetune(small(0), TokenWindows(stream, 16, 1), f, 1e-3)
    assert len(digests) == 1 and other not in digests


def test_degradation_restores_theta_t_and_each_rate_starts_from_it():
    from llmx.plugins.overtraining.finetune import degradation

    stream = sample(markov(5), 4000, 2)
    held = stream[:512].view(16, 32)
    model = small(0)
    theta = {k: v.clone() for k, v in model.state_dict().items()}

    def rows(lrs):
        f = FinetuneParams(steps=3, warmup=0, batch_size=4, seq_len=16, lrs=lrs, seeds=[0, 1])
        return degradation(model, lambda m: loss_on(m, held), lambda m: loss_on(m, held),
                           lambda seed: TokenWindows(stream, 16, seed), f, loss_on(model, held))

    both = rows([1e-3, 3e-2])
    assert all(torch.equal(theta[k], v) for k, v in model.state_dict().items())
    alone = rows([3e-2])
    assert [r for r in both if r["lr"] == 3e-2] == alone
    assert both[0]["target"] != alone[0]["target"]


def test_a_turning_point_needs_a_rise_beyond_the_noise():
    tp = turning.turning_point
    assert tp([1, 2, 4, 8], [[3.0, 2.0, 2.5, 2.7]])["T_star"] == 2
    assert tp([1, 2, 4, 8], [[3.0, 2.0, 1.5, 1.4]]) == {"T_star": None, "status": "improving", "rise": 0.0,
                                                        "rise_se": 0.0}
    rising = tp([1, 2, 4, 8], [[1.0, 1.1, 1.2, 1.3]])
    assert rising["T_star"] == 1 and rising["status"] == "rising_from_start"
    assert tp([1, 2, 4, 8], [[3.0, 2.0, 1.9, 1.9001]])["status"] == "flat"  # 1e-4 is below rtol
    noisy = [[3.0, 2.0, 2.3], [3.0, 2.0, 1.8], [3.0, 2.0, 2.05]]  # the mean rises 0.05, one seed falls
    assert tp([1, 2, 4], noisy)["status"] == "flat"
    clear = [[3.0, 2.0, 2.3], [3.0, 2.0, 2.25], [3.0, 2.0, 2.35]]
    assert tp([1, 2, 4], clear)["T_star"] == 2 and tp([1, 2, 4], clear)["rise"] == pytest.approx(0.3)
    s = turning.summary([1, 2, 4], [[3, 1, 2], [3, 2, 0.5]], 2.0, 1e-3)
    assert s["T_star"] is None and s["T_star_each"] == [2, None]


def test_the_tuned_rate_is_the_best_per_checkpoint_and_flags_the_grid_edge():
    rows = [{"T": t, "seed": 0, "lr": lr, "target": v} for t, lr, v in
            [(1, 1e-3, 2.0), (1, 3e-3, 1.6), (1, 1e-2, 1.5), (2, 1e-3, 1.3), (2, 3e-3, 1.0), (2, 1e-2, 1.2)]]
    best = turning.tuned(rows, [1e-3, 3e-3, 1e-2])
    assert [(r["T"], r["lr"], r["lr_at_edge"]) for r in best] == [(1, 1e-2, True), (2, 3e-3, False)]


def test_l_pre_is_the_control_curve():
    rows = turning.turning_points([1, 2, 4], [3.0, 2.0, 2.5], [], [])
    assert rows == [{"curve": "L_pre", "T_star": 2, "status": "turns", "rise": 0.5, "rise_se": 0.0,
                     "T_star_each": [2]}]


def test_checkpoints_of_one_run_may_differ_in_steps_and_branches(tmp_path):
    from llmx.plugins.overtraining.config import Checkpoint

    run = {"model": "m", "init": "scratch", "seed": 0, "lr": 1e-3, "tokens_per_step": 256, "seq_len": 64,
           "steps": 100, "data": {"fingerprint": "f"}}
    items = []
    for i, extra in enumerate([{}, {"steps": 200, "cooldown_from": "x", "world_size": 2}, {"seed": 1}]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "checkpoint.json").write_text(json.dumps({"tokens": 100 * (i + 1), "step": i + 1,
                                                                       "lr": 1e-3, "run": {**run, **extra}}))
        items.append(Checkpoint(path=str(tmp_path / str(i))))
    assert len(series.from_list(items[:2])[0]) == 2
    with pytest.raises(UsageError, match="seed"):
        series.from_list(items)


def test_a_cooldown_list_and_a_decaying_run_are_flagged_annealed(tmp_path):
    folders = [tmp_path / str(i) for i in range(3)]
    for f in folders:
        f.mkdir()
    cooled = [{"path": str(f), "tokens": t, "step": None, "lr": 0.0} for f, t in zip(folders, (1, 2, 4), strict=True)]
    out = series.checked(cooled, {})
    assert all(e["annealed"] for e in out) and "every checkpoint" in series.schedule_note({}, out)
    run = {"lr": 1e-3, "warmup": 10, "schedule": "cosine"}
    cos = [{"path": str(f), "tokens": t, "step": st, "lr": lr}
           for f, t, st, lr in zip(folders, (1, 2, 4), (5, 50, 100), (5e-4, 9e-4, 1e-4), strict=True)]
    assert [e["annealed"] for e in series.checked(cos, run)] == [False, True, True]
    assert "cosine" in series.schedule_note(run, cos)
    flat = [{"path": str(f), "tokens": t, "step": st, "lr": 1e-3}
            for f, t, st in zip(folders, (1, 2, 4), (20, 40, 80), strict=True)]
    assert series.schedule_note({**run, "schedule": "constant"}, series.checked(flat, run)) is None


@pytest.mark.slow
def test_the_notes_markov_toy_sensitivity_and_forgetting_grow_with_pretraining():
    """§5 of the notes: 2 layers, d 64, vocab 48, constant lr 3e-3, checkpoints at 100..1600 steps, K = 4 draws,
    sigma = gamma 0.02 on matrices, 100 fine-tuning steps on a new chain."""
    torch.manual_seed(0)
    model = small()
    pre = sample(markov(0), 200_000, 1)
    windows, held = TokenWindows(pre[:180_000], 32, 0), pre[180_000:].unfold(0, 32, 32)[:64]
    new = sample(markov(1), 40_000, 2)
    saved = {}

    def keep(s):
        if s.done in (100, 200, 400, 800, 1600):
            saved[s.done] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    train(model, dict(model.named_parameters()), lambda i: model(input_ids=windows.batch(i, 16),
                                                                 labels=windows.batch(i, 16)).loss,
          TrainConfig(steps=1600, lr=3e-3, schedule="constant"), after_step=keep)
    f = FinetuneParams(steps=100, warmup=0, batch_size=16, seq_len=32, lrs=[3e-3])
    s1, forgetting = {}, []
    for step, state in saved.items():
        model.load_state_dict(state)
        model.eval()
        base, rows = noise.sensitivity(model, lambda: loss_on(model, held), [1.0], 4, 0, "init_std", "matrices",
                                       0.02)
        s1[step] = rows[0]["S"]
        finetune(model, TokenWindows(new, 32, 0), f, 3e-3)
        forgetting.append(loss_on(model, held) - base)
    assert s1[800] > 2 * s1[100], s1
    assert all(b >= a for a, b in pairwise(forgetting)), forgetting


@pytest.fixture(scope="module")
def series_run(tmp_path_factory):
    """A 3-checkpoint constant-rate series of tiny:llama on the stdlib corpus (the smoke recipe's first stage)."""
    from llmx.cli.app import main

    out = tmp_path_factory.mktemp("series")
    code = main(["-q", "train", "--method", "lm", "--model", "tiny:llama", "--set", "init=scratch",
                 "--set", "max_tokens=20000", "--set", "seq_len=64", "--set", "batch_size=4", "--set", "steps=8",
                 "--set", "warmup=1", "--set", "schedule=constant",
                 "--set", "save_at_tokens=[512,1024,2048]", "-o", str(out)])
    assert code == 0
    (manifest,) = out.glob("*/artifacts/*/series/manifest.json")
    return manifest


SMALL = ["--set", "eval_windows=4", "--set", "draws=2", "--set", "gammas=[0.5,2.0]", "--set", "finetune.steps=2",
         "--set", "finetune.warmup=0", "--set", "finetune.batch_size=2", "--set", "finetune.seq_len=32",
         "--set", "finetune.eval_windows=2"]


def analyze(cli, out, *sets):
    return cli("--json", "analyze", "--method", "overtraining", *SMALL, *sets, "-o", out)


def test_cli_over_a_series_reports_the_tables_and_repeats_exactly(cli, tmp_path, series_run):
    args = ("--set", f"series={series_run}", "--set", "finetune.lrs=[1e-3,3e-3]", "--set", "finetune.seeds=[0,1]")
    first = analyze(cli, tmp_path / "a", *args)
    assert first.code == 0, first.err
    m = first.json()["stages"][0]["metrics"]
    assert [c["T"] for c in m["checkpoints"]] == [512, 1024, 2048]
    assert all(c["lr"] == pytest.approx(1e-3) and not c["annealed"] for c in m["checkpoints"])
    assert len(m["sensitivity"]) == 6 and len(m["finetune"]) == 12 and len(m["finetune_tuned"]) == 6
    for seed in (0, 1):
        assert len({r["batches"] for r in m["finetune"] if r["seed"] == seed}) == 1
    assert {r["curve"] for r in m["turning_points"]} == {"L_pre", "perturbed_loss", "L_pre_after", "target"}
    assert any(r.get("lr") == "tuned" for r in m["turning_points"])
    again = analyze(cli, tmp_path / "b", *args).json()["stages"][0]["metrics"]
    assert again["sensitivity"] == m["sensitivity"] and again["finetune"] == m["finetune"]


def test_a_listed_series_reads_each_checkpoint_json(cli, tmp_path, series_run):
    folders = sorted(p.parent for p in series_run.parent.glob("tokens_*/checkpoint.json"))
    listing = json.dumps([{"path": str(f)} for f in folders])
    r = analyze(cli, tmp_path / "runs", "--set", f"checkpoints={listing}", "--set", "finetune.lrs=[]")
    assert r.code == 0, r.err
    m = r.json()["stages"][0]["metrics"]
    assert sorted(c["T"] for c in m["checkpoints"]) == [512, 1024, 2048] and m["finetune"] == []


def _bad_copies(tmp_path, series_run):
    """A checkpoint with another vocabulary, one with another architecture, a manifest naming a missing folder, and
    a checkpoint of another run (its seed)."""
    from llmx.core import models

    src = sorted(series_run.parent.glob("tokens_*"))[0]
    vocab = tmp_path / "vocab"
    model, tok = models.load(str(src))
    tok.add_tokens(["<extra-token>"])
    models.save(model, tok, vocab)
    arch = tmp_path / "arch"
    other, tok2 = models.load("tiny:llama")
    other.model.layers = other.model.layers[:1]
    other.config.num_hidden_layers = 1
    models.save(other, tok2, arch)
    broken = tmp_path / "broken"
    shutil.copytree(series_run.parent, broken)
    shutil.rmtree(broken / "tokens_1024")
    other_run = tmp_path / "other_run"
    shutil.copytree(sorted(series_run.parent.glob("tokens_*"))[1], other_run)
    info = json.loads((other_run / "checkpoint.json").read_text())
    info["run"]["seed"] = info["run"].get("seed", 0) + 1
    (other_run / "checkpoint.json").write_text(json.dumps(info))
    return src, vocab, arch, broken, other_run


@pytest.mark.parametrize("case, words", [
    ("empty", "the series is empty"), ("missing", "is missing"), ("vocab", "another tokenizer"),
    ("arch", "another architecture"), ("gamma", "gammas must be positive"), ("negative", "gammas must be positive"),
    ("twice", "has a value twice"), ("tworuns", "come from different runs"), ("nofolder", "not found")])
def test_bad_input_is_exit_2_with_no_run_folder(cli, tmp_path, series_run, case, words):
    src, vocab, arch, broken, other_run = _bad_copies(tmp_path, series_run)
    sets = {"empty": [],
            "missing": ["--set", f"series={broken}"],
            "vocab": ["--set", f'checkpoints=[{{"path": "{src}"}}, {{"path": "{vocab}", "tokens": 9000}}]'],
            "arch": ["--set", f'checkpoints=[{{"path": "{src}"}}, {{"path": "{arch}", "tokens": 9000}}]'],
            "gamma": ["--set", f"series={series_run}", "--set", "gammas=[0.5,0]"],
            "negative": ["--set", f"series={series_run}", "--set", "gammas=[-1.0]"],
            "twice": ["--set", f"series={series_run}", "--set", "finetune.lrs=[1e-3,1e-3]"],
            "tworuns": ["--set", f'checkpoints=[{{"path": "{src}"}}, {{"path": "{other_run}"}}]'],
            "nofolder": ["--set", f"series={tmp_path / 'nowhere'}"]}[case]
    out = tmp_path / "runs"
    r = analyze(cli, out, *sets)
    assert r.code == 2 and words in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_noise_is_made_there_restored_exactly_and_shared_by_checkpoints():
    a, b = small(0).cuda(), small(1).cuda()
    before = {k: v.clone() for k, v in a.state_dict().items()}
    da, saved = noise_of(a, 1.0, 0)
    db, _ = noise_of(b, 1.0, 0)
    assert all(d.device.type == "cuda" for d in da.values())
    assert all(torch.allclose(da[k], db[k], rtol=0, atol=1e-7) for k in da)
    assert abs(float(da["lm_head.weight"].std()) / 0.02 - 1) < 0.05
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())
    x = torch.randint(48, (4, 16), device="cuda")
    _, rows = noise.sensitivity(a, lambda: loss_on(a, x), [0.5, 2.0], 2, 0, "init_std", "all", 0.02)
    assert rows[1]["S"] > rows[0]["S"]
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())


def test_the_smoke_recipe_reads_its_own_series_and_plots_it(cli, tmp_path):
    from pathlib import Path

    from matplotlib.image import imread

    recipe = Path(__file__).resolve().parents[1] / "configs" / "smoke" / "overtraining.yaml"
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    m = r.json()["stages"][-1]["metrics"]
    assert [c["T"] for c in m["checkpoints"]] == [512, 1024, 2048]
    assert len(m["sensitivity"]) == 3 * 2 and all(len(x["draw_losses"]) == 2 for x in m["sensitivity"])
    assert len(m["finetune"]) == 3 and m["finetune_tuned"] == []
    assert cli("report", tmp_path / "runs", "--plot", tmp_path / "plots").code == 0
    pixels = imread(tmp_path / "plots" / "series.png")
    assert 0.01 < (pixels[..., :3] < 0.9).any(axis=-1).mean() < 0.6
    table = (tmp_path / "plots" / "series.csv").read_text()
    assert "perturbed_loss" in table and "L_pre_after" in table
