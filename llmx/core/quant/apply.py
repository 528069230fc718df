"""Glue shared by weight-quantization methods: pick the layers, swap in QuantLinear, measure and save."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.context import RunContext
from llmx.core.models.linear import replace_module
from llmx.core.quant.formats import IntFormat
from llmx.core.quant.params import WeightQuantParams
from llmx.core.quant.qlinear import QuantLinear


def target_linears(model: torch.nn.Module, skip: list[str]) -> dict[str, torch.nn.Linear]:
    from llmx.core.models.linear import linear_layers

    return linear_layers(model, skip)


def install(model: torch.nn.Module, name: str, linear: torch.nn.Linear, codes: torch.Tensor, scale: torch.Tensor,
            zero: torch.Tensor, fmt: IntFormat, p: WeightQuantParams, act_absmax: float | None) -> QuantLinear:
    act = p.bitspec.act
    act_scale = act_absmax / (2 ** (act - 1) - 1) if (act < 16 and p.act_scale == "static") else None
    q = QuantLinear.from_codes(linear, codes, scale, zero, fmt, act, act_scale)
    replace_module(model, name, q)
    return q


def needs_calibration(p: WeightQuantParams) -> bool:
    return p.bitspec.act < 16 and p.act_scale == "static"


def calibration(ctx: RunContext, p: WeightQuantParams) -> torch.Tensor:
    from llmx.core.data import random_windows

    return random_windows(ctx.tokenizer, p.calib_source or ctx.config.data.source, p.calib_samples,
                               p.calib_seq_len, seed=ctx.config.seed, splitting=ctx.config.data.splitting)


def finish(ctx: RunContext, p: WeightQuantParams, method: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Size figures of the quantized layers as stored (whatever runtime layout a forward switched them to), and the
    saved model (stored bytes measured from its files). Onloaded blocks are read from their CPU store."""
    from llmx.core.models.onload import resident

    with resident(ctx.model):
        return _finish(ctx, p, method, extra)


def _finish(ctx: RunContext, p: WeightQuantParams, method: str, extra: dict[str, Any]) -> dict[str, Any]:
    qlayers = [m for m in ctx.model.modules() if isinstance(m, QuantLinear)]
    params = sum(m.in_features * m.out_features for m in qlayers)
    packed = sum(t.numel() * t.element_size() for m in qlayers for k, t in m.state_dict().items() if k != "bias")
    out = {"bits": p.bits, "layers": len(qlayers), "quantized_params": params, "quantized_bytes": packed,
           "quantized_bytes_vs_fp16": packed / max(2 * params, 1),
           "weight_bits_per_element": 8 * packed / params if params else None, **extra}
    return {**out, **save(ctx, p, method)} if p.save else out


def save(ctx: RunContext, p: Any, method: str) -> dict[str, Any]:
    """Save the quantized model as the run's ``model`` artifact; its folder and stored bytes, measured from its files."""
    from llmx.core import models
    from llmx.core.models.storage import weight_file_bytes

    path = models.save(ctx.model, ctx.tokenizer, ctx.artifact("model"),
                       {"source": ctx.config.model, "method": method, "params": p.model_dump()})
    return {"model_dir": str(path), "stored_weight_bytes": weight_file_bytes(path),
            "fp16_model_bytes": 2 * _float_param_count(ctx.model)}


def _float_param_count(model: torch.nn.Module) -> int:
    """Parameters of the model as if unquantized (a packed layer counted at its ``float_numel``)."""
    return sum(getattr(m, "float_numel", None) or sum(p.numel() for p in m.parameters(recurse=False))
               for m in model.modules())
