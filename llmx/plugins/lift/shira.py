"""A LIFT run's final support and update as a PEFT SHiRA adapter (``ShiraConfig`` with a custom ``mask_fn``): SHiRA
keeps ``r(m + n)`` entries per linear layer, LIFT's budget. The adapter is static: it holds the update on the final
support only, so entries updated under an earlier support and then dropped at a refresh are lost (``shira_kept``
reports the share of the update's energy it holds; 1.0 when no refresh moved a support)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from llmx.core import models
from llmx.core.context import RunContext
from llmx.core.train import adapters, sparse
from llmx.core.train.distributed import is_main
from llmx.plugins.lift.config import LiftParams


@torch.no_grad()
def export(ctx: RunContext, model: torch.nn.Module, named: dict[str, torch.nn.Parameter],
           start: dict[str, torch.Tensor], supports: dict[torch.nn.Parameter, torch.Tensor],
           p: LiftParams) -> dict[str, Any]:
    lib = adapters.peft()
    base = copy.deepcopy(model)
    params = dict(base.named_parameters())
    masks, deltas, kept, total = {}, {}, 0.0, 0.0
    for name, t in named.items():
        delta = (t.detach() - start[name]).reshape(-1)
        index = supports[t]
        kept += float(delta[index].square().sum())
        total += float(delta.square().sum())
        params[name].copy_(start[name])
        module = base.get_submodule(name.rsplit(".", 1)[0])
        masks[id(module)] = sparse.dense_mask(index, t.shape).to(t.dtype)
        deltas[name.rsplit(".", 1)[0]] = delta[index]
    config = lib.ShiraConfig(r=p.rank, target_modules=sorted(deltas), task_type="CAUSAL_LM")
    config.mask_fn = lambda layer, r, **_: masks[id(layer)]
    wrapped = lib.get_peft_model(base, config)
    for name, module in wrapped.named_modules():
        key = name.removeprefix("base_model.model.")
        if key in deltas and hasattr(module, "shira_weight"):
            module.shira_weight["default"].copy_(deltas[key])
    out: dict[str, Any] = {"shira_kept": kept / total if total > 0 else 1.0}
    if is_main():
        meta = {"source": ctx.config.model, "method": "lift", "params": p.model_dump(mode="json")}
        out["shira_dir"] = str(models.save(wrapped, ctx.tokenizer, ctx.artifact("shira_adapter"), meta))
    return out
