"""``lm_head`` as a packed QuantLinear (Quamba2's head-to-toe recipe)."""

from __future__ import annotations

import torch

from llmx.core.quant.formats import IntFormat
from llmx.core.quant.qlinear import QuantLinear


class QuantHead(QuantLinear):
    """transformers' Mamba heads cast the final hidden states to ``lm_head.weight.dtype`` before the call, so this
    layer carries an empty, non-persistent ``weight`` of its compute dtype (any real use of it fails on its shape)."""

    LAYER = "quamba2_head"

    def __init__(self, in_features: int, out_features: int, bias: bool, fmt: IntFormat, act_bits: int = 16,
                 static_act: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__(in_features, out_features, bias, fmt, act_bits, static_act, dtype)
        self.register_buffer("weight", torch.empty(0, dtype=dtype, device=self.qweight.device), persistent=False)
