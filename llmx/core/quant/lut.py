"""LUTLinear: non-uniform scalar weights, one fp16 codebook of ``2^b`` values per output row and a ``b``-bit index per
weight (SqueezeLLM, LNQ). Indices are packed by :mod:`llmx.core.quant.packing` along the input dim; the stored bits
per weight count the codebooks: ``b + 16 * 2^b / in_features``.

The forward gathers each row's weights from its codebook and runs a float matmul (the reference); CUDA inputs go to
the LUT GEMM kernel of :mod:`llmx.core.kernels.lut`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from llmx.core.quant.packing import pack, unpack


class LUTLinear(torch.nn.Module):
    LAYER = "lut_linear"

    def __init__(self, in_features: int, out_features: int, bias: bool, bits: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None):
        super().__init__()
        if not 1 <= bits <= 8:
            raise ValueError(f"LUT indices take 1..8 bits, got {bits}")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.register_buffer("qweight", torch.zeros(out_features, -(-in_features // 8) * bits, dtype=torch.uint8,
                                                    device=device))
        self.register_buffer("codebook", torch.zeros(out_features, 2**bits, dtype=torch.float16, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @property
    def float_numel(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    @property
    def bits_per_weight(self) -> float:
        return (self.qweight.numel() * 8 + self.codebook.numel() * 16) / (self.in_features * self.out_features)

    @classmethod
    @torch.no_grad()
    def from_indices(cls, linear: torch.nn.Linear, indices: torch.Tensor, codebook: torch.Tensor, bits: int) -> LUTLinear:
        """``indices`` ``[out, in]`` into ``codebook`` ``[out, 2^b]`` (cast to fp16, as stored)."""
        q = cls(linear.in_features, linear.out_features, linear.bias is not None, bits, linear.weight.dtype,
                linear.weight.device)
        q.qweight.copy_(pack(indices, bits))
        q.codebook.copy_(codebook.to(torch.float16))
        if linear.bias is not None:
            q.bias.copy_(linear.bias)
        return q

    def indices(self) -> torch.Tensor:
        return unpack(self.qweight, self.bits, self.in_features).long()

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.codebook.gather(1, self.indices()).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from llmx.core.kernels import lut

        if lut.use_kernel(x):
            out = lut.lut_gemm(x.reshape(-1, self.in_features), self.qweight, self.codebook, self.bias, self.bits)
            return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": self.LAYER, "bits": self.bits, "in_features": self.in_features,
                "out_features": self.out_features, "bias": self.bias is not None}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype,
                config: Any = None) -> LUTLinear:
        layer = cls(spec["in_features"], spec["out_features"], spec["bias"], spec["bits"], dtype)
        layer.load_state_dict(state, strict=True)
        return layer

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, lut{self.bits} ({self.bits_per_weight:.3f} bits)"
