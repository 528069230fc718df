"""BlockQuantLinear: a Linear stored in a block format (MXFP4, NVFP4, INT4 absmax, BlockDialect) that quantizes its
input in a block format on every call, both blocked along ``in_features`` (the reduction axis).

Stored: ``qweight`` (sign + 3-bit index, two per byte), ``scales`` (E8M0 / E4M3 bits as uint8, or float16) per block,
``tables`` (4-bit table ids, two per byte over the whole weight) when the format has several, ``tensor_scale``
(float32) for E4M3. A saved model holds exactly these buffers, so its bits per element are measured from its files.

On CUDA, a layer whose weight and input formats are on the half-unit grid with E8M0 scales (MXFP4, BlockDialect)
runs the integer-MAC kernels of :mod:`llmx.core.kernels.blockfp`; elsewhere it dequantizes and runs a float matmul
(the emulation the paper's accuracy figures use).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from llmx.core.quant import blockfp
from llmx.core.quant.blockfp import BlockFormat, Blocks


class BlockQuantLinear(torch.nn.Module):
    LAYER = "block_linear"

    def __init__(self, in_features: int, out_features: int, bias: bool, weight_format: BlockFormat,
                 act_format: BlockFormat | None, dtype: torch.dtype = torch.float32, device: torch.device | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_format, self.act_format = weight_format, act_format
        nb = -(-in_features // weight_format.block)
        u8 = {"dtype": torch.uint8, "device": device}
        self.register_buffer("qweight", torch.zeros(out_features, nb * weight_format.block // 2, **u8))
        scale_dtype = torch.float16 if weight_format.scale == "fp16" else torch.uint8
        self.register_buffer("scales", torch.zeros(out_features, nb, dtype=scale_dtype, device=device))
        multi = len(weight_format.tables) > 1
        self.register_buffer("tables", torch.zeros(-(-out_features * nb // 8) * 4, **u8) if multi else None)
        self.register_buffer("tensor_scale", torch.ones(1, device=device) if weight_format.scale == "e4m3" else None)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @property
    def float_numel(self) -> int:
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: torch.nn.Linear, weight_format: BlockFormat,
                    act_format: BlockFormat | None) -> BlockQuantLinear:
        q = cls(linear.in_features, linear.out_features, linear.bias is not None, weight_format, act_format,
                linear.weight.dtype, linear.weight.device)
        b = blockfp.quantize(linear.weight, weight_format)
        q.qweight.copy_(blockfp.pack_codes(b.codes.reshape(q.out_features, -1)))
        q.scales.copy_(b.scale_code)
        if q.tables is not None:
            q.tables.copy_(blockfp.pack_codes(b.table.reshape(-1)))
        if q.tensor_scale is not None:
            q.tensor_scale.copy_(b.tensor_scale)
        if linear.bias is not None:
            q.bias.copy_(linear.bias)
        return q

    def weight_blocks(self) -> Blocks:
        fmt, (codes, scales, tids) = self.weight_format, self.packed_weight()
        nb = scales.shape[1]
        codes = blockfp.unpack_codes(codes, nb * fmt.block).reshape(self.out_features, nb, fmt.block)
        return Blocks(codes, tids, scales, self.tensor_scale, self.in_features)

    def packed_weight(self):
        """The weight as the integer kernels take it (table ids one per byte)."""
        from llmx.core.kernels.blockfp import Packed

        nb = self.scales.shape[1]
        tids = (blockfp.unpack_codes(self.tables, self.out_features * nb).reshape(self.out_features, nb)
                if self.tables is not None
                else torch.zeros(self.out_features, nb, dtype=torch.uint8, device=self.qweight.device))
        return Packed(self.qweight, self.scales, tids)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return blockfp.dequantize(self.weight_blocks(), self.weight_format, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from llmx.core.kernels import blockfp as kernel_ops

        if kernel_ops.integer_path(x, self.weight_format, self.act_format):
            out = kernel_ops.linear(x.reshape(-1, self.in_features), self.packed_weight(), self.weight_format,
                                    self.act_format)
            out = out + self.bias.float() if self.bias is not None else out
            return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.act_format is not None:
            x = blockfp.fake_quantize(x, self.act_format)
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": self.LAYER, "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, "weight_format": self.weight_format.spec(),
                "act_format": self.act_format.spec() if self.act_format else None}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype,
                config: Any = None) -> BlockQuantLinear:
        act = spec["act_format"]
        layer = cls(spec["in_features"], spec["out_features"], spec["bias"], BlockFormat.from_spec(spec["weight_format"]),
                    BlockFormat.from_spec(act) if act else None, dtype)
        layer.load_state_dict(state, strict=True)
        return layer

    def extra_repr(self) -> str:
        act = self.act_format.describe() if self.act_format else "a16"
        return f"{self.in_features}, {self.out_features}, w {self.weight_format.describe()}, x {act}"
