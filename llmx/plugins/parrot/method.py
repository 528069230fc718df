"""``llmx train --method parrot``: LLaVA's stage on the shared loop (``core/multimodal/stage``) with Parrot's MoE as
the model's visual adapter (``core/multimodal/adapter``: the text embeddings, the question mask and ``inputs_embeds``
into the real ``LlavaForConditionalGeneration``). A model whose processor drops CLS (llava-hf's ``default``
strategy, 576 tokens for CLIP-L/336) is switched to ``full`` (577) by stage 1, which retrains the projector with it
(the MoE's query is the CLS token); stage 2 refuses the switch, which would feed CLS to a projector trained without
it."""

from __future__ import annotations

import json
from typing import Any

import torch

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.core.multimodal.model import vision_language
from llmx.errors import UsageError
from llmx.plugins.parrot.config import ParrotTrainParams
from llmx.plugins.parrot.moe import MultilingualMoE, projector_type
from llmx.plugins.parrot.routing import metrics


def keep_cls(model, proc, stage: int) -> bool:
    """Switch a ``default``-strategy model and its processor to ``full`` (1 + P image tokens) for stage 1, which
    retrains the projector on it; True if it switched. Stage 2 would feed CLS to a projector trained without it."""
    if model.config.vision_feature_select_strategy == "full":
        return False
    if stage != 1:
        raise UsageError("this model drops CLS (vision_feature_select_strategy default) and its projector was trained "
                         "without it; Parrot's MoE reads CLS: run stage 1 first (--set stage=1 retrains the projector "
                         "with CLS, in this run or before)")
    from llmx.core.multimodal.model import image_tokens

    model.config.vision_feature_select_strategy = "full"
    model.config.image_seq_length = image_tokens(model)
    proc.vision_feature_select_strategy = "full"
    if getattr(proc, "num_additional_image_tokens", 1) != 1:
        proc.num_additional_image_tokens = 1
    return True


def attach(model, p: ParrotTrainParams, seed: int):
    """The model with the MoE this stage trains. Stage 1 runs the MoE off, the identity, so it attaches none (the
    official stage 1 saves the projector alone; its random experts are never used). Stage 2 keeps the model's own
    MoE when it is already on (its configuration must match ``p``), else draws fresh experts (seeded) switched on."""
    from llmx.core.multimodal.adapter import AdaptedLlava

    current = getattr(model, "visual_adapter", None)
    if current is not None and not isinstance(current, MultilingualMoE):
        raise UsageError(f"this model carries another visual adapter ({type(current).__name__})")
    on = current is not None and current.use_moe
    if p.stage == 1:
        if on:
            raise UsageError("this model's MoE is trained (stage 2); stage 1 would switch it off: start from its base")
        return model
    if on:
        want = {"experts": p.experts, "intermediate_size": p.intermediate_size or current.hidden,
                "moe_weight": p.moe_weight, "top_k": p.top_k, "residual": p.residual}
        spec = current.adapter_spec()
        if diff := [f"{k} {spec[k]} (asked {v})" for k, v in want.items() if spec[k] != v]:
            raise UsageError(f"this model's MoE differs from the params: {', '.join(diff)}")
        return model
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init, seeded, the caller's generator untouched
        torch.manual_seed(seed)
        moe = MultilingualMoE(model.config.text_config.hidden_size, p.experts, p.intermediate_size, p.moe_weight,
                              True, p.top_k, p.residual, projector_type(model.config))
    return AdaptedLlava.adopt(model, moe)


def train(ctx: RunContext, p: ParrotTrainParams) -> dict[str, Any]:
    from llmx.core.multimodal.stage import run

    model, proc = vision_language(ctx.model, ctx.tokenizer, ctx.config.model)
    switched = keep_cls(model, proc, p.stage)
    if switched:
        ctx.log.warning("switched vision_feature_select_strategy default -> full: the MoE's query is the CLS token")
    model = attach(model, p, ctx.config.seed)
    init = _routing(model, proc, p, ctx.config.seed)
    out = run(ctx, p, "parrot")
    moe = getattr(ctx.model, "visual_adapter", None)
    out.update({"strategy_switched": switched, "moe_on": moe is not None and moe.use_moe,
                "moe_params": sum(t.numel() for t in moe.parameters()) if moe is not None else 0})
    if init is not None:
        after = _routing(ctx.model, proc, p, ctx.config.seed)
        atomic.write_text(ctx.artifact("routing.json"), json.dumps({"init": init, "trained": after}, indent=2) + "\n")
        out.update({"routing_language_accuracy_init": init["language_accuracy"], **metrics(after)})
    return out


def _routing(model, proc, p: ParrotTrainParams, seed: int) -> dict[str, Any] | None:
    """The gates' language report (stage 2 with ``routing_scenes``)."""
    if p.stage != 2 or not p.routing_scenes:
        return None
    from llmx.plugins.parrot.routing import report

    return report(model, proc, p.routing_scenes, seed)
