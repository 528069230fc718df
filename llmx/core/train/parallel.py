"""Data parallelism on torch's own engines, chosen by a stage's ``strategy``:

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (gradients all-reduced in buckets, overlapped with the
  backward). A stage's loss calls the model itself, so the engine is put *inside* the model's call: the model's
  ``forward`` is, for the run, the DDP wrapper's (which runs the class's forward on the model), and ``release``
  takes it off again, leaving the plain model for the stages that follow.
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``), one unit per decoder block, one for the input
  embeddings (untied) and one for the rest; with
  ``precision: bf16-mixed`` parameters are gathered in bfloat16 and gradients reduced in float32
  (``MixedPrecisionPolicy``), with ``offload`` the shards live in CPU memory (``CPUOffloadPolicy``). FSDP2 works in
  place, so the model's own call is the engine's.

Both average gradients over the processes; the loop pre-scales each micro-batch's share by the world size so a
step stays the weighted mean of its micro-batches (``core/train/loop.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from llmx.core.train.distributed import world
from llmx.errors import UsageError


class _Forward(torch.nn.Module):
    """The model's class forward run on the model: what DDP wraps (the model's own ``forward`` attribute becomes the
    DDP wrapper, so calling the model runs DDP, which runs this, which runs the class's forward)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self._forward = type(model).forward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward(self.model, *args, **kwargs)


@dataclass
class Engine:
    """What wrapping did, for the loop (gradient sync per micro-batch) and for ``release``."""

    strategy: str = "none"
    ddp: list[torch.nn.parallel.DistributedDataParallel] = field(default_factory=list)
    sharded: list[torch.nn.Module] = field(default_factory=list)  # fully_shard roots
    wrapped: list[torch.nn.Module] = field(default_factory=list)  # models whose forward is a DDP wrapper
    trains: list[torch.nn.Module] = field(default_factory=list)  # every module whose gradients the engine reduces

    def check(self, named: dict[str, torch.nn.Parameter]) -> None:
        """Every trained tensor belongs to a module under the engine (else no process would reduce its gradient)."""
        held = {id(t) for m in self.trains for t in m.parameters()}
        outside = [k for k, t in named.items() if id(t) not in held]
        if outside:
            raise UsageError(f"{outside[0]} trains outside the model, so no data-parallel engine reduces its "
                             "gradients; this stage runs in one process")

    @property
    def averages(self) -> bool:
        """Whether the engine divides the summed gradients by the world size."""
        return bool(self.ddp or self.sharded) and world()[1] > 1

    @contextmanager
    def sync(self, on: bool) -> Iterator[None]:
        """Under DDP, gradients of the backward inside are all-reduced (``on``) or only accumulated locally (all
        micro-batches of a step but its last). FSDP reduce-scatters every micro-batch: its gradients then accumulate
        as shards (skipping the sync would hold every parameter's whole gradient between micro-batches)."""
        with ExitStack() as stack:
            if not on:
                for d in self.ddp:
                    stack.enter_context(d.no_sync())
            yield

    def release(self) -> None:
        """Take DDP off the models (their class forward again); FSDP2's shards stay (the stage hands on a reloaded
        model)."""
        for m in self.wrapped:
            m.__dict__.pop("forward", None)
        self.wrapped.clear()
        self.ddp.clear()


