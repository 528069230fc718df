"""GuidedQuant and LNQ (arXiv 2505.07004): saliency hooks against autograd, guided Hessians reducing to X X^T, GPTQ on
group slices, LNQ's monotone objective and optimal half-steps, the ordering of the quantizers on their objectives,
the guided objective as a predictor of the loss, the LUT layer, storage and the CLI's refusals."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from llmx.core.quant import saliency
from llmx.core.quant.formats import IntFormat, fake_quantize
from llmx.core.quant.gptq import gptq
from llmx.core.quant.lut import LUTLinear
from llmx.plugins.guidedquant import lnq
from llmx.plugins.guidedquant.config import GuidedQuantParams
from llmx.plugins.guidedquant.method import guided_gptq, guided_objective


def _layer(d: int = 64, rows: int = 48, n: int = 2048, seed: int = 0):
    """Correlated inputs with 3 outlier channels x15, a weight, and X X^T (float64)."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g) / d**0.5 + torch.eye(d)
    x = torch.randn(n, d, generator=g) @ mix
    x[:, :3] *= 15
    w = torch.randn(rows, d, generator=g) / d**0.5
    return w.double(), x.double(), x.double().T @ x.double()


def _lnq(w, h, bits, iterations=3):
    """LNQ from the SqueezeLLM seed whose Fisher, with every output gradient equal, is diag(H) in every row."""
    seed = lnq.kmeans_1d(w, h.diagonal().expand_as(w), 2**bits)
    return seed, lnq.lnq(w, h, seed, iterations=iterations)


class ToyLM(torch.nn.Module):
    """A bigram LM ``logits = V gelu(W emb(x))`` with transformers' call signature (``input_ids``, ``labels``)."""

    def __init__(self, vocab: int = 16, d: int = 24, m: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, d)
        self.up = torch.nn.Linear(d, m)
        self.down = torch.nn.Linear(m, vocab)
        with torch.no_grad():
            self.down.weight.mul_(torch.logspace(-1, 1, m))  # output channels of `up` matter unequally
            self.emb.weight.mul_(2)

    def forward(self, input_ids, labels=None):
        logits = self.down(torch.nn.functional.gelu(self.up(self.emb(input_ids))))
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     labels[:, 1:].reshape(-1))
        return SimpleNamespace(logits=logits, loss=loss)

    @torch.no_grad()
    def sample(self, n: int, length: int, seed: int) -> torch.Tensor:
        """Sequences drawn from the model itself (its Fisher then does not collapse, as at zero loss)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.emb.num_embeddings, (n, 1), generator=g)
        for _ in range(length - 1):
            p = torch.softmax(self(ids[:, -1:]).logits[:, -1], -1)
            ids = torch.cat([ids, torch.multinomial(p, 1, generator=g)], 1)
        return ids


def test_hooked_saliency_is_the_squared_per_token_output_gradient():
    model = ToyLM()
    ids = model.sample(3, 10, seed=1)
    sal = saliency.collect(model, {"up": model.up}, ids, groups=4, scale=1e3)
    expected = []
    seen = {}
    hook = model.up.register_forward_hook(lambda m, a, out: seen.__setitem__("z", out))
    for i in range(3):
        loss = model(ids[i:i + 1], labels=ids[i:i + 1]).loss
        (grad,) = torch.autograd.grad(loss, seen["z"])
        s = (1e3 * grad.reshape(-1, 32)) ** 2
        expected.append(torch.stack([s[:, a:b].mean(-1) for a, b in saliency.group_bounds(32, 4)], -1))
    hook.remove()
    assert torch.allclose(sal.tokens["up"], torch.cat(expected), rtol=1e-5)
    assert all(p.grad is None for p in model.parameters())


def test_guided_hessians_through_block_calibration_line_up_with_their_tokens():
    """11 windows (block calls of 8 and 3), q/k/v and gate/up reading one input: every layer's H_g through core's
    block-by-block calibration equals H_g built from FP inputs hooked one window at a time; uniform saliency with
    one group is core's X X^T."""
    from llmx.core import zoo
    from llmx.core.data import random_windows
    from llmx.core.quant.calibration import LinearStats, sequential

    model, tok = zoo.load("ref:llama-test")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    batches = random_windows(tok, "stdlib", 11, 32, seed=0)
    sal = saliency.collect(model, layers, batches, groups=4)
    direct = {n: [] for n in layers}
    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: direct[n].append(a[0].reshape(-1, a[0].shape[-1])))
             for n, m in layers.items()]
    with torch.no_grad():
        for i in range(11):
            model(batches[i:i + 1])
    for h in hooks:
        h.remove()
    guided, plain, uniform = {}, {}, {}

    def keep(into):
        return lambda block, stats: into.update({n: stats[n].hessian.clone() for n in block})

    sequential(model, layers, batches, keep(guided), propagate="fp", make_stats=lambda n: saliency.GuidedStats(sal.tokens[n]))
    sequential(model, layers, batches, keep(plain), propagate="fp", make_stats=lambda n: LinearStats())
    ones = {n: torch.ones(t.shape[0], 1) for n, t in sal.tokens.items()}
    sequential(model, layers, batches, keep(uniform), propagate="fp", make_stats=lambda n: saliency.GuidedStats(ones[n]))
    for n in layers:
        x = torch.cat(direct[n]).double()
        s = sal.tokens[n].double()
        expect = torch.stack([(x * s[:, g, None]).T @ x for g in range(4)])
        assert torch.allclose(guided[n], expect, rtol=1e-9, atol=1e-9 * float(expect.abs().max())), n
        assert torch.allclose(uniform[n][0].float(), plain[n], rtol=1e-4, atol=1e-4 * float(plain[n].abs().max())), n
    assert not torch.equal(guided["model.layers.0.self_attn.q_proj"], guided["model.layers.0.self_attn.k_proj"])


