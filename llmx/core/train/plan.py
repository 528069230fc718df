"""Per-rank memory of a training stage, planned before launch from the model's config and the stage's params: the
model is built on the meta device (``llmx.core.models.meta``), so parameter counts, trained tensors (a LoRA adapter's
exactly, through PEFT) and FSDP shards are exact, and nothing is allocated.

Parts, each in device or CPU bytes (``offload``: FSDP's shards live in CPU memory):

* weights: trained tensors as float32 master weights (either precision); a LoRA adapter's frozen base in the loaded
  dtype. ``fsdp``: every tensor sharded on dim 0 over the world (FSDP2 ``fully_shard``, padded to equal shards).
* gradients: float32, one per trained element (sharded under ``fsdp``). optimizer: AdamW's two float32 moments.
* reference: align methods whose loss reads a frozen reference keep a copy of the policy's weights, placed as they
  are, unless ``precompute_ref_log_probs``; a LoRA policy's reference is itself with the adapter disabled: nothing.
* activations: one micro-batch (``batch_size`` examples, two sequences each for paired align data, ``max length``
  tokens each) by a per-layer inventory of the tensors autograd saves, Korthikanti et al. 2022 ("Reducing Activation
  Recomputation in Large Transformer Models", sec. 4.1) redone for transformers' pre-norm decoder: RMSNorm's float32
  upcast, GQA keys and values repeated to every head (sdpa with a padding mask), SDPA's log-sum-exp instead of the
  ``a s^2`` scores (kept for ``eager`` attention), a SwiGLU MLP (gate, up, SiLU and product) or a plain one, no
  dropout masks (dropout 0), and for MoE layers the top-k experts' tensors per token. ``gradient_checkpointing``:
  each layer keeps its input, and one layer is recomputed at a time.
* logits: ``[B, T, V]`` in the compute dtype and its gradient, plus one float32 chunk for align's chunked
  selective log-softmax (``llmx.core.logprobs``); transformers' causal-LM loss (lm, sft and the stages built on
  them) keeps a float32 log-softmax of ``[B, T, V]``, its gradient and the gradient of its input.
* collectives: ``fsdp`` (``llmx.core.train.parallel``: a unit per decoder layer, one for untied input embeddings,
  the root for the rest): the root (head, final norm) gathered for the whole step with its unsharded gradients, the
  two largest other units gathered (the current one and the prefetched one) in the param dtype, and one unit's
  unsharded float32 gradients before the reduce-scatter; ``ddp`` over several processes: DDP's gradient
  buckets (a second float32 copy of the gradients, torch's default ``gradient_as_bucket_view=False``).
* casts: ``bf16-mixed`` under ``ddp`` (autocast over float32 weights): the bfloat16 copy of every matmul weight,
  saved for the backward. ``fsdp`` gathers in bfloat16 instead.
* step: AdamW's temporaries at the optimizer step: a float32 copy of the trained tensors (foreach, the CUDA
  default), or of the largest two tensors (the single-tensor loop, a CPU's).

``total`` sums the parts (a bound); ``peak`` follows the phases: what is held through the step, plus the larger of
one micro-batch's forward and backward (with the head's gradients, the first the backward makes; all gradients
when micro-batches accumulate) and the optimizer step (every gradient and the step's temporaries).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmx.errors import UsageError

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Align objectives as their classes declare them (tests/test_plan.py checks this table against them): sequences per
# example (a pair's chosen and rejected rows share the micro-batch; pipa is planned on pairs, its largest kind) and
# whether the loss reads a frozen reference. An align method not listed is planned as paired with a reference.
ALIGN: dict[str, tuple[int, Callable[[Any], bool]]] = {
    "dpo": (2, lambda p: True), "ipo": (2, lambda p: True), "kto": (1, lambda p: True),
    "simpo": (2, lambda p: False), "pipa": (2, lambda p: True), "confpo": (2, lambda p: p.base == "dpo"),
    "prosec": (2, lambda p: p.loss == "dpo"),
}
LENGTH_FIELDS = ("max_len", "max_length", "seq_len", "train_len")  # the stage's tokens per sequence, first set wins
PHASES = ("static", "forward", "gradients", "step", "load")


@dataclass(frozen=True)
class Part:
    name: str
    device: int
    cpu: int
    phase: str  # static: held through the step; forward: one micro-batch; gradients; step: the optimizer step;
    # load: before training only (fsdp: the model in CPU memory until it is sharded)
    note: str


@dataclass(frozen=True)
class Plan:
    """One rank's memory for one training stage."""

    parameters: int
    trainable: int
    world_size: int
    strategy: str
    precision: str
    adapter: str
    gradient_checkpointing: bool
    sequences: int  # per micro-batch
    length: int
    reference: bool
    parts: tuple[Part, ...]
    early_gradients: tuple[int, int]  # (device, cpu) gradient bytes the backward makes before activations are freed
    notes: tuple[str, ...] = field(default_factory=tuple)

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def total(self) -> tuple[int, int]:
        return sum(p.device for p in self.parts), sum(p.cpu for p in self.parts)

    def peak(self) -> tuple[int, int]:
        def at(where: int) -> int:
            phase = {ph: sum((p.device, p.cpu)[where] for p in self.parts if p.phase == ph) for ph in PHASES}
            backward = phase["forward"] + self.early_gradients[where]
            return max(phase["load"], phase["static"] + max(backward, phase["gradients"] + phase["step"]))

        return at(0), at(1)

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("parameters", "trainable", "world_size", "strategy", "precision",
                                              "adapter", "gradient_checkpointing", "sequences", "length",
                                              "reference")}
        out["parts"] = {p.name: {"device": p.device, "cpu": p.cpu, "phase": p.phase, "note": p.note} for p in self.parts}
        out["total"] = dict(zip(("device", "cpu"), self.total(), strict=True))
        out["peak"] = dict(zip(("device", "cpu"), self.peak(), strict=True))
        out["notes"] = list(self.notes)
        return out


