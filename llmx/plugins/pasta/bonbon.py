"""BoNBoN rounds for Pasta (notes §2, "Stage 2"): sample ``samples`` annotated responses per prompt through the
interpreter, score each by ``speedup + λ·quality`` (speedup: plain tokens over steps, so tags do not pay), and train
on the best with the SFT loss plus IPO between the best and the worst (Gui et al. 2024: α·L_SFT + (1-α)·L_IPO),
log-probabilities under the Pasta layout (each token's target is the next token of its own stream).

Reconstructed choices, each an option: quality = parse validity (0/1) minus the judge's per-token NLL of the plain
response (the paper: Gemini's win rate); λ = inf ranks by quality with speedup breaking ties; IPO's τ defaults to
BoNBoN's 1/(2 (n-1) H_{n-1}) for best-vs-worst of n samples (H the harmonic number, as we read Gui et al.); summed
log-probabilities for both terms, as BoNBoN; the best is chosen among clean samples (ended at EOS, no interpreter
error), the worst among all that lay out; the reference is the policy at the start of each round (its log-probabilities
computed once per pair).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llmx.core.preference import ipo_loss, masked_sum, token_logps
from llmx.plugins.pasta import decode as D
from llmx.plugins.pasta import interpreter as I
from llmx.plugins.pasta import lang, layout

UNSCORED_NLL = 10.0  # an empty response's NLL (and every one's without a judge: then it shifts all scores alike)


@dataclass
class Candidate:
    lay: layout.Layout | None  # None: tags the layout cannot read (never trained on)
    speedup: float
    parses: bool
    plain: str  # the response without its tags
    clean: bool = True  # ended at EOS with no interpreter error: it may be the best (any laid-out one the worst)
    nll: float | None = None  # the judge's per-token NLL of ``plain``

    def quality(self) -> float:
        return float(self.parses) - (self.nll if self.nll is not None else UNSCORED_NLL)


def bonbon_tau(n: int) -> float:
    """IPO's τ for the best-vs-worst pair of ``n`` samples: 1 / (2 (n-1) H_{n-1})."""
    return 1 / (2 * (n - 1) * sum(1 / k for k in range(1, n)))


def score(c: Candidate, lam: float) -> tuple[float, float]:
    """What ranks candidates: ``speedup + λ·quality``; λ = inf ranks by quality, speedup breaking ties."""
    if math.isinf(lam):
        return (c.quality(), c.speedup)
    return (c.speedup + lam * c.quality(), 0.0)


def candidates(model, tok, tags: dict[str, int], prompt: str, n: int, opts: I.Options, temperature: float,
               seed: int) -> list[Candidate]:
    """``n`` sampled responses to ``prompt`` with their layouts, speedups and parse validity."""
    ids = layout.encode(tok, prompt, prompt=True)
    out = []
    for k in range(n):
        res = I.run(model, ids, tags, tok.decode, tok.eos_token_id, opts, I.Sample(temperature, seed * 1000 + k))
        eos = tok.eos_token_id if res.ended == "eos" else None  # a response cut at the budget never learns to stop
        try:
            lay = layout.build(ids, res.response, tags, tok.decode, eos=eos)
        except lang.PastaSyntaxError:
            lay = None
        plain, plain_tokens = D.plain_of(tok, tags, res.response)
        out.append(Candidate(lay, D.speedup(plain_tokens, res.steps), D.parses(prompt, plain), plain,
                             res.ended == "eos" and not res.errors))
    return out


def pair(cands: list[Candidate], lam: float) -> tuple[Candidate, Candidate] | None:
    """(best, worst): the best clean candidate and the worst one with a layout, or None when there is no clean one
    or the worst scores as well as the best."""
    ok = [c for c in cands if c.lay is not None]
    clean = [c for c in ok if c.clean]
    if not clean:
        return None
    best = max(clean, key=lambda c: score(c, lam))
    worst = min(ok, key=lambda c: score(c, lam))
    if score(worst, lam) >= score(best, lam):
        return None
    return best, worst


def sequence_logps(model, lays: list[layout.Layout], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probabilities of each layout's response targets, and their counts."""
    from llmx.plugins.pasta.sft import batch

    t = batch(lays, pad, model, next(model.parameters()).device)
    labels = t.pop("labels")
    keep = labels[:, 1:] != layout.IGNORE
    return masked_sum(token_logps(model(**t).logits, labels.clamp(min=0)), keep), keep.sum(-1)


@torch.no_grad()
def reference_logps(model, pairs: list[tuple[layout.Layout, layout.Layout]], pad: int,
                    batch_size: int) -> list[tuple[float, float]]:
    """The round-start policy's summed log-probabilities of each (best, worst), computed once per round."""
    was = model.training
    model.eval()
    out = []
    for s in range(0, len(pairs), batch_size):
        chunk = pairs[s:s + batch_size]
        logps, _ = sequence_logps(model, [b for b, _ in chunk] + [w for _, w in chunk], pad)
        out += list(zip(logps[:len(chunk)].tolist(), logps[len(chunk):].tolist(), strict=True))
    model.train(was)
    return out


def loss(policy, pairs: list[tuple[layout.Layout, layout.Layout]], ref: list[tuple[float, float]], pad: int,
         alpha: float, tau: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """α · NLL of the best + (1-α) · IPO(best, worst), both on summed log-probs (sequence level, as BoNBoN's
    SFT-BoN and IPO-BoN), averaged over the pairs; ``ref`` holds each pair's reference log-probs."""
    best, worst = [b for b, _ in pairs], [w for _, w in pairs]
    pi, _ = sequence_logps(policy, best + worst, pad)
    n = len(pairs)
    ref_w, ref_l = (torch.tensor(side, device=pi.device) for side in zip(*ref, strict=True))
    sft = -pi[:n]
    ipo = ipo_loss(pi[:n], pi[n:], ref_w, ref_l, tau)
    total = alpha * sft + (1 - alpha) * ipo
    return total.mean(), {"sft": sft.detach().mean(), "ipo": ipo.detach().mean(),
                          "margin": ((pi[:n] - ref_w) - (pi[n:] - ref_l)).detach().mean()}
