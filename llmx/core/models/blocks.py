"""The decoder blocks of any causal LM (``model.layers`` in Llama/Qwen2/Mixtral, ``decoder.layers`` in OPT,
``transformer.h`` in GPT-2, ``backbone.layers`` in Mamba): the ModuleList with one entry per hidden layer."""

from __future__ import annotations

import torch


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    n = model.config.num_hidden_layers
    for _, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n:
            return m
    raise ValueError(f"{type(model).__name__}: no list of {n} decoder blocks")
