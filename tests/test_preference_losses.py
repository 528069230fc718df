"""Preference losses: exact reductions (PIPA-N on pairs = DPO), ConfPO's selection rule, PIPA's priors recovering
the truth in the world that matches them, PIPA-M's bound keeping a gradient, and KTO's reference point over ranks."""

from __future__ import annotations

import math

import pytest
import torch

from llmx.core import preference as P


def test_pipa_n_on_pairs_equals_dpo_in_loss_and_gradients():
    torch.manual_seed(0)
    for beta in (1.0, 0.1):
        leaves = [torch.randn(16, requires_grad=True) for _ in range(4)]
        pipa = P.pipa_n_paired_loss(*leaves, beta=beta).mean()
        grads_pipa = torch.autograd.grad(pipa, leaves)
        dpo = P.dpo_loss(*leaves, beta=beta).mean()
        grads_dpo = torch.autograd.grad(dpo, leaves)
        assert torch.allclose(pipa, dpo, atol=0, rtol=0)
        assert all(torch.equal(a, b) for a, b in zip(grads_pipa, grads_dpo, strict=True))


def test_pipa_n_pairs_follow_from_the_unpaired_model():
    """Conditioning two unpaired PIPA-N probabilities on 'exactly one is positive' gives the paired loss; g cancels."""
    torch.manual_seed(1)
    pw, pl, rw, rl, g = (torch.randn(8) for _ in range(5))
    sw, sl = torch.sigmoid(pw - rw + g), torch.sigmoid(pl - rl + g)
    conditioned = sw * (1 - sl) / (sw * (1 - sl) + (1 - sw) * sl)
    assert torch.allclose(-torch.log(conditioned), P.pipa_n_paired_loss(pw, pl, rw, rl, beta=1.0), atol=1e-6)


def test_pipa_m_probabilities_are_feasible_and_pairs_are_complementary():
    torch.manual_seed(2)
    pw, pl, rw, rl, g = (torch.randn(32) for _ in range(5))
    assert torch.all(P.pipa_m_log_q(pw + 5, rw, g) <= -1e-6)  # a ratio above 1/g is clamped into [0, 1)
    forward = torch.exp(-P.pipa_m_paired_loss(pw, pl, rw, rl, g, stabilizer="clamp"))  # the likelihood alone
    backward = torch.exp(-P.pipa_m_paired_loss(pl, pw, rl, rw, g, stabilizer="clamp"))
    assert torch.allclose(forward + backward, torch.ones(32), atol=1e-5)
    log_q = P.pipa_m_log_q(pw, rw, g).double()
    c = (torch.rand(32) > 0.5).double()
    expected = -(c * log_q + (1 - c) * torch.log(1 - log_q.exp()))  # float64 reference
    assert torch.allclose(P.pipa_m_loss(pw, rw, g, c, stabilizer="clamp").double(), expected, rtol=1e-3, atol=1e-5)


def test_pipa_m_default_bound_keeps_a_gradient_past_it_and_leaves_the_loss_unchanged_inside():
    """A negative row past the bound: the hard clamp leaves it at 13.8 with no gradient, for good; the default
    penalty pulls it back (slope 1) and is exactly the likelihood wherever f g <= p0."""
    g, ref = torch.tensor([2.0, 2.0, 2.0, 2.0]), torch.tensor([-5.0, -5.0, -10.0, -10.0])
    pi = torch.tensor([-2.0, -2.0, -30.0, -12.0], requires_grad=True)  # rows 0, 1 past the bound; 2, 3 inside
    label = torch.tensor([0.0, 1.0, 0.0, 1.0])
    hard = P.pipa_m_loss(pi, ref, g, label, stabilizer="clamp")
    (grad_hard,) = torch.autograd.grad(hard.sum(), pi)
    loss = P.pipa_m_loss(pi, ref, g, label)
    (grad,) = torch.autograd.grad(loss.sum(), pi)
    assert float(hard[0].detach()) == pytest.approx(-math.log(-math.expm1(-1e-6)), rel=1e-3) and grad_hard[0] == 0
    u = pi.detach() + torch.nn.functional.logsigmoid(g) - ref
    assert torch.allclose(loss[:2], hard[:2] + (u[:2] + 1e-6), atol=1e-5)  # the likelihood at the bound + (u - c)
    assert grad[0] == pytest.approx(1.0, abs=1e-6) and grad[1] == pytest.approx(1.0, abs=1e-6)  # pulled back
    assert torch.equal(loss[2:], hard[2:]) and torch.equal(grad[2:], grad_hard[2:])  # unchanged inside the bound
    paired = P.pipa_m_paired_loss(pi[:1], pi[2:3], ref[:1], ref[2:3], g[:1])
    (grad_w,) = torch.autograd.grad(paired.sum(), pi)
    assert grad_w[0] > 0.5  # the chosen side past the bound is pulled back in the paired loss too


