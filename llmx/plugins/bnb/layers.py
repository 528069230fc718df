"""bitsandbytes layers that llmx can save and rebuild (``llmx_spec`` / ``rebuild``), loaded lazily: importing
bitsandbytes costs seconds."""

from __future__ import annotations

import logging
from typing import Any

import torch


def bnb():
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


def linear4bit(linear: torch.nn.Linear, quant_type: str, blocksize: int, double_quant: bool) -> torch.nn.Module:
    b = bnb()
    layer = b.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            compute_dtype=linear.weight.dtype, quant_type=quant_type, compress_statistics=double_quant)
    layer.weight = b.nn.Params4bit(linear.weight.data.clone(), requires_grad=False, quant_type=quant_type,
                                   blocksize=blocksize, compress_statistics=double_quant)
    return _finish(layer, linear, {"layer": "bnb_linear4bit", "quant_type": quant_type})


def linear8bit(linear: torch.nn.Linear, threshold: float) -> torch.nn.Module:
    b = bnb()
    layer = b.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              has_fp16_weights=False, threshold=threshold)
    layer.weight = b.nn.Int8Params(linear.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    return _finish(layer, linear, {"layer": "bnb_linear8bit", "threshold": threshold})


def _finish(layer: torch.nn.Module, linear: torch.nn.Linear, spec: dict[str, Any]) -> torch.nn.Module:
    """Copy the bias, move to the source layer's device and record how storage rebuilds the layer."""
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)
    layer = layer.to(linear.weight.device)
    _tag(layer, {**spec, "in_features": linear.in_features, "out_features": linear.out_features,
                 "bias": linear.bias is not None})
    return layer


def _tag(layer: torch.nn.Module, spec: dict[str, Any]) -> None:
    layer.llmx_spec = lambda: dict(spec)


def rebuild4(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any = None) -> torch.nn.Module:
    b = bnb()
    layer = b.nn.Linear4bit(spec["in_features"], spec["out_features"], bias=spec["bias"], compute_dtype=dtype,
                            quant_type=spec["quant_type"])
    stats = {k.removeprefix("weight."): v for k, v in state.items() if k.startswith("weight.")}
    layer.weight = b.nn.Params4bit.from_prequantized(data=state["weight"], quantized_stats=stats, requires_grad=False,
                                                     device=torch.device("cpu"))
    if spec["bias"]:
        layer.bias = torch.nn.Parameter(state["bias"].to(dtype), requires_grad=False)
    _tag(layer, spec)
    return layer


def rebuild8(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any = None) -> torch.nn.Module:
    b = bnb()
    layer = b.nn.Linear8bitLt(spec["in_features"], spec["out_features"], bias=spec["bias"], has_fp16_weights=False,
                              threshold=spec["threshold"])
    layer.weight = b.nn.Int8Params(state["weight"], requires_grad=False, has_fp16_weights=False, CB=state["weight"],
                                   SCB=state["SCB"])
    if spec["bias"]:
        layer.bias = torch.nn.Parameter(state["bias"].to(dtype), requires_grad=False)
    _tag(layer, spec)
    return layer