def test_the_p_step_does_not_depend_on_its_lazy_block_size():
    w, _, h = _layer(d=200, rows=12)
    c, idx = lnq.kmeans_1d(w, h.diagonal().expand_as(w), 4)
    results = [lnq.p_step(w, idx, c, h, cycles=2, block=b) for b in (1, 7, 16, 128, 256)]
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_group_hessians_split_rows_and_each_slice_is_gptq_on_its_own_hessian():
    w, x, _ = _layer()
    s = torch.rand(x.shape[0], 4, generator=torch.Generator().manual_seed(3))
    stats = saliency.GuidedStats(s)
    stats.add(x.float(), True)
    fmt = IntFormat(2, 16)
    p = GuidedQuantParams(bits="w2a16", backend="gptq")
    res = guided_gptq(w.float(), stats.hessian, fmt, p)
    for g, (a, b) in enumerate(saliency.group_bounds(w.shape[0], 4)):
        alone = gptq(w[a:b].float(), stats.hessian[g].float(), fmt, p.block_size, p.percdamp)
        assert torch.equal(res.codes[a:b], alone.codes)


@pytest.mark.parametrize("bits", [2, 3])
def test_lnq_objective_never_rises_across_half_steps(bits):
    w, _, h = _layer()
    _, res = _lnq(w, h, bits, iterations=4)
    steps = res.trace
    assert len(steps) >= 4
    assert all(b <= a * (1 + 1e-9) for a, b in zip(steps, steps[1:], strict=False)), steps
    assert lnq.objective(w, res.weight(), h) == pytest.approx(min(steps), rel=1e-12)


def test_no_small_change_of_a_codebook_entry_improves_a_c_step():
    w, _, h = _layer()
    c, idx = lnq.kmeans_1d(w, torch.ones_like(w), 4)
    c = lnq.c_step(w, idx, h, 4, ridge=0.0)
    base = lnq.objective(w, c.gather(1, idx), h)
    for row, entry in [(0, 0), (5, 3), (20, 1)]:
        for eps in (1e-4, -1e-4):
            moved = c.clone()
            moved[row, entry] += eps
            assert lnq.objective(w, moved.gather(1, idx), h) >= base


@pytest.mark.parametrize("ridge", [1e-7, 0.0])
def test_the_c_step_is_the_dense_closed_form_row_by_row(ridge):
    """Against ``(P^T H P + ridge I)^-1 P^T H w`` with an explicit one-hot P per row, on a random SPD H: rows whose
    assignments leave codewords empty (solved on the used ones, the empty entries 0) and a row on one codeword."""
    g = torch.Generator().manual_seed(5)
    d, k = 40, 8
    a = torch.randn(d, 2 * d, generator=g, dtype=torch.float64)
    h = a @ a.T / d
    w = torch.randn(7, d, generator=g, dtype=torch.float64)
    idx = torch.randint(0, k, (7, d), generator=g)
    idx[1] = torch.randint(0, 3, (d,), generator=g)  # codewords 3..7 empty
    idx[2] = 5  # every weight on one codeword
    idx[3] = idx[3] % 2 * 6  # only 0 and 6
    c = lnq.c_step(w, idx, h, k, ridge, rows=3)  # chunks of 3 rows
    for r in range(7):
        p = torch.nn.functional.one_hot(idx[r], k).double()
        used = p.sum(0) > 0
        p = p[:, used]
        dense = torch.linalg.solve(p.T @ h @ p + ridge * torch.eye(p.shape[1], dtype=torch.float64), p.T @ h @ w[r])
        assert torch.allclose(c[r, used], dense, rtol=1e-9, atol=1e-12), r
        assert torch.all(c[r, ~used] == 0), r
    assert torch.allclose(c[2, 5], (h @ w[2]).sum() / (h.sum() + ridge))  # one codeword: a weighted mean of w