def stage_shape(method: str | None, params: Any) -> tuple[int, bool, str, int]:
    """(sequences per example, whether a frozen reference copy is kept, the loss path, tokens per sequence)."""
    from llmx.core.train.align.params import AlignParams

    length = next((getattr(params, f) for f in LENGTH_FIELDS if getattr(params, f, None)), None)
    if length is None:
        raise UsageError(f"{method or type(params).__name__}: no sequence length among its params "
                         f"({', '.join(LENGTH_FIELDS)}) to plan activations from")
    if not isinstance(params, AlignParams):
        return 1, False, "cross-entropy", length
    sequences, reads = ALIGN.get(method or "", (2, lambda p: True))
    reference = reads(params) and not params.precompute_ref_log_probs and params.adapter != "lora"
    return sequences, reference, "selective", length


def plan_stage(config: Any, params: Any, world_size: int = 1, method: str | None = None, dtype: str = "float32",
               foreach: bool = True) -> Plan:
    """Plan one rank of a training stage: ``config`` a transformers config, ``params`` the stage's params (a
    ``LoopParams``), ``method`` its name (align methods differ in data and reference), ``dtype`` the dtype the model
    is loaded in (a LoRA base stays in it), ``foreach`` whether AdamW runs its foreach path (CUDA) or per tensor."""
    from llmx.core.models.blocks import decoder_blocks
    from llmx.core.models.meta import meta_model

    if world_size < 1:
        raise UsageError(f"world size must be at least 1, not {world_size}")
    if not hasattr(config, "num_attention_heads"):
        raise UsageError(f"{config.model_type}: activations are planned for attention decoders only")
    lora = getattr(params, "adapter", "none") == "lora"
    model = meta_model(config, params.lora if lora else None)
    if not lora:
        model.requires_grad_(True)
    per_example, reference, loss, length = stage_shape(method, params)
    sequences = per_example * params.batch_size
    fsdp, offload, mixed = params.strategy == "fsdp", params.offload, params.precision == "bf16-mixed"
    loaded = DTYPE_BYTES[dtype]

    def shard(t) -> int:  # FSDP2 shards dim 0, padded to equal shards
        if not fsdp or t.dim() == 0:
            return t.numel()
        return math.ceil(t.shape[0] / world_size) * (t.numel() // max(t.shape[0], 1))

    def gathered(t) -> int:  # bytes of a tensor unsharded for compute under fsdp
        return t.numel() * (2 if mixed else 4 if t.requires_grad else loaded)

    tensors = dict(model.named_parameters())
    trained = {n: t for n, t in tensors.items() if t.requires_grad}
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    units = [list(b.parameters()) for b in decoder_blocks(model)] + ([] if tied else [[embed]])  # FSDP units
    in_unit = {id(t) for u in units for t in u}
    root = [t for t in tensors.values() if id(t) not in in_unit]

    weights = sum(shard(t) * (4 if t.requires_grad else loaded) for t in tensors.values())
    grads = 4 * sum(shard(t) for t in trained.values())
    moments = 2 * grads
    place = (lambda b: (0, b)) if offload else (lambda b: (b, 0))
    parts = [Part("weights", *place(weights), "static", "float32 trained" + ("; frozen base " + dtype if lora else "")),
             Part("gradients", *place(grads), "gradients", "float32"),
             Part("optimizer", *place(moments), "static", "AdamW: two float32 moments"),
             Part("reference", *place(weights if reference else 0), "static",
                  "frozen copy of the policy" if reference else _no_reference(method, params, lora))]

    acts = activation_bytes(config, model, sequences, length, params.precision, params.strategy,
                            params.gradient_checkpointing)
    compute = 2 if mixed else 4
    tokens, vocab = sequences * length, config.vocab_size
    if loss == "selective":
        from llmx.core.logprobs import CHUNK_ELEMENTS

        logits = 2 * compute * tokens * vocab + 4 * min(tokens * vocab, CHUNK_ELEMENTS)
        logits_note = "logits and their gradient, one float32 chunk"
    else:
        logits = 12 * tokens * vocab
        logits_note = "float32 log-softmax, its gradient and its input's"
    parts += [Part("activations", acts, 0, "forward", f"{sequences} x {length} tokens"
                   + (", checkpointed" if params.gradient_checkpointing else "")),
              Part("logits", logits, 0, "forward", logits_note)]

    root_trained = 4 * sum(t.numel() for t in root if t.requires_grad)
    if fsdp:
        two = sum(sorted((sum(gathered(t) for t in u) for u in units), reverse=True)[:2])
        unit_grads = max(4 * sum(t.numel() for t in u if t.requires_grad) for u in units)
        root_bytes = sum(gathered(t) for t in root)
        comm = root_bytes + root_trained * compute // 4 + two + unit_grads
        parts.append(Part("collectives", comm, 0, "forward", "FSDP all-gathers: root unit, two largest units"))
        early = (0, 0)
    else:
        buckets = grads if world_size > 1 else 0
        parts.append(Part("collectives", buckets, 0, "static", "DDP gradient buckets" if buckets else "none"))
        early = place(root_trained)
    casts = 0
    if mixed and not fsdp:
        casts = 2 * sum(t.numel() for t in tensors.values()
                        if t.dim() >= 2 and (tied or t is not embed) and (t.requires_grad or loaded == 4))
    parts.append(Part("casts", casts, 0, "forward", "autocast bfloat16 weight copies" if casts else "none"))
    foreach = foreach and not offload  # an offloaded step runs on the CPU, per tensor
    step = 4 * (sum(shard(t) for t in trained.values()) if foreach
                else sum(sorted((shard(t) for t in trained.values()), reverse=True)[:2]))
    parts.append(Part("step", *place(step), "step", "AdamW " + ("foreach" if foreach else "per-tensor")
                      + " temporaries"))

    if fsdp:  # parallel.shard: each process loads the model (and a reference's copy) in CPU memory, then shards it
        whole = sum(t.numel() for t in tensors.values()) * loaded * (2 if reference else 1)
        parts.append(Part("loading", 0, whole, "load", f"the model in {dtype} in CPU memory until sharded"))
    notes = []
    if method not in ALIGN and per_example == 2:
        notes.append(f"{method}: planned as paired data with a frozen reference")
    return Plan(parameters=sum(t.numel() for t in tensors.values()), trainable=sum(t.numel() for t in trained.values()),
                world_size=world_size, strategy=params.strategy, precision=params.precision,
                adapter="lora" if lora else "none", gradient_checkpointing=params.gradient_checkpointing,
                sequences=sequences, length=length, reference=reference, parts=tuple(parts),
                early_gradients=early, notes=tuple(notes))


def _no_reference(method: str | None, params: Any, lora: bool) -> str:
    from llmx.core.train.align.params import AlignParams

    if not isinstance(params, AlignParams):
        return "none"
    if lora:
        return "the policy with its adapter disabled"
    return "precomputed log-probs" if params.precompute_ref_log_probs else "reference-free loss"


def activation_bytes(config: Any, model: Any, sequences: int, length: int, precision: str, strategy: str,
                     checkpointing: bool) -> int:
    """Bytes autograd keeps for one micro-batch of ``sequences`` rows of ``length`` tokens (module docstring)."""
    from llmx.core.models.blocks import decoder_blocks

    d, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    q, kv = heads * head_dim, (heads if kv_heads < heads else kv_heads) * head_dim  # GQA: repeated to every head
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None) or 1
    top_k = getattr(config, "num_experts_per_tok", 1) if experts > 1 else 1
    f = (getattr(config, "moe_intermediate_size", None) if experts > 1 else None) or \
        getattr(config, "intermediate_size", None) or getattr(config, "ffn_dim", None) or \
        getattr(config, "n_inner", None) or 4 * d
    block = decoder_blocks(model)[0]
    ffn = sum(t.numel() for n, t in block.named_parameters() if t.dim() >= 2 and "attn" not in n
              and "attention" not in n and "lora_" not in n)
    gated = ffn >= 2.5 * d * f * experts
    attn_in, attn_out, mlp_in, mlp_out = _training_linears(block)
    experts_train = experts > 1 and any(t.requires_grad for n, t in block.named_parameters() if "experts" in n)

    mixed = precision == "bf16-mixed"
    r = 2 if mixed and strategy == "fsdp" else 4  # the residual stream: bfloat16 only where FSDP gathers bf16
    c = 2 if mixed else 4  # matmul inputs and outputs
    casts = mixed and strategy != "fsdp"  # autocast: each linear saves its own bf16 copy of a float32 input

    def norm(training: int) -> int:  # RMSNorm: float32 input and normalised copy, its cast, what the linears save
        saved = (training * c * d if casts else r * d) if training else 0
        return 8 * d + (r * d if r != 4 else 0) + saved

    qkv = c * (q + 2 * kv) + c * q * attn_out  # the rotated q and k, v, and o_proj's input where o_proj trains
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        attention = qkv + 4 * heads * length + (c * heads * length if c != 4 else 0)  # float32 softmax, its cast
    else:
        attention = qkv + c * q + 4 * heads  # SDPA's output and log-sum-exp
    if experts > 1:  # per routed token: its copy, gate|up, SiLU, product (where the experts train), output
        routed = c * (2 * d + 4 * f) if experts_train else c * (d + 3 * f)
        mlp = norm(1 + mlp_in) + top_k * routed + 12 * experts
    else:  # gate and up (SwiGLU), the activation, the product where down_proj trains
        mlp = norm(mlp_in) + (3 * c * f if gated else c * f) + c * f * mlp_out
    layer = norm(attn_in) + attention + mlp
    tokens = sequences * length
    kept = layers * r * d + layer if checkpointing else layers * layer
    mask = sequences * length * length  # the boolean [B, 1, T, T] padding mask, once per forward
    return tokens * (kept + norm(1)) + mask


