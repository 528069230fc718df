"""Parrot's language-conditioned MoE on visual tokens (Sun et al., ICML 2025, §3.2; the official
``moe_model/moe.py``), the ``visual_adapter`` of an ``AdaptedLlava``.

Per image, with ``V`` its projected features ((1+P) x d, CLS first) and ``E`` its row's text embeddings:
``q = V[0]``; ``a = softmax(q E^T / sqrt(d))`` over the text tokens, with no projections; ``t = a E``;
``g = softmax(W_g t)`` with ``W_g`` a ``Linear(d, experts, bias=False)``; ``V' = sum_e g_e Expert_e(V) + w V`` with
SwiGLU experts applied to every visual token and ``w = moe_weight`` (0.1). No auxiliary loss. With ``use_moe`` off
(stage 1) the module is the identity, without the 0.1 scaling. ``top_k`` keeps the k largest gates, renormalised
(the paper's "select the most relevant experts"; the official code stores ``moe_top_k`` and never uses it, so soft
mixing over all experts is the default)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

LAYER = "parrot_moe"


class Expert(nn.Module):
    """``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MultilingualMoE(nn.Module):
    def __init__(self, hidden: int, experts: int = 6, intermediate: int | None = None, moe_weight: float = 0.1,
                 use_moe: bool = True, top_k: int | None = None, residual: bool = True, projector: str = "mlp2x_gelu"):
        super().__init__()
        if top_k is not None and not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be 1 to {experts}, not {top_k}")
        self.hidden, self.intermediate = hidden, intermediate or hidden
        self.moe_weight, self.use_moe, self.top_k, self.residual = moe_weight, use_moe, top_k, residual
        self.projector = projector  # the projector the MoE was trained behind, checked on reload
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, self.intermediate) for _ in range(experts))

    def routing(self, features: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, experts) gates from the CLS query's attention over each row's text (masked tokens excluded)."""
        q = features[:, :1]  # (B, 1, d)
        scores = (q @ text.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        pooled = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ text  # (B, 1, d); a row with no text pools to 0
        gates = torch.softmax(self.gate(pooled[:, 0]), dim=-1)
        if self.top_k is None or self.top_k == len(self.experts):
            return gates
        kept = torch.zeros_like(gates).scatter(1, gates.topk(self.top_k, dim=-1).indices, 1.0)
        gates = gates * kept
        return gates / gates.sum(-1, keepdim=True)

    def forward(self, features: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.use_moe:
            return features
        gates = self.routing(features, text, mask)
        out = sum(gates[:, e, None, None] * expert(features) for e, expert in enumerate(self.experts))
        return out + self.moe_weight * features if self.residual else out

    def adapter_spec(self) -> dict[str, Any]:
        """What a saved folder records and a reload checks."""
        return {"layer": LAYER, "projector": self.projector, "hidden_size": self.hidden, "experts": len(self.experts),
                "intermediate_size": self.intermediate, "moe_weight": self.moe_weight, "use_moe": self.use_moe,
                "top_k": self.top_k, "residual": self.residual}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> MultilingualMoE:
        """The stored MoE for a model of ``config``; a projector, width or tensor that does not match is an error."""
        projector = projector_type(config)
        if spec.get("projector") != projector:
            raise ValueError(f"stored for a {spec.get('projector')} projector, the model has {projector}")
        if spec.get("hidden_size") != config.text_config.hidden_size:
            raise ValueError(f"stored for width {spec.get('hidden_size')}, the model's is {config.text_config.hidden_size}")
        if config.vision_feature_select_strategy != "full":
            raise ValueError("the MoE's query is the CLS token: the model must keep it (vision_feature_select_strategy full)")
        moe = cls(spec["hidden_size"], spec["experts"], spec["intermediate_size"], spec["moe_weight"], spec["use_moe"],
                  spec["top_k"], spec["residual"], projector)
        moe.load_state_dict(state, strict=True)
        return moe.to(dtype)


def projector_type(config: Any) -> str:
    """LLaVA's name for HF's two-layer projector (``LlavaMultiModalProjector``) with this activation: ``mlp2x_gelu``."""
    return f"mlp2x_{config.projector_hidden_act}"
