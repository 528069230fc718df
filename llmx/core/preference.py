"""Preference-optimisation losses as plain functions of log-probabilities (no model inside).

Inputs are summed response log-probs (``[B]``) or per-token log-probs with response masks (``[B, T]``); each loss
returns per-example values, so the caller chooses the reduction. Conventions:

* DPO (Rafailov et al., 2023): ``-log sigma(beta * ((pi_w - ref_w) - (pi_l - ref_l)))``.
* SimPO (Meng et al., 2024): length-normalised policy log-probs, margin ``gamma``, no reference.
* KTO (Ethayarajh et al., 2024, eq. 7), TRL's form: ``1 - sigma(beta (r - z_ref))`` for desirable and
  ``1 - sigma(beta (z_ref - r))`` for undesirable examples, ``r = pi - ref`` and ``z_ref`` the detached KL estimate
  ``max(0, mean(pi(y'|x) - ref(y'|x)))`` on mismatched pairs, over every rank.
* PIPA (Li et al., ICML 2025), derived by Bayes' rule from the paper's priors (no official code; see
  ``shared`` notes): with ``f`` the policy, ``p0`` the reference and ``g = p(c=1|x)``,
  PIPA-N: ``p(c=1|x,y) = sigma(log f - log p0 + logit g)``; paired and conditioned on exactly one positive, ``g``
  cancels and the loss is DPO with ``beta`` (the paper's special case).
  PIPA-M: ``q = f g / p0``, loss ``-(c log q + (1-c) log(1-q))``, under the prior's constraint ``f g <= p0``
  (``p(y|x,c=0) = (p0 - f g) / (1 - g)`` is a probability): ``log q`` clamped at ``clamp`` plus the exact penalty
  ``(log(f g / p0) - clamp)_+`` on a violation; paired, the probability that the chosen one is the positive given
  exactly one is.
* ConfPO (Yoon et al., ICML 2025): select the response tokens whose probability is below the arithmetic mean
  probability of that response (``tau = log mean exp(l)``), a detached mask; SimPO (or DPO) on the selected tokens
  only; an example with an empty selection contributes 0 but stays in the mean.
* LiPO-lambda (Liu et al., 2024, "LiPO: Listwise Preference Optimization through Learning-to-Rank"; the
  lambda loss of LambdaLoss): over a list of responses with labels ``psi`` and rewards ``s = beta (pi - ref)``,
  ``-sum_{psi_i > psi_j} Delta_ij log sigma(s_i - s_j)``, ``Delta_ij = |G_i - G_j| |1/D(tau_i) - 1/D(tau_j)|``,
  gains ``G = 2^psi - 1``, discounts ``D(tau) = log2(1 + tau)``, ``tau`` the rank of ``s`` (1 the highest; the
  weights detached). A list of two with labels 1 and 0 is DPO times ``1 - 1/log2(3)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmx.core.logprobs import selective_log_softmax


def token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(x_t | x_<t)`` for t >= 1, shape ``[B, T-1]`` (aligned with ``input_ids[:, 1:]``), float32, without a
    full-vocabulary float32 tensor (``selective_log_softmax``). Every position is scored, the last against a dummy
    label and dropped, so contiguous logits are never copied to drop their last position."""
    labels = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
    return selective_log_softmax(logits, labels)[:, :-1]


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(values, mask) / mask.sum(-1).clamp(min=1)


def dpo_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
             beta: float = 0.1, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO; ``label_smoothing > 0`` is conservative DPO (the label is flipped with that probability)."""
    margin = beta * ((pi_w - ref_w) - (pi_l - ref_l))
    return -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)


def ipo_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
             tau: float = 0.1) -> torch.Tensor:
    """IPO (Azar et al. 2024, eq. 17): ``(h - 1/(2 tau))^2`` with ``h`` the log-ratio margin; pass per-token means
    of the log-probs for TRL's length-normalised variant."""
    h = (pi_w - ref_w) - (pi_l - ref_l)
    return (h - 1 / (2 * tau)) ** 2


def simpo_loss(avg_w: torch.Tensor, avg_l: torch.Tensor, beta: float = 2.0, gamma: float = 0.5,
               label_smoothing: float = 0.0) -> torch.Tensor:
    """On length-normalised log-probs; ``gamma`` is the target margin (``h = (r_w - r_l) - gamma / beta``)."""
    h = beta * (avg_w - avg_l) - gamma
    return -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)