def _training_linears(block: Any) -> tuple[int, int, int, int]:
    """How many linears train (a weight or a LoRA adapter with a gradient) among a decoder layer's attention inputs,
    attention output, MLP inputs and MLP output: autograd keeps a linear's input only for its weight's gradient. A
    role's last linear (in registration order: o_proj, down_proj, fc2) is its output."""
    roles: dict[bool, list[bool]] = {True: [], False: []}
    for name, m in block.named_modules():
        if "lora_" in name or name.endswith("base_layer") or not (hasattr(m, "base_layer") or _linear(m)):
            continue
        roles["attn" in name or "attention" in name].append(any(t.requires_grad for t in m.parameters()))
    (*a_in, a_out), (*m_in, m_out) = roles[True] or [False], roles[False] or [False]
    return sum(a_in), int(a_out), sum(m_in), int(m_out)


def _linear(m: Any) -> bool:
    import torch

    return isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"  # GPT-2's transposed linear


def plan_run(run: Any, world_size: int = 1) -> list[tuple[Any, Plan]]:
    """``(stage, plan)`` for every training stage of a resolved run (``ResolvedRun``), all on the run's model as
    configured (a stage that changes the architecture, such as upcycling, is not followed)."""
    from llmx.core.models.meta import model_config, request_config
    from llmx.core.spec import Stage
    from llmx.core.train.params import LoopParams

    stages = [s for s in run.stages if s.stage in (Stage.TRAIN, Stage.ALIGN) and isinstance(s.params, LoopParams)]
    if not stages:
        return []
    name = run.config.model
    if name is None:
        from llmx.core.models import no_model_error

        raise no_model_error()
    built = run.zoo is not None and name == f"ref:{run.zoo.name}"  # the recipe's own zoo entry, maybe unbuilt yet
    config = request_config(run.zoo) if built else model_config(name)
    return [(s, plan_stage(config, s.params, world_size, s.spec.name, run.config.dtype,
                           foreach=run.config.device != "cpu")) for s in stages]