def units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """What FSDP shards one unit each, the root aside: every decoder block (of the text model, for a multimodal
    one) and, when not tied to the output head, the input embeddings (so a loss may call them directly, as CROW's
    does)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(config, "num_hidden_layers", None)
    blocks = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)
    if blocks is None:
        raise UsageError(f"strategy fsdp: {type(model).__name__} has no list of {n} decoder blocks to shard")
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = embed is not None and head is not None and head.weight is embed.weight
    return [*blocks, *([embed] if embed is not None and not tied else [])]


def wrap(model: torch.nn.Module, strategy: str, precision: str = "fp32", offload: bool = False,
         extras: dict[str, torch.nn.Module] | None = None, frozen: list[torch.nn.Module] | None = None,
         unused: bool = False) -> Engine:
    """Put ``model`` (and ``extras``, trained modules beside it such as PIPA's g head, kept in float32) under the
    engine, in place. ``frozen``: models that only score (a DPO reference copy), sharded like the policy under fsdp.
    ``unused``: a micro-batch may leave some trained tensors without a gradient (DDP then looks for them: LLaVA's
    projector on a text-only batch)."""
    rank, size = world()
    trains = [model, *(extras or {}).values()]
    engine = Engine(strategy, trains=trains)
    if strategy == "ddp":
        if size == 1:
            return engine
        for m in trains:
            if not any(p.requires_grad for p in m.parameters()):
                continue
            device = next(m.parameters()).device
            ids = [device.index] if device.type == "cuda" else None
            ddp = torch.nn.parallel.DistributedDataParallel(_Forward(m), device_ids=ids, broadcast_buffers=False,
                                                            find_unused_parameters=unused)
            m.__dict__["forward"] = ddp  # not a submodule: calling the model runs DDP (``release`` deletes it)
            engine.ddp.append(ddp)
            engine.wrapped.append(m)
        return engine
    if strategy != "fsdp":
        raise UsageError(f"unknown strategy {strategy!r} (ddp or fsdp)")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = device_of(model)
    for m in [model, *(frozen or [])]:
        if not is_sharded(m):  # a frozen copy in float32 as its policy, so both score alike at the start
            shard(m, device, precision, offload, every=m is not model)
    engine.sharded.append(model)
    if unused:  # a rank whose micro-batch leaves a tensor without a gradient still joins its reduce-scatter
        for m in model.modules():
            if hasattr(m, "set_reduce_scatter_unused_params"):
                m.set_reduce_scatter_unused_params(True)
            elif hasattr(m, "reshard") and hasattr(m, "set_requires_gradient_sync"):
                raise UsageError("strategy fsdp: this torch cannot reduce-scatter unused gradients, which this stage "
                                 "needs (use strategy: ddp, or a newer torch)")
    for m in (extras or {}).values():  # small heads the stage computes in float32
        fully_shard(m, **{**_options(device, precision, offload), "mp_policy": MixedPrecisionPolicy()})
        m.__dict__["_llmx_device"] = device
        engine.sharded.append(m)
    return engine


def _options(device: torch.device | str, precision: str, offload: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    if not torch.distributed.is_initialized():
        raise UsageError("strategy fsdp runs under torchrun (a process group), even for one process: "
                         "torchrun --nproc-per-node 1 -m llmx ...")
    mesh = init_device_mesh(torch.device(device).type, (world()[1],))
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    return dict(mesh=mesh, mp_policy=mixed, offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy())


def shard(model: torch.nn.Module, device: torch.device | str, precision: str = "fp32", offload: bool = False,
          every: bool = False) -> None:
    """FSDP2 on ``model``, unit by unit (``units``, then the root): each unit's trained tensors (``every``: all its
    floating tensors) become float32 master weights and its tensors move to ``device`` as they are sharded, so a
    model loaded in CPU memory reaches the device one unit at a time and never whole."""
    from torch.distributed.fsdp import fully_shard

    options = _options(device, precision, offload)

    def master(m: torch.nn.Module) -> None:
        for p in m.parameters():
            if (p.requires_grad or every) and p.is_floating_point() and p.dtype != torch.float32 \
                    and not hasattr(p, "device_mesh"):
                p.data = p.data.float()

    for unit in units(model):
        master(unit)
        fully_shard(unit, **options)
    master(model)
    fully_shard(model, **options)
    model.__dict__["_llmx_device"] = torch.device(device)  # where it computes (``device_of``)
    # the root is whichever unit runs first: settle it now, so a loss that calls the embeddings before the model
    # (CROW) does not make them the root (FSDP2 has no public call for this)
    fully_shard.state(model)._lazy_init()
    model.register_forward_hook(_reshard_unless_training)


def _reshard_unless_training(module: torch.nn.Module, args: Any, output: Any) -> None:
    """FSDP2 keeps the root gathered after its forward, for the backward that follows; a forward without a graph
    (an evaluation, a reference's scores, a generated token) has none: reshard it, so its whole tensors (the head)
    are not held until the next step's backward."""
    if not torch.is_grad_enabled():
        module.reshard()


def resolve(named: dict[str, torch.nn.Parameter], model: torch.nn.Module,
            extras: dict[str, torch.nn.Module] | None = None) -> dict[str, torch.nn.Parameter]:
    """The trained tensors by the same names after wrapping (FSDP2 replaces each parameter with its sharded one):
    a name is the model's parameter name, or an extra module's prefixed by its key."""
    current = dict(model.named_parameters())
    for prefix, m in (extras or {}).items():
        current.update({f"{prefix}.{k}": v for k, v in m.named_parameters()})
    lost = [k for k in named if k not in current]
    if lost:
        raise UsageError(f"strategy fsdp: the trained tensor {lost[0]} is not a parameter of the model; this stage "
                         "cannot shard (use strategy: ddp)")
    return {k: current[k] for k in named}


def full(t: torch.Tensor) -> torch.Tensor:
    """A tensor whole: a sharded (DTensor) one gathered from every rank (a collective: every rank calls it)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def device_of(model: torch.nn.Module) -> torch.device:
    """The device ``model`` computes on: the one it was sharded onto (under ``offload`` its shards sit in CPU memory
    while its forward runs on the GPU), else its first tensor's."""
    return model.__dict__.get("_llmx_device") or next(model.parameters()).device


def is_sharded(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())