def _kl_worker(rank: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    pi = torch.tensor([[1.0, 2.0], [3.0, 5.0]][rank])
    z = P.kto_kl_estimate(pi, torch.zeros(2))
    torch.save(z, f"{out}.{rank}")
    torch.distributed.destroy_process_group()


def test_kto_reference_point_is_the_mean_over_every_ranks_mismatched_pairs(tmp_path):
    assert P.kto_kl_estimate(torch.tensor([-1.0, -3.0]), torch.zeros(2)) == 0  # clamped at 0
    pi = torch.tensor([1.0, 2.5], requires_grad=True)
    z = P.kto_kl_estimate(pi, torch.tensor([0.5, 1.0]))
    assert float(z) == pytest.approx(1.0) and not z.requires_grad
    out = str(tmp_path / "z")
    torch.multiprocessing.spawn(_kl_worker, args=(f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
    assert [float(torch.load(f"{out}.{r}")) for r in (0, 1)] == [2.75, 2.75]  # (1 + 2 + 3 + 5) / 4 on both ranks


def test_kto_matches_its_definition():
    pi, ref = torch.tensor([0.5, -1.0]), torch.tensor([0.0, 0.0])
    loss = P.kto_loss(pi, ref, torch.tensor([1, 0]), torch.tensor(0.2), beta=2.0)
    assert torch.allclose(loss, torch.tensor([1 - 1 / (1 + math.exp(-0.6)), 1 - 1 / (1 + math.exp(-2.4))]))


def test_confpo_threshold_is_the_log_of_the_arithmetic_mean_probability():
    logps = torch.log(torch.tensor([[0.9, 0.5, 0.1, 0.6, 0.3]]))
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # mean probability of the 4 response tokens = 0.525: tokens with p < 0.525 are selected (not the geometric mean)
    assert P.confpo_mask(logps, mask).tolist() == [[False, True, True, False, False]]
    geometric = logps[0, :4].mean().exp()  # 0.41: would select only 0.1
    assert geometric < 0.5


def test_confpo_selection_carries_no_gradient_and_empty_selections_count_as_zero():
    logps_w = torch.log(torch.tensor([[0.9, 0.2, 0.8], [0.5, 0.5, 0.5]])).requires_grad_()
    logps_l = torch.log(torch.tensor([[0.3, 0.7, 0.1], [0.4, 0.9, 0.2]])).requires_grad_()
    mask = torch.ones(2, 3)
    assert not P.confpo_mask(logps_w, mask).requires_grad
    loss, stats = P.confpo_simpo_loss(logps_w, mask, logps_l, mask, beta=1.5, gamma=1.6)
    assert stats["selected_w"].tolist() == [1, 0]  # equal probabilities: nothing below the mean
    assert loss[1] == 0 and loss[0] > 0
    loss.mean().backward()
    assert logps_w.grad[0].tolist()[0] == 0 and logps_w.grad[0, 1] != 0  # only the selected token gets gradient
    assert torch.all(logps_w.grad[1] == 0)
    # rejected: mean probability 0.367, so 0.3 and 0.1 are selected
    expected = P.simpo_loss(logps_w[0, 1], logps_l[0, [0, 2]].mean(), 1.5, 1.6) / 2
    assert torch.isclose(loss.mean(), expected)  # the zeroed example stays in the denominator


def _fit(loss_fn, data: torch.Tensor, p0: torch.Tensor, steps: int = 800) -> torch.Tensor:
    """Minimise the exact expected loss under ``data[x, y, c]`` (no sampling); return f = p(y | x, c=1).
    g starts small (logit -3) so PIPA-M's q = f g / p0 starts feasible, below its clamp."""
    theta = torch.zeros_like(p0, requires_grad=True)
    phi = torch.full((p0.shape[0],), -3.0, requires_grad=True)
    opt = torch.optim.Adam([theta, phi], lr=0.05)
    log_p0 = p0.log()
    for _ in range(steps):
        log_f = torch.log_softmax(theta, -1)
        g = phi[:, None].expand_as(log_f)
        loss = sum((data[..., c] * loss_fn(log_f, log_p0, g, torch.full_like(log_f, c))).sum() for c in (0, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.softmax(theta.detach(), -1)


def test_each_pipa_variant_recovers_the_truth_in_the_world_of_its_prior():
    torch.manual_seed(0)
    X, K = 3, 6
    p0 = torch.softmax(torch.randn(X, K), -1)
    p_pos = torch.softmax(torch.randn(X, K) * 1.5, -1)
    g = 0.9 * (p0 / p_pos).min(-1).values  # PIPA-M world: q = p_pos g / p0 <= 0.9
    q = p_pos * g[:, None] / p0
    m_world = torch.stack([p0 * (1 - q), p0 * q], -1) / X  # y ~ p0, c ~ Bern(q): marginal of y is p0
    g_n = torch.full((X, 1), 0.4)
    n_world = torch.stack([(1 - g_n) * p0, g_n * p_pos], -1) / X  # c ~ Bern(g), y | c=0 ~ p0, y | c=1 ~ p_pos

    def kl(f):
        return float((p_pos * (p_pos / f).log()).sum(-1).mean())

    variants = {"m": P.pipa_m_loss, "n": P.pipa_n_loss}
    result = {(world, v): kl(_fit(fn, data, p0)) for world, data in (("m", m_world), ("n", n_world))
              for v, fn in variants.items()}
    assert result[("m", "m")] < 0.02 and result[("n", "n")] < 0.02
    assert result[("m", "n")] > 0.1 and result[("n", "m")] > 0.1


def test_pipa_m_smooth_bound_keeps_a_gradient_where_the_hard_clamp_has_none():
    pi = torch.tensor([-2.0, -30.0], requires_grad=True)  # row 0: f g / p0 > 1 (infeasible), row 1: far below
    ref, g = torch.tensor([-5.0, -10.0]), torch.tensor([2.0, 2.0])
    hard = P.pipa_m_log_q(pi, ref, g, stabilizer="clamp")
    grad_hard = torch.autograd.grad(hard.sum(), pi)[0]
    smooth = P.pipa_m_log_q(pi, ref, g, stabilizer="softplus")
    grad_smooth = torch.autograd.grad(smooth.sum(), pi)[0]
    assert grad_hard[0] == 0 and grad_smooth[0] > 0.04  # sigmoid(-u) at u = 2.87
    u1 = -30.0 + torch.nn.functional.logsigmoid(torch.tensor(2.0)) + 10.0
    assert torch.isclose(smooth[1], u1, atol=1e-6) and torch.isclose(hard[1], u1)  # identical far from the bound
    assert torch.all(smooth < 0) and torch.all(hard <= -1e-6)
    u = pi.detach() + torch.nn.functional.logsigmoid(g) - ref
    assert torch.allclose(smooth.detach().exp(), torch.sigmoid(u))  # the smooth bound models q as sigmoid(u)


def test_ipo_is_zero_exactly_at_its_target_margin_and_quadratic_around_it():
    tau = 0.25
    ref_w, ref_l = torch.tensor([-3.0]), torch.tensor([-4.0])
    at = P.ipo_loss(torch.tensor([-1.0]), torch.tensor([-4.0]), ref_w, ref_l, tau)  # h = 2 = 1 / (2 tau)
    pi_w = torch.tensor([0.0], requires_grad=True)
    above = P.ipo_loss(pi_w, torch.tensor([-4.0]), ref_w, ref_l, tau)  # h = 3
    above.backward()
    assert at.item() == 0 and above.item() == pytest.approx(1.0) and pi_w.grad.item() == pytest.approx(2.0)
