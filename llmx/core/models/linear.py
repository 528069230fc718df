"""Module surgery: swap a named submodule; and one linear layer type for weight methods: transformers' ``Conv1D``
(GPT-2's ``y = x W + b`` with ``W`` stored ``[in, out]``) becomes the equal ``nn.Linear`` (weight ``W^T``)."""

from __future__ import annotations

import torch


def replace_module(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)
    if hasattr(type(new), "llmx_name"):  # a layer that names itself in its errors learns where it sits
        new.llmx_name = name


def is_conv1d(m: torch.nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


def as_linear(m: torch.nn.Module) -> torch.nn.Linear:
    """The ``nn.Linear`` that computes what the ``Conv1D`` ``m`` computes, on its device and dtype."""
    w = m.weight
    out = torch.nn.Linear(w.shape[0], w.shape[1], bias=m.bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w.t())
        if m.bias is not None:
            out.bias.copy_(m.bias)
    return out


def linear_layers(model: torch.nn.Module, skip: list[str]) -> dict[str, torch.nn.Linear]:
    """Every linear layer whose name matches none of ``skip``, by name; ``Conv1D`` layers among them are swapped
    for their ``nn.Linear`` in the model first."""
    out = {}
    for name, m in list(model.named_modules()):
        if any(s in name for s in skip):
            continue
        if is_conv1d(m):
            m = as_linear(m)
            replace_module(model, name, m)
        if isinstance(m, torch.nn.Linear):
            out[name] = m
    return out
