"""One align stage: load and check the data, train the policy (and PIPA's ``g`` head) on an objective with the shared
loop, then measure held-out preference accuracy and drift from the reference. Micro-batch ``i`` holds the rows of
``EpochOrder`` (a seeded permutation per epoch, a pure function of ``i``: exact resume, DDP shards); an objective
with ``kl_pairs`` (KTO) also gets the log-probs of mismatched pairs (``mismatched``)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch

from llmx.core.context import RunContext
from llmx.core.data import holdout
from llmx.core.data.sampling import EpochOrder
from llmx.core.preference import masked_mean, masked_sum
from llmx.core.train.align import batch as B
from llmx.core.train.align import chat
from llmx.core.train.align import data as D
from llmx.core.train.align.params import AlignParams
from llmx.core.train.distributed import is_main
from llmx.core.train.parallel import device_of
from llmx.errors import UsageError


@dataclass
class LogpBatch:
    """Per-token log-probs of a batch. Paired batches hold the chosen rows, then the rejected rows."""

    kind: str
    pi: torch.Tensor
    ref: torch.Tensor | None
    mask: torch.Tensor
    g: torch.Tensor | None = None  # [B] at the prompt's end, or [B, S] at each step's start
    labels: torch.Tensor | None = None  # [B] (unpaired) or [B, S] (step)
    member: torch.Tensor | None = None  # [B, S, T-1] (step)
    step_mask: torch.Tensor | None = None
    kl_pi: torch.Tensor | None = None  # [B] summed log-probs of the rows' mismatched pairs (kl_pairs), no graph
    kl_ref: torch.Tensor | None = None

    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0] // 2
        return x[:n], x[n:]

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        return masked_sum(x, self.mask)

    def means(self, x: torch.Tensor) -> torch.Tensor:
        return masked_mean(x, self.mask)

    def step_sums(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bst,bt->bs", self.member, x * self.mask)


class Objective(Protocol):
    """An align loss. One may also set ``kl_pairs`` (KTO): its batches then carry ``kl_pi`` and ``kl_ref``."""

    kinds: ClassVar[tuple[str, ...]]
    needs_reference: ClassVar[bool]
    g: ClassVar[Literal["answer", "step"] | None]

    def loss(self, b: LogpBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class Batcher:
    """Encodes rows once; ``batch(indices)`` returns the tensors a forward needs."""

    def __init__(self, tok, kind: str, rows: list[D.Example], max_len: int, max_prompt_len: int | None = None):
        self.tok, self.kind, self.rows = tok, kind, rows
        self.encoded = [[self._encode(p, r, max_len, max_prompt_len) for p, r in B.examples_for(kind, ex)]
                        for ex in rows]

    def _encode(self, prompt, response, max_len: int, max_prompt_len: int | None) -> B.Encoded:
        if self.kind == "step":
            return B.encode(self.tok, prompt, response, max_len, max_prompt_len)
        text, reply = chat.render(self.tok, prompt, response)  # conversations as text
        if chat.templated(self.tok, prompt, response):  # the template wrote BOS and (usually) the end of the turn
            reply, ended = B.turn_end(self.tok, reply)
            return B.encode(self.tok, text, reply, max_len, max_prompt_len, eos=not ended, bos=False)
        return B.encode(self.tok, text, reply, max_len, max_prompt_len)

    def truncated(self) -> tuple[int, int]:
        """(rows whose prompt was cut, sequences whose response was cut)."""
        return (sum(e[0].prompt_cut for e in self.encoded),
                sum(x.response_cut for e in self.encoded for x in e))

    def tensors(self, idx: list[int], device: torch.device | str = "cpu") -> tuple[B.Tensors, list[B.Encoded]]:
        if self.kind == "paired":
            items = [self.encoded[i][0] for i in idx] + [self.encoded[i][1] for i in idx]
        else:
            items = [self.encoded[i][0] for i in idx]
        return B.collate(items, self.tok.pad_token_id, device), items


def mismatched(rows: Batcher, perm: list[int], max_len: int) -> Batcher:
    """KTO's KL pairs, as TRL's KL dataset (built once, completions shifted by one row): row ``perm[k]``'s prompt
    with row ``perm[k-1]``'s completion, cut to ``max_len``. ``perm`` is the first epoch's order, so there a batch's
    mismatched completions are (all but one of) its own, as TRL recommends; TRL shifts within chunks of the file's
    order, which in a file grouped by prompt pairs a prompt with its own siblings. Fixed per row, so the reference
    can score them once (``Precomputed``)."""
    if len(rows.rows) < 2:
        raise UsageError("kto's reference point pairs each prompt with another row's completion: it needs at least 2 "
                         "training rows (or reference_point: batch_self)")
    pairs = copy.copy(rows)
    pairs.encoded = list(rows.encoded)
    for k, r in enumerate(perm):
        own, other = rows.encoded[r][0], rows.encoded[perm[k - 1]][0]
        pairs.encoded[r] = [B.Encoded(own.ids[:own.start] + other.ids[other.start:][:max_len - own.start], own.start)]
    return pairs


@torch.no_grad()
def kl_logps(policy, reference, pairs: Batcher, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed policy and reference log-probs of the rows' mismatched pairs, without a graph (TRL's KL forward)."""
    t, _ = pairs.tensors(idx, device_of(policy))
    return masked_sum(B.forward(policy, t)[0], t.response_mask), masked_sum(reference(t, idx), t.response_mask)