def test_a_coordinate_update_is_the_brute_force_best_entry():
    w, _, h = _layer(rows=8)
    c, idx = lnq.kmeans_1d(w, torch.ones_like(w), 8)
    after = lnq.p_step(w, idx, c, h, cycles=1, block=16)
    for r in range(8):  # coordinate 0 is updated first, with every other coordinate as it started
        costs = []
        for e in range(8):
            trial = idx[r:r + 1].clone()
            trial[0, 0] = e
            costs.append(lnq.objective(w[r:r + 1], c[r:r + 1].gather(1, trial), h))
        assert int(after[r, 0]) == int(torch.tensor(costs).argmin())


def test_weighted_kmeans_matches_scikit_learn():
    from sklearn.cluster import KMeans

    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 256, generator=g).double()
    wt = torch.rand(3, 256, generator=g).double() + 0.1
    c, idx = lnq.kmeans_1d(x, wt, 4)
    for r in range(3):
        km = KMeans(4, n_init=10, random_state=0).fit(x[r, :, None].numpy(), sample_weight=wt[r].numpy())
        ours = float((wt[r] * (x[r] - c[r, idx[r]]) ** 2).sum())
        assert ours <= km.inertia_ * (1 + 1e-3)


def test_weighted_kmeans_ends_at_a_lloyd_fixed_point():
    """Every weight on its nearest centroid and every used centroid its cluster's weighted mean (the sorted-row
    Lloyd's with prefix sums, on weights spanning ten orders of magnitude as a Fisher diagonal does)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 300, generator=g).double()
    wt = 10 ** (10 * torch.rand(5, 300, generator=g).double() - 8)
    c, idx = lnq.kmeans_1d(x, wt, 8)
    assert torch.equal(idx, (x[..., None] - c[:, None, :]).abs().argmin(-1))
    assert torch.all(c[:, 1:] >= c[:, :-1])
    num = torch.zeros_like(c).scatter_add_(1, idx, wt * x)
    den = torch.zeros_like(c).scatter_add_(1, idx, wt)
    used = den > 0
    assert torch.allclose(c[used], (num / den.clamp(min=1e-300))[used], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bits", [2, 3])
def test_lnq_beats_its_seed_which_beats_gptq_which_beats_rtn(bits):
    w, _, h = _layer()
    seed, res = _lnq(w, h, bits)
    fmt = IntFormat(bits, None)
    rtn = lnq.objective(w, fake_quantize(w.float(), fmt).double(), h)
    gq = lnq.objective(w, gptq(w.float(), h.float(), fmt).weight.double(), h)
    kmeans = lnq.objective(w, seed[0].gather(1, seed[1]), h)
    assert lnq.objective(w, res.weight(), h) < kmeans < gq < rtn


def _toy_guided(groups: int):
    model = ToyLM()
    ids = model.sample(64, 16, seed=2)
    sal = saliency.collect(model, {"up": model.up}, ids, groups=groups)
    x = model.emb(ids).detach().reshape(-1, 24).double()
    stats = saliency.GuidedStats(sal.tokens["up"])
    stats.add(x, True)
    return model, ids, stats.hessian, x.T @ x, sal


def test_each_quantizer_wins_on_its_own_objective():
    model, _, hg, plain, sal = _toy_guided(4)
    w = model.up.weight.detach().double()
    hg = torch.stack([lnq.damped(h, 1e-5) for h in hg])
    seed = lnq.kmeans_1d(w, sal.fisher["up"].double() + 1e-12, 4)
    alone = lnq.lnq(w, plain, seed).weight()
    guided = torch.cat([lnq.lnq(w[a:b], hg[g], (seed[0][a:b], seed[1][a:b])).weight()
                        for g, (a, b) in enumerate(saliency.group_bounds(32, 4))])
    assert lnq.objective(w, alone, plain) < lnq.objective(w, guided, plain)
    assert guided_objective(w, guided, hg) < guided_objective(w, alone, hg)


def test_the_guided_objective_ranks_perturbations_by_loss_better_than_x_xt():
    from scipy.stats import spearmanr

    model, _, hg, plain, _ = _toy_guided(32)
    held = model.sample(256, 16, seed=9)
    w0 = model.up.weight.detach().clone()
    with torch.no_grad():
        base = float(model(held, labels=held).loss)
    g = torch.Generator().manual_seed(5)
    true, pred_guided, pred_plain = [], [], []
    for _ in range(40):
        delta = torch.randn(w0.shape, generator=g) * torch.rand(w0.shape[0], 1, generator=g) * 0.05
        with torch.no_grad():
            model.up.weight.copy_(w0 + delta)
            true.append(float(model(held, labels=held).loss) - base)
        d = delta.double()
        pred_guided.append(guided_objective(w0.double(), w0.double() + d, hg))
        pred_plain.append(float(((d @ plain) * d).sum()))
    guided_rho, plain_rho = spearmanr(true, pred_guided)[0], spearmanr(true, pred_plain)[0]
    assert guided_rho > plain_rho and guided_rho > 0.8, (guided_rho, plain_rho)


def test_lut_linear_packs_indices_and_counts_its_codebooks():
    lin = torch.nn.Linear(64, 16, bias=True)
    g = torch.Generator().manual_seed(6)
    idx = torch.randint(0, 8, (16, 64), generator=g)
    cb = torch.randn(16, 8, generator=g)
    q = LUTLinear.from_indices(lin, idx, cb, 3)
    assert torch.equal(q.indices(), idx)
    w = cb.half().float().gather(1, idx)
    x = torch.randn(5, 64, generator=g)
    assert torch.allclose(q(x), torch.nn.functional.linear(x, w, lin.bias), atol=1e-6)
    assert q.bits_per_weight == 3 + 16 * 8 / 64


def test_params_and_group_bounds_refuse_what_cannot_work():
    with pytest.raises(ValueError, match="w2a16, w3a16, w4a16"):
        GuidedQuantParams(bits="w2a8")
    with pytest.raises(ValueError, match="between 1 and"):
        saliency.group_bounds(3, 4)
    assert saliency.group_bounds(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]


@pytest.mark.parametrize("backend", ["lnq", "gptq"])
def test_saved_model_reloads_with_identical_perplexity(cli, tmp_path, backend):
    r = cli("--json", "quantize", "--method", "guidedquant", "--bits", "w3a16", "--model", "ref:llama-test",
            "--eval", "perplexity", "--set", "perplexity.max_tokens=512", "--set", "calib_samples=4",
            "--set", "calib_seq_len=64", "--set", f"backend={backend}", "--set", "iterations=2",
            "--set", "group_size=32", "-o", tmp_path / "q")
    assert r.code == 0, r.err
    quant, ppl = r.json()["stages"][-2]["metrics"], r.json()["stages"][-1]["metrics"]["perplexity"]
    again = cli("--json", "eval", "--method", "perplexity", "--model", quant["model_dir"], "--set", "max_tokens=512",
                "-o", tmp_path / "e")
    assert again.code == 0, again.err
    assert again.json()["stages"][0]["metrics"]["perplexity"] == pytest.approx(ppl, rel=1e-6)
    assert quant["objective"] < quant["objective_seed"] or backend == "gptq"
    # the cost ``llmx compare`` reads: the stored bits per weight, codebooks (8 fp16 entries per row of at least 64
    # inputs: at most 2 bits more) or group scales included
    assert quant["weight_bits_per_element"] == pytest.approx(8 * quant["quantized_bytes"] / quant["quantized_params"])
    assert 3 < quant["weight_bits_per_element"] <= 5


def test_bad_input_is_one_line_exit_2_and_no_run_folder(cli, tmp_path):
    bad = cli("quantize", "--method", "guidedquant", "--bits", "w2a8", "--model", "tiny:llama", "-o", tmp_path / "a")
    assert bad.code == 2 and "w2a16, w3a16, w4a16" in bad.err
    wide = cli("quantize", "--method", "guidedquant", "--model", "tiny:llama", "--set", "num_groups=100000",
               "-o", tmp_path / "b")
    assert wide.code == 2 and "output channels" in wide.err and len(wide.err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not any((tmp_path / "b").iterdir())


def test_a_saved_codebook_of_the_wrong_shape_is_refused(cli, tmp_path):
    from safetensors.torch import load_file, save_file

    r = cli("--json", "quantize", "--method", "guidedquant", "--bits", "w2a16", "--model", "ref:llama-test",
            "--set", "calib_samples=2", "--set", "calib_seq_len=32", "--set", "iterations=1", "-o", tmp_path / "q")
    assert r.code == 0, r.err
    folder = r.json()["stages"][0]["metrics"]["model_dir"]
    f = next(Path(folder).glob("*.safetensors"))
    state = load_file(str(f))
    key = next(k for k in state if k.endswith("codebook"))
    state[key] = torch.zeros(state[key].shape[0], 8, dtype=torch.float16)
    save_file(state, str(f))
    (Path(folder) / "llmx-manifest.json").unlink()  # a folder edited by hand, not damaged
    again = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "e")
    assert again.code == 2 and "does not match its stored spec" in again.err, again.err