def kto_loss(pi: torch.Tensor, ref: torch.Tensor, desirable: torch.Tensor, z_ref: torch.Tensor, beta: float = 0.1,
             desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> torch.Tensor:
    r = pi - ref
    z = z_ref.detach()
    good = desirable_weight * (1 - torch.sigmoid(beta * (r - z)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z - r)))
    return torch.where(desirable.bool(), good, bad)


def kto_kl_estimate(pi: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """KTO's reference point ``z_ref`` (TRL's ``kto_loss``): the mean of ``pi - ref`` over the mismatched (prompt,
    completion) pairs of every rank (their sum and count all-reduced when torch.distributed is initialised),
    clamped at 0, detached."""
    from llmx.core.train.distributed import world

    d = (pi - ref).detach().float()
    total = torch.stack([d.sum(), torch.tensor(float(d.numel()), device=d.device)])
    if world()[1] > 1:
        torch.distributed.all_reduce(total)
    return (total[0] / total[1]).clamp(min=0)


def pipa_n_loss(pi: torch.Tensor, ref: torch.Tensor, g_logit: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """PIPA-N, unpaired (or per step): BCE of ``c`` against ``sigma((log f - log p0) + logit g)``."""
    return F.binary_cross_entropy_with_logits((pi - ref) + g_logit, label.float(), reduction="none")


def pipa_n_paired_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
                       beta: float = 1.0) -> torch.Tensor:
    """PIPA-N conditioned on exactly one positive: ``g`` cancels, leaving DPO (``beta = 1`` is the derivation;
    other values temper it)."""
    return -F.logsigmoid(beta * ((pi_w - ref_w) - (pi_l - ref_l)))


def _pipa_m(pi: torch.Tensor, ref: torch.Tensor, g_logit: torch.Tensor, clamp: float,
            stabilizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log q, penalty)`` from ``u = log f + log g - log p0`` in fp32. PIPA-M's prior ``p0 = f g + p(y|x,c=0)
    (1 - g)`` holds only where ``u <= 0``; the stabilizer keeps ``log q`` at or below ``clamp``:
    ``penalty``: ``min(u, clamp)`` and the exact penalty ``(u - clamp)_+`` on the violated constraint, so the loss is
    unchanged wherever the constraint holds and a row past the bound is pulled back with slope 1 (the positive
    term's own slope: a positive row's constrained optimum is the bound); ``clamp``: the hard clamp alone (no
    gradient past the bound: a negative row there stays at ``-log(1 - e^clamp)``, 13.8, for good); ``softplus``:
    ``q = sigmoid(u) = f g / (f g + p0)``, always a gradient, another model of ``q`` wherever it is not small."""
    u = pi.float() + F.logsigmoid(g_logit.float()) - ref.float()
    if stabilizer == "softplus":
        u = -F.softplus(-u)
    penalty = (u - clamp).clamp(min=0) if stabilizer == "penalty" else torch.zeros_like(u)
    return u.clamp(max=clamp), penalty


def pipa_m_log_q(pi: torch.Tensor, ref: torch.Tensor, g_logit: torch.Tensor, clamp: float = -1e-6,
                 stabilizer: str = "penalty") -> torch.Tensor:
    """``log q = log(f g / p0)`` kept at or below ``clamp`` (``_pipa_m``)."""
    return _pipa_m(pi, ref, g_logit, clamp, stabilizer)[0]


def _log1m_exp(log_q: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(log_q))`` for ``log_q < 0``, stable on both ends."""
    return torch.where(log_q > -0.693, torch.log(-torch.expm1(log_q)), torch.log1p(-torch.exp(log_q)))


def pipa_m_loss(pi: torch.Tensor, ref: torch.Tensor, g_logit: torch.Tensor, label: torch.Tensor,
                clamp: float = -1e-6, stabilizer: str = "penalty") -> torch.Tensor:
    """PIPA-M, unpaired (or per step): ``-(c log q + (1 - c) log(1 - q))`` with ``q = f g / p0``, plus the
    stabilizer's penalty."""
    log_q, penalty = _pipa_m(pi, ref, g_logit, clamp, stabilizer)
    c = label.float()
    return -(c * log_q + (1 - c) * _log1m_exp(log_q)) + penalty


def pipa_m_paired_loss(pi_w: torch.Tensor, pi_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor,
                       g_logit: torch.Tensor, clamp: float = -1e-6, stabilizer: str = "penalty") -> torch.Tensor:
    """PIPA-M conditioned on exactly one positive: ``-log[q_w (1-q_l) / (q_w (1-q_l) + (1-q_w) q_l)]``
    (derived; ``g`` does not cancel), plus both sides' penalties."""
    lw, pen_w = _pipa_m(pi_w, ref_w, g_logit, clamp, stabilizer)
    ll, pen_l = _pipa_m(pi_l, ref_l, g_logit, clamp, stabilizer)
    a = lw + _log1m_exp(ll)
    b = _log1m_exp(lw) + ll
    return -(a - torch.logaddexp(a, b)) + pen_w + pen_l


def confpo_mask(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached selection of preference-critical tokens: probability below the response's arithmetic mean
    probability, ``tau = log((1/|R|) sum exp(l_i))``."""
    with torch.no_grad():
        m = mask.bool()
        lp = logps.detach().float().masked_fill(~m, float("-inf"))
        tau = torch.logsumexp(lp, dim=-1, keepdim=True) - torch.log(m.sum(-1, keepdim=True).clamp(min=1).float())
        return (lp < tau) & m


def confpo_simpo_loss(logps_w: torch.Tensor, mask_w: torch.Tensor, logps_l: torch.Tensor, mask_l: torch.Tensor,
                      beta: float = 1.5, gamma: float = 1.6, label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict]:
    """SimPO on the selected tokens' mean log-prob; returns per-example losses and the selection counts."""
    sel_w, sel_l = confpo_mask(logps_w, mask_w), confpo_mask(logps_l, mask_l)
    n_w, n_l = sel_w.sum(-1), sel_l.sum(-1)
    r_w = masked_sum(logps_w, sel_w) / n_w.clamp(min=1)
    r_l = masked_sum(logps_l, sel_l) / n_l.clamp(min=1)
    loss = simpo_loss(r_w, r_l, beta, gamma, label_smoothing) * ((n_w > 0) & (n_l > 0))
    return loss, {"selected_w": n_w, "selected_l": n_l}


def confpo_dpo_loss(logps_w: torch.Tensor, ref_w: torch.Tensor, mask_w: torch.Tensor, logps_l: torch.Tensor,
                    ref_l: torch.Tensor, mask_l: torch.Tensor, beta: float = 0.1,
                    reduction: str = "sum") -> tuple[torch.Tensor, dict]:
    """DPO on the policy-reference log-ratio of the selected tokens (selection from the policy only; derived, not in
    the public code)."""
    sel_w, sel_l = confpo_mask(logps_w, mask_w), confpo_mask(logps_l, mask_l)
    reduce = masked_sum if reduction == "sum" else masked_mean
    rw, rl = reduce(logps_w - ref_w, sel_w), reduce(logps_l - ref_l, sel_l)
    n_w, n_l = sel_w.sum(-1), sel_l.sum(-1)
    loss = -F.logsigmoid(beta * (rw - rl)) * ((n_w > 0) & (n_l > 0))
    return loss, {"selected_w": n_w, "selected_l": n_l}


def lipo_lambda_loss(rewards: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """LiPO-lambda per list ``[B]`` from ``rewards [B, K]`` (``beta (pi - ref)`` each), graded ``labels [B, K]``
    (higher is better; LiPO's are in [0, 1]) and ``mask [B, K]`` (an absent response: False). Every pair with
    ``psi_i > psi_j`` adds ``-Delta_ij log sigma(s_i - s_j)``; ``Delta_ij`` (detached) weighs it by the gain
    difference and the rank-discount difference, ranks by the current rewards (descending; ties by position, absent
    responses last). Lists are summed over their pairs, not normalised (the paper's form)."""
    present = torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask.bool()
    s = rewards.float()
    with torch.no_grad():
        psi = torch.where(present, labels.float(), torch.zeros_like(s))
        order = s.masked_fill(~present, float("-inf")).sort(dim=-1, descending=True, stable=True).indices
        positions = torch.arange(1, s.shape[-1] + 1, device=s.device, dtype=s.dtype).expand_as(s)
        rank = torch.empty_like(s).scatter_(-1, order, positions)
        discount = 1 / torch.log2(1 + rank)
        gain = torch.pow(2.0, psi) - 1
        delta = (gain[:, :, None] - gain[:, None, :]).abs() * (discount[:, :, None] - discount[:, None, :]).abs()
        pairs = (psi[:, :, None] > psi[:, None, :]) & present[:, :, None] & present[:, None, :]
    terms = F.logsigmoid(s[:, :, None] - s[:, None, :])
    return -torch.where(pairs, delta * terms, torch.zeros_like(terms)).sum((-2, -1))
