"""LLaVA's two training stages on the shared loop: stage 1 trains the projector alone (feature alignment on
captions), stage 2 the projector and the language model (visual instruction tuning); the vision tower stays frozen in
both (Liu et al. 2023, §4.2; LLaVA-1.5's ``tune_mm_mlp_adapter`` and ``freeze_vision_tower``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmx.core.data.sampling import EpochOrder
from llmx.core.multimodal.batch import Example, collate
from llmx.core.train.parallel import device_of
from llmx.core.train.sft.batch import labelled_nll

PROJECTOR = "multi_modal_projector"
TOWER = "vision_tower"


def trainable(model: torch.nn.Module, stage: int) -> dict[str, torch.nn.Parameter]:
    """Freeze what ``stage`` does not train; return the trained tensors by name."""
    out = {}
    for name, p in model.named_parameters():
        train = PROJECTOR in name if stage == 1 else TOWER not in name
        p.requires_grad_(train)
        if train:
            out[name] = p
    return out


def cast_projector_input(model: torch.nn.Module) -> None:
    """A frozen half-precision tower feeds a projector upcast to float32 master weights: cast its input (the
    language model takes the projector's output in its own dtype, as LLaVA's forward does)."""
    proj = getattr(model.model, PROJECTOR, None) if hasattr(model, "model") else None
    if proj is None or getattr(proj, "_llmx_cast", False):
        return
    dtype = next(proj.parameters()).dtype
    proj.register_forward_pre_hook(lambda _m, args: tuple(a.to(dtype) if torch.is_tensor(a) else a for a in args))
    proj._llmx_cast = True


def lr_scale(lr: float, projector_lr: float | None) -> Callable[[str], float] | None:
    """LLaVA-1.5's ``mm_projector_lr``: the projector's rate as a multiple of the stage's."""
    if projector_lr is None:
        return None
    return lambda name: projector_lr / lr if PROJECTOR in name else 1.0


def loss_fn(model, items: list[Example], batch_size: int, seed: int, pad_id: int) -> Callable[[int], torch.Tensor]:
    """Micro-batch ``i``'s mean response-token loss, a pure function of ``i`` (exact resume, disjoint DDP shards)."""
    order = EpochOrder(len(items), seed)
    device = device_of(model)

    def loss(i: int) -> torch.Tensor:
        return model(**collate([items[k] for k in order.batch(i, batch_size)], pad_id, device)).loss

    return loss


def weights(items: list[Example], batch_size: int, seed: int) -> Callable[[int], float]:
    """Response tokens of micro-batch ``i``, so a step is the mean over its tokens however it is split."""
    order = EpochOrder(len(items), seed)
    counts = [sum(e.row.trained) for e in items]
    return lambda i: sum(counts[k] for k in order.batch(i, batch_size))


def heldout_loss(model, items: list[Example], pad_id: int, batch_size: int = 16) -> float:
    """Mean NLL per response token over ``items``."""
    device = device_of(model)
    return labelled_nll(model, (collate(items[s:s + batch_size], pad_id, device)
                                for s in range(0, len(items), batch_size)))
