"""Sparse upcycling (Komatsuzaki et al. 2023; Liew et al., ICML 2025 §2): a dense gated-FFN decoder becomes a
top-k mixture of experts whose every expert is a copy of the dense FFN, with a new router. Attention, norms and
embeddings are copied unchanged. The router is a softmax over all experts, top-k kept and renormalised to sum to 1,
so right after upcycling the MoE computes exactly the dense function (with identical experts any renormalised
mixture of them is the dense FFN; without the renormalisation it is scaled by the kept mass).

Targets are plain transformers classes that load without llmx: Mixtral (its router always renormalises) for Llama,
and Qwen2-MoE (``norm_topk_prob`` set; its shared expert given width 0) for Qwen2's biased q/k/v projections.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch

from llmx.errors import UsageError

Target = Literal["auto", "mixtral", "qwen2_moe"]
COPIED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
          "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps", "pad_token_id", "bos_token_id",
          "eos_token_id", "tie_word_embeddings", "rope_parameters", "attention_dropout")


@dataclass(frozen=True)
class UpcycleConfig:
    num_experts: int = 8
    top_k: int = 2
    router_init: Literal["normal", "zeros"] = "normal"
    router_std: float | None = None  # None: the model's initializer_range
    aux_loss_coef: float = 0.01
    target: Target = "auto"
    renormalize: bool = True  # False only for qwen2_moe: the Switch-style router that breaks the identity
    seed: int = 0


def _dense_ffn(model: Any) -> str | None:
    """Why ``model`` cannot be upcycled, or None."""
    config = model.config
    if config.model_type not in ("llama", "qwen2", "mistral"):
        return (f"upcycle: {config.model_type} has no gated dense FFN (gate_proj, up_proj, down_proj); upcycling "
                "takes a Llama, Mistral or Qwen2 decoder")
    if getattr(config, "mlp_bias", False):
        return "upcycle: the dense FFN has biases (mlp_bias); Mixtral and Qwen2-MoE experts have none"
    if getattr(config, "attention_bias", False):
        return "upcycle: attention_bias puts a bias on o_proj, which neither Mixtral nor Qwen2-MoE has"
    if config.model_type == "qwen2" and getattr(config, "use_sliding_window", False):
        return "upcycle: a Qwen2 model with use_sliding_window has no Qwen2-MoE counterpart here"
    return None


def resolve_target(model: Any, target: Target) -> str:
    if target != "auto":
        if target == "mixtral" and model.config.model_type == "qwen2":
            raise UsageError("upcycle: Mixtral has no q/k/v biases; a Qwen2 model upcycles to target qwen2_moe")
        return target
    return "qwen2_moe" if model.config.model_type == "qwen2" else "mixtral"


def moe_config(model: Any, c: UpcycleConfig) -> Any:
    """The MoE's transformers config: the dense model's widths, rope and special tokens, E experts of its FFN width."""
    src = model.config
    target = resolve_target(model, c.target)
    if c.top_k > c.num_experts:
        raise UsageError(f"upcycle: top_k {c.top_k} is above the {c.num_experts} experts")
    if not c.renormalize and target == "mixtral":
        raise UsageError("upcycle: Mixtral's router always renormalises the top-k weights; renormalize: false needs "
                         "target qwen2_moe")
    common = {k: getattr(src, k) for k in COPIED if getattr(src, k, None) is not None}
    common.update(num_experts_per_tok=c.top_k, output_router_logits=False, router_aux_loss_coef=c.aux_loss_coef,
                  use_cache=True)  # the lm stage asks for the balance loss (core.train.lm); plain .loss stays NLL
    if target == "mixtral":
        from transformers import MixtralConfig

        sliding = getattr(src, "sliding_window", None)
        return MixtralConfig(intermediate_size=src.intermediate_size, num_local_experts=c.num_experts,
                             sliding_window=sliding, router_jitter_noise=0.0, **common)
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(moe_intermediate_size=src.intermediate_size, intermediate_size=src.intermediate_size,
                          shared_expert_intermediate_size=0, num_experts=c.num_experts, norm_topk_prob=c.renormalize,
                          decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                          qkv_bias=src.model_type == "qwen2", **common)


def upcycle(model: Any, c: UpcycleConfig | None = None) -> Any:
    """The upcycled MoE (a new model on the dense model's device and dtype; the dense model is not changed)."""
    from transformers import AutoModelForCausalLM

    c = c or UpcycleConfig()
    problem = _dense_ffn(model)
    if problem:
        raise UsageError(problem)
    config = moe_config(model, c)
    weight = next(model.parameters())
    with warnings.catch_warnings(), torch.device(weight.device):  # built where the dense model is
        warnings.simplefilter("ignore")  # Qwen2-MoE's zero-width shared expert warns at init
        moe = AutoModelForCausalLM.from_config(config, dtype=weight.dtype)
    dense = model.state_dict()
    target = moe.state_dict()
    std = c.router_std if c.router_std is not None else config.initializer_range
    gen = torch.Generator(device="cpu").manual_seed(c.seed)
    with torch.no_grad():
        for name, tensor in target.items():
            if ".mlp." not in name:
                tensor.copy_(dense[name])
                continue
            layer = name.split(".mlp.")[0]
            ffn = {p: dense[f"{layer}.mlp.{p}_proj.weight"] for p in ("gate", "up", "down")}
            if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
                tensor.copy_(torch.cat([ffn["gate"], ffn["up"]]).expand_as(tensor))
            elif name.endswith("experts.down_proj"):  # [E, H, I]
                tensor.copy_(ffn["down"].expand_as(tensor))
            elif name.endswith("mlp.gate.weight") and c.router_init == "zeros":  # the router [E, H]
                tensor.zero_()
            elif name.endswith("mlp.gate.weight"):  # drawn on the CPU generator (the same router on any device)
                tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * std)
            elif "shared_expert" in name:  # zero width, or the gate of a zero-width expert
                tensor.zero_()
            else:
                raise UsageError(f"upcycle: no rule for the MoE tensor {name}")
    return moe


def balance_loss_kwargs(model: Any) -> dict[str, bool]:
    """Forward kwargs that add an MoE's load-balancing loss (``router_aux_loss_coef`` x aux) to ``.loss`` while
    training; saved configs keep ``output_router_logits`` off, so a plain ``.loss`` elsewhere is the NLL."""
    config = getattr(model, "config", None)
    coef = getattr(config, "router_aux_loss_coef", 0.0) if hasattr(config, "output_router_logits") else 0.0
    return {"output_router_logits": True} if coef else {}


def parameter_counts(model: Any) -> dict[str, int]:
    """Total and active parameters (top-k of the experts), with and without the embedding and output matrices
    (tied matrices count once)."""
    config = model.config
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    k = getattr(config, "num_experts_per_tok", None)
    total = expert = embed = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if ".experts." in name:
            expert += p.numel()
        if "embed_tokens" in name or name.startswith("lm_head"):
            embed += p.numel()
    active = total - (expert - expert * k // experts if experts else 0)
    return {"total_params": total, "active_params": active, "total_non_embedding": total - embed,
            "active_non_embedding": active - embed}