def no_dropout(model: torch.nn.Module) -> None:
    """Dropout off in training mode: ``nn.Dropout`` modules (as TRL) and the float rates attention layers read
    themselves (``attention_dropout``, OPT's ``dropout``)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        for name, value in vars(m).items():
            if "dropout" in name and isinstance(value, float):
                setattr(m, name, 0.0)


class Reference:
    """The frozen reference's log-probs: a frozen copy of the policy, or, when the policy trains a LoRA adapter,
    the policy itself with the adapter disabled (no second copy of the weights, as TRL does). ``frozen=False``
    scores with the policy as it is now (used once, before training)."""

    def __init__(self, policy, frozen: bool = True, held: torch.nn.Module | None = None):
        from llmx.core.train.adapters import is_peft

        self.policy = policy
        if held is not None:  # a copy taken before the policy was sharded (fsdp)
            self.copy = held.eval().requires_grad_(False)
        else:
            self.copy = copy.deepcopy(policy).eval().requires_grad_(False) if frozen and not is_peft(policy) else None
        self.adapter = frozen and is_peft(policy)

    @torch.no_grad()
    def __call__(self, t: B.Tensors, idx: list[int] | None = None) -> torch.Tensor:
        if self.copy is not None:
            return B.forward(self.copy, t)[0]
        if self.adapter:
            with self.policy.disable_adapter():
                return B.forward(self.policy, t)[0]
        was = self.policy.training
        self.policy.eval()
        try:
            return B.forward(self.policy, t)[0]
        finally:
            self.policy.train(was)


class Precomputed:
    """Reference log-probs of every sequence of ``rows`` computed once, before training, by ``score`` (the starting
    policy), so no copy of the weights is kept: TRL's ``precompute_ref_log_probs``, and the held-out drift baseline
    of reference-free methods. Looked up by row, so any batch of those rows can be assembled. ``bf16``: scored under
    the bfloat16 autocast the policy's forward it is compared with runs under (the loop's, with precision
    bf16-mixed): at the starting weights the two then agree as far as the batches' padding allows (exactly for
    batches of the same shape), where fp32 scores differ by bf16's rounding. The held-out baseline stays fp32, as
    ``evaluate`` runs the policy."""

    def __init__(self, score: Reference, rows: Batcher, batch_size: int, bf16: bool = False):
        device = device_of(score.policy)
        self.per_item: list[list[torch.Tensor]] = []
        for s in range(0, len(rows.rows), batch_size):
            idx = list(range(s, min(s + batch_size, len(rows.rows))))
            t, items = rows.tensors(idx, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                ref = score(t)
            sides = len(items) // len(idx)
            for k in range(len(idx)):
                self.per_item.append([ref[k + j * len(idx), :len(items[k + j * len(idx)].ids) - 1]
                                      for j in range(sides)])

    def __call__(self, t: B.Tensors, idx: list[int]) -> torch.Tensor:
        sides = len(self.per_item[0])
        pieces = [self.per_item[i][j] for j in range(sides) for i in idx]  # the order of Batcher.tensors
        out = torch.zeros(len(pieces), t.input_ids.shape[1] - 1, device=t.input_ids.device)
        for row, piece in enumerate(pieces):
            out[row, :len(piece)] = piece
        return out


def logps(policy, reference: Reference, g_head, batcher: Batcher, idx: list[int], objective: Objective) -> LogpBatch:
    device = device_of(policy)
    t, items = batcher.tensors(idx, device)
    pi, hidden = B.forward(policy, t, hidden=objective.g is not None)
    ref = reference(t, idx) if objective.needs_reference else None
    b = LogpBatch(batcher.kind, pi, ref, t.response_mask)
    rows = [batcher.rows[i] for i in idx]
    if batcher.kind == "unpaired":
        b.labels = torch.tensor([float(r.label) for r in rows], device=device)
    if batcher.kind == "step":
        b.member, b.step_mask = B.step_matrix(items, t.input_ids.shape[1], device)
        steps = b.step_mask.shape[1]
        b.labels = torch.tensor([[float(v) for v in r.step_labels[:steps]] + [0.0] * (steps - len(r.step_labels[:steps]))
                                 for r in rows], device=device)
    if objective.g == "answer":
        n = len(idx)
        at = hidden[torch.arange(n, device=device), t.prompt_end[:n]]
        with torch.autocast(device.type, enabled=False):  # the g head stays in fp32 under bf16-mixed
            b.g = g_head(at.float()).squeeze(-1)
    elif objective.g == "step":
        steps = b.member.shape[1]
        starts = torch.tensor([[a - 1 for a, _ in e.step_bounds] + [0] * (steps - len(e.step_bounds)) for e in items],
                              dtype=torch.long, device=device)
        at = hidden[torch.arange(len(idx), device=device)[:, None], starts]
        with torch.autocast(device.type, enabled=False):
            b.g = g_head(at.float()).squeeze(-1)
    return b


MIN_HELDOUT = 10  # fewer automatically held-out rows than this: the held-out figures get a warning


def run(ctx: RunContext, p: AlignParams, objective: Objective, name: str) -> dict[str, Any]:
    from llmx.core.train.adapters import is_peft
    from llmx.core.train.stage import finish, fit, prepare, trainable

    kind, rows = D.load(p.data)
    if kind not in objective.kinds:
        raise UsageError(f"{name} trains on {' or '.join(objective.kinds)} data; {p.data} holds {kind} rows")
    if p.eval_data:
        eval_kind, held = D.load(p.eval_data)
        if eval_kind != kind:
            raise UsageError(f"{p.eval_data} holds {eval_kind} rows; {p.data} holds {kind} rows")
        train_rows = rows
    else:
        train_rows, held = holdout(rows, key=lambda r: r.prompt)  # no prompt on both sides of the split
    if not train_rows:
        raise UsageError(f"{p.data}: every row's prompt falls in the held-out split (10% of the prompts, by hash); "
                         "pass eval_data, or use more distinct prompts")
    if not p.eval_data and len(held) < MIN_HELDOUT:
        ctx.log.warning("held-out split of %s: %d of %d rows (10%% of the prompts, by hash), too few for the held-out "
                        "figures to mean much; pass eval_data for a held-out set of its own", p.data, len(held),
                        len(rows))
    if p.eval_data and (shared := {r.prompt for r in train_rows} & {r.prompt for r in held}):
        ctx.log.warning("%d prompts appear in both %s and %s: held-out figures are not clean", len(shared), p.data,
                        p.eval_data)
    tok = ctx.tokenizer
    unsharded = None
    if p.strategy == "fsdp" and objective.needs_reference and not p.precompute_ref_log_probs and \
            p.adapter != "lora" and not is_peft(ctx.model):  # copied in CPU memory, sharded with the policy in fit
        unsharded = copy.deepcopy(ctx.model)
    policy = prepare(ctx, ctx.model, p)
    if p.disable_dropout:
        no_dropout(policy)
    device = device_of(policy)
    g_head = torch.nn.Linear(policy.config.hidden_size, 1).to(device) if objective.g else None
    train_b = Batcher(tok, kind, train_rows, p.max_len, p.max_prompt_length)
    held_b = Batcher(tok, kind, held, p.max_len, p.max_prompt_length) if held else None
    cut_prompts, cut_responses = train_b.truncated()
    if cut_prompts or cut_responses:
        ctx.log.warning("truncated %d of %d prompts from the left (max_prompt_length %s) and %d responses from the "
                        "right (max_len %d)", cut_prompts, len(train_rows), p.max_prompt_length or p.max_len // 2,
                        cut_responses, p.max_len)
    start = Reference(policy, frozen=False)  # the policy as it is before training
    mixed = p.precision == "bf16-mixed"  # the loss runs under the loop's autocast; evaluate() under none
    if objective.needs_reference and not p.precompute_ref_log_probs:
        reference = held_reference = Reference(policy, held=unsharded)  # the loss's p0 and the drift baseline
    else:  # precomputed, or reference-free: no copy of the weights, the starting policy's log-probs
        reference = Precomputed(start, train_b, p.batch_size, bf16=mixed) if objective.needs_reference else None
        held_reference = Precomputed(start, held_b, p.batch_size) if held_b else None
    order = EpochOrder(len(train_rows), ctx.config.seed)  # reshuffled every epoch
    pairs = pairs_reference = None
    if getattr(objective, "kl_pairs", False):
        pairs = mismatched(train_b, order.perm(0), p.max_len)
        pairs_reference = reference if isinstance(reference, Reference) else Precomputed(start, pairs, p.batch_size,
                                                                                          bf16=mixed)

    def loss(i: int):  # a pure function of i (exact resume, DDP shards)
        idx = order.batch(i, p.batch_size)
        kl = kl_logps(policy, pairs_reference, pairs, idx) if pairs is not None else (None, None)  # before the graph
        b = logps(policy, reference, g_head, train_b, idx, objective)
        b.kl_pi, b.kl_ref = kl
        value, stats = objective.loss(b)
        return value.mean(), {k: v.float().mean() for k, v in stats.items()}

    params = trainable(policy)
    if g_head is not None:
        params.update({f"g_head.{k}": v for k, v in g_head.named_parameters()})
    ref_copy = reference.copy if isinstance(reference, Reference) else None  # sharded with the policy under fsdp
    result = fit(ctx, policy, loss, p, params=params, extras={"g_head": g_head} if g_head is not None else None,
                 frozen=[ref_copy] if ref_copy is not None else None)
    out = {"data_kind": kind, "train_rows": len(train_rows), "eval_rows": len(held), "prompts_truncated": cut_prompts,
           "responses_truncated": cut_responses}
    if held:
        out.update(evaluate(policy, held_reference, held_b, p.batch_size))
    else:
        ctx.log.warning("no held-out rows (pass eval_data): held-out figures are not measured")
    out.update(finish(ctx, policy, p, name, result))
    if p.save and g_head is not None:
        from safetensors.torch import save_file

        from llmx.core import atomic
        from llmx.core.train.parallel import full

        head = {k: full(v).detach().cpu() for k, v in g_head.state_dict().items()}  # every rank: fsdp gathers
        if is_main():
            target = ctx.artifact("g_head.safetensors")
            save_file(head, str(target))
            atomic.conform(target)
    return out


class _EvalView:
    """What evaluation needs from a batch: policy and reference log-probs, no g head."""

    kinds, needs_reference, g = ("paired", "unpaired", "step"), True, None


@torch.no_grad()
def evaluate(policy, reference, held: Batcher, batch_size: int) -> dict[str, float]:
    """Held-out figures: how often the policy moved toward the preferred response relative to the reference
    (paired: the implicit reward margin is positive; unpaired / step: its sign matches the label), and the mean
    per-token log-ratio to the reference on the held-out responses (a drift measure)."""
    policy.eval()
    right = total = 0
    drift, tokens = 0.0, 0.0

    for s in range(0, len(held.rows), batch_size):
        idx = list(range(s, min(s + batch_size, len(held.rows))))
        b = logps(policy, reference, None, held, idx, _EvalView())
        ratio = b.pi - b.ref
        drift += float((ratio * b.mask).sum())
        tokens += float(b.mask.sum())
        r = b.sums(ratio)
        if b.kind == "paired":
            w, lose = b.halves(r)
            right += int((w > lose).sum())
            total += len(w)
        elif b.kind == "unpaired":
            right += int(((r > 0).float() == b.labels).sum())
            total += len(r)
        else:
            steps = b.step_sums(ratio)
            right += int((((steps > 0).float() == b.labels) * b.step_mask).sum())
            total += int(b.step_mask.sum())
    return {"heldout_pref_accuracy": right / max(total, 1), "heldout_logratio_per_token": drift / max(tokens, 1)}
