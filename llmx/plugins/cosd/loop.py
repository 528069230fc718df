"""The decoding loops of one harness, every strategy counted the same way (model calls by forward hooks, wall time):

- ``cosd`` (Algorithm 1): the draft proposes ``draft_tokens`` tokens; one assistant forward over the text plus the
  draft gives its top token y_t and P_q(y_t) at every draft position; at the first position the decision replaces,
  y_t takes x_t's place and the rest of the draft is dropped (both KV caches are cropped back by ``Stream``);
  otherwise the whole draft is kept (no bonus token). Greedy drafts, or sampled at ``draft_temperature`` (seeded).
  With greedy drafts the text does not depend on K (each position's decision sees only the committed prefix); K
  trades draft forwards against assistant forwards. A different-tokenizer pair counts ``max_new_tokens`` in the
  assistant's tokens.
- ``draft`` / ``assistant``: one model alone, greedy.
- ``average``: both models every step, the argmax of (1 - w) P_p + w P_q (a shared vocabulary only).
- ``speculative``: transformers' assisted decoding with the assistant as target (lossless, greedy), and
  ``ensemble``: the same with ``assistant_ensemble_weight`` (transformers' lossy verification against
  w P_target + (1 - w) P_draft).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import Any

import torch

from llmx.core.eval.generate import cut, eos_ids
from llmx.core.models.stream import Stream
from llmx.plugins.cosd.bridge import Retokenized, Shared, decode, encode
from llmx.plugins.cosd.decide import Decision, Position

UTF8_TAIL = 3  # tokens past a block or a replacement that may complete a character a byte-level vocabulary split


@dataclass
class Result:
    text: str
    tokens: int = 0  # generated tokens (the assistant's vocabulary for a different-tokenizer pair)
    draft_forwards: int = 0
    assistant_forwards: int = 0
    blocks: int = 0  # draft blocks verified
    drafted: int = 0  # draft tokens the assistant checked
    accepted: int = 0  # of them, kept
    replacements: int = 0
    seconds: float = 0.0
    stop: str | None = None  # "eos", the stop string, or None (the token budget)


@dataclass
class Pair:
    draft: Any
    draft_tok: Any
    assistant: Any
    assistant_tok: Any
    shared: bool  # one tokenizer for both
    use_cache: bool = True


@contextlib.contextmanager
def counted(*models):
    """Counts each model's top-level forward calls."""
    counts = [0] * len(models)
    hooks = []
    for i, m in enumerate(models):
        def hook(*_, i=i):
            counts[i] += 1

        hooks.append(m.register_forward_hook(hook))
    try:
        yield counts
    finally:
        for h in hooks:
            h.remove()


def _finish(text: str, stop: tuple[str, ...]) -> tuple[str, str | None]:
    """The text before its earliest stop string, and that string."""
    return cut(text, stop, include_stop=False)


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    draft_tokens: int = 5
    draft_temperature: float = 0.0
    average_weight: float = 0.5  # the assistant's weight in ``average``
    ensemble_weight: float = 0.5  # transformers' ``assistant_ensemble_weight`` (the target's weight)
    seed: int = 0


