"""The token embedding as packed int4 rows (Quamba2's head-to-toe recipe, ``--quantize_embedding``): RTN codes with
one fp16 scale per group of ``group_size`` columns (per row when the width is smaller); a lookup gathers the packed
rows and dequantizes only those."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.quant.formats import IntFormat, dequantize, quantize
from llmx.core.quant.packing import pack, unpack


class QuantEmbedding(torch.nn.Module):
    def __init__(self, num_embeddings: int, dim: int, group_size: int | None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.fmt, self.dtype = num_embeddings, dim, IntFormat(4, group_size), dtype
        groups = 1 if group_size is None else -(-dim // group_size)
        self.register_buffer("qweight", torch.zeros(num_embeddings, -(-dim // 8) * 4, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.ones(num_embeddings, groups, dtype=torch.float16, device=device))

    @classmethod
    def from_embedding(cls, emb: torch.nn.Embedding, group_size: int) -> QuantEmbedding:
        dim = emb.embedding_dim
        q = cls(emb.num_embeddings, dim, group_size if group_size < dim else None, emb.weight.dtype, emb.weight.device)
        codes, scale, _ = quantize(emb.weight.detach(), q.fmt)
        q.qweight.copy_(pack(codes, 4, offset=8))
        q.scales.copy_(scale.reshape(q.scales.shape).to(torch.float16))
        return q

    @property
    def float_numel(self) -> int:
        return self.num_embeddings * self.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        codes = unpack(self.qweight[ids.reshape(-1)], 4, self.embedding_dim, offset=8)
        rows = dequantize(codes, self.scales[ids.reshape(-1)].float()[..., None], torch.zeros(1, device=codes.device),
                          self.fmt.group_size)
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def llmx_spec(self) -> dict[str, Any]:
        return {"layer": "quamba2_embedding", "num_embeddings": self.num_embeddings,
                "dim": self.embedding_dim, "group_size": self.fmt.group_size}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any = None):
        layer = cls(spec["num_embeddings"], spec["dim"], spec["group_size"], dtype)
        layer.load_state_dict(state, strict=True)
        return layer

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.fmt.describe()}"