def _pick(logp: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logp.argmax())
    probs = torch.softmax(logp / temperature, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def _used(tok: Any, ids: list[int], stop: tuple[str, ...]) -> int:
    """Tokens up to the one that completes the first stop string (all of them when none does): what a model that
    stops at the string generates; tokens drafted or accepted past it are work, not output."""
    if not any(stop):
        return len(ids)
    for n in range(1, len(ids) + 1):
        if _finish(decode(tok, ids[:n]), stop)[1] is not None:
            return n
    return len(ids)


def cosd(pair: Pair, prompt: str, decision: Decision, s: Settings) -> Result:
    """Collaborative speculative decoding of one prompt."""
    bridge = (Shared(pair.draft_tok, prompt) if pair.shared
              else Retokenized(pair.draft_tok, pair.assistant_tok, prompt))
    draft, assistant = Stream(pair.draft, pair.use_cache), Stream(pair.assistant, pair.use_cache)
    eos_p, eos_q = eos_ids(pair.draft, pair.draft_tok), eos_ids(pair.assistant, pair.assistant_tok)
    eos_kept = eos_p | eos_q if pair.shared else eos_q
    residual = getattr(decision, "needs_residual", False) and pair.shared
    gen = torch.Generator().manual_seed(s.seed)
    out, committed = Result(""), 0
    began = time.perf_counter()
    with counted(pair.draft, pair.assistant) as calls:
        while committed < s.max_new_tokens:
            ids, xs, pxs, rows = bridge.draft_ids(), [], [], []
            budget = min(s.draft_tokens, s.max_new_tokens - committed)
            while len(xs) < budget or (len(xs) < budget + UTF8_TAIL and bridge.incomplete(ids, xs)):
                row = draft.logprobs(ids + xs, len(ids) + len(xs))[0]
                x = _pick(row, s.draft_temperature, gen)
                xs.append(x)
                pxs.append(float(row[x].exp()))
                rows.append(row)
                if x in eos_p:
                    break
            ended = xs[-1] in eos_p
            view = (bridge.view(xs, pxs) if pair.shared
                    else bridge.view(xs[:-1] if ended else xs, pxs[:-1] if ended else pxs, pxs[-1] if ended else None))
            q_rows = assistant.logprobs(view.ids, view.start)
            keep, token = len(view.xs), None
            if not view.xs:  # the draft wrote nothing the assistant can read: the assistant writes the next token
                token = int(q_rows[0].argmax())
            for t, x in enumerate(view.xs):
                q = q_rows[t].exp()
                y = int(q[:rows[t].shape[-1]].argmax()) if pair.shared else int(q.argmax())  # ids both models have
                top = None
                if residual:
                    n = min(q.shape[-1], rows[t].shape[-1])
                    top = int(torch.relu(q[:n] - rows[t][:n].exp()).argmax())
                qx = float(q[x]) if x < q.shape[-1] else 0.0
                token = decision(Position(x, view.pxs[t], y, float(q[y]), qx, top))
                if token is not None:
                    keep = t
                    break
            end = next((i for i, x in enumerate(view.xs[:keep]) if x in eos_kept), None)
            if end is not None:  # an accepted EOS ends the answer: nothing after it is kept
                keep, token = end + 1, None
            out.blocks += 1
            out.drafted += len(view.xs)
            out.accepted += keep
            out.replacements += token is not None
            written = [] if token is None else [token]
            while written and len(written) <= UTF8_TAIL and bridge.open_character(view, keep, written):
                ahead = view.ids[:view.start + keep] + written
                written.append(int(assistant.logprobs(ahead, len(ahead))[0].argmax()))
            bridge.commit(view, keep, written)
            committed += keep + len(written)
            kept = view.xs[:keep] + written
            if any(t in eos_kept for t in kept):
                out.stop = "eos"
                break
            if _finish(bridge.text(), s.stop)[1] is not None:
                break
        out.draft_forwards, out.assistant_forwards = calls
    out.text, hit = _finish(bridge.text(), s.stop)
    out.stop = out.stop or hit
    if pair.shared:
        out.tokens = _used(pair.draft_tok, bridge.generated(), s.stop)
    else:
        done = out.text + (hit or "")
        out.tokens = len(pair.assistant_tok(done, add_special_tokens=False)["input_ids"]) + (out.stop == "eos")
    out.seconds = time.perf_counter() - began
    return out


def single(model: Any, tok: Any, prompt: str, s: Settings, use_cache: bool = True, role: str = "draft") -> Result:
    """One model alone, greedy: the ``draft`` and ``assistant`` rows (its forwards counted under ``role``)."""
    out, (calls,) = _stepwise([model], tok, prompt, s, use_cache, lambda rows: rows[0])
    if role == "assistant":
        out.assistant_forwards = calls
    else:
        out.draft_forwards = calls
    return out


def average(pair: Pair, prompt: str, s: Settings) -> Result:
    """Token-level probability averaging: both models every step (a shared vocabulary)."""
    if not pair.shared:
        raise ValueError("averaging needs one tokenizer for both models")
    w = s.average_weight

    def mix(rows: list[torch.Tensor]) -> torch.Tensor:
        n = min(r.shape[-1] for r in rows)  # padded output rows past the shared vocabulary are never mixed
        return torch.log((1 - w) * rows[0][:n].exp() + w * rows[1][:n].exp())

    out, calls = _stepwise([pair.draft, pair.assistant], pair.draft_tok, prompt, s, pair.use_cache, mix)
    out.draft_forwards, out.assistant_forwards = calls
    return out


def _stepwise(models, tok, prompt: str, s: Settings, use_cache: bool, combine) -> tuple[Result, list[int]]:
    """Greedy decoding of ``combine`` (the models' next-token log-probabilities -> one row), and each model's
    forward count."""
    streams = [Stream(m, use_cache) for m in models]
    eos = eos_ids(models[0], tok)
    ids = encode(tok, prompt)
    prompt_len, out = len(ids), Result("")
    began = time.perf_counter()
    with counted(*models) as calls:
        while out.tokens < s.max_new_tokens:
            token = int(combine([st.logprobs(ids, len(ids))[0] for st in streams]).argmax())
            ids.append(token)
            out.tokens += 1
            if token in eos:
                out.stop = "eos"
                break
            _, hit = _finish(decode(tok, ids[prompt_len:]), s.stop)
            if hit is not None:
                out.stop = hit
                break
    out.text, hit = _finish(decode(tok, ids[prompt_len:]), s.stop)
    out.stop = out.stop or hit
    out.seconds = time.perf_counter() - began
    return out, calls


def assisted(pair: Pair, prompt: str, s: Settings, ensemble: bool = False) -> Result:
    """transformers' assisted decoding with the assistant as target and the draft as its assistant model: lossless
    greedy speculative decoding, or with ``ensemble`` its lossy verification (``assistant_ensemble_weight``)."""
    tok = pair.assistant_tok
    ids = torch.tensor([encode(tok, prompt)], device=next(pair.assistant.parameters()).device)
    kwargs: dict[str, Any] = dict(assistant_model=pair.draft, do_sample=False, max_new_tokens=s.max_new_tokens,
                                  attention_mask=torch.ones_like(ids),
                                  pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    if ensemble:
        kwargs["assistant_ensemble_weight"] = s.ensemble_weight
    if s.stop:
        from transformers import StoppingCriteriaList

        from llmx.core.eval.generate import StopStrings

        kwargs["stopping_criteria"] = StoppingCriteriaList([StopStrings(tok, ids.shape[1], s.stop)])
    if not pair.shared:
        kwargs.update(tokenizer=tok, assistant_tokenizer=pair.draft_tok)
    # transformers reads the draft length from the assistant model's own generation config: K fixed, no confidence
    # stop (0 also turns off its threshold tuning), on a copy put back afterwards
    own = pair.draft.generation_config
    pair.draft.generation_config = copy.deepcopy(own)
    pair.draft.generation_config.update(num_assistant_tokens=s.draft_tokens, num_assistant_tokens_schedule="constant",
                                        assistant_confidence_threshold=0.0)
    began = time.perf_counter()
    try:
        with counted(pair.draft, pair.assistant) as calls, torch.inference_mode():
            seq = pair.assistant.generate(ids, **kwargs)
    finally:
        pair.draft.generation_config = own
    new = seq[0, ids.shape[1]:].tolist()
    out = Result("", tokens=_used(tok, new, s.stop), draft_forwards=calls[0], assistant_forwards=calls[1])
    eos = eos_ids(pair.assistant, tok)
    out.stop = "eos" if new and new[-1] in eos else None
    out.text, hit = _finish(decode(tok, new), s.stop)
    out.stop = out.stop or hit
    out.seconds = time.perf_counter() - began
    return out
