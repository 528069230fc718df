"""Architecture configs for the built-in models (random ``tiny:*`` and trained ``ref:*``).

All widths are multiples of 64 (bitsandbytes' CPU 4-bit path needs it). Attention layouts users meet: Llama (GQA,
RoPE), Qwen2 (GQA with biased q/k/v), OPT (learned positions, biases), GPT-2 (learned positions, fused c_attn),
Mixtral-style MoE; and two state-space models. Mamba1 uses the ``mambapy``
parallel scan: transformers' pure-PyTorch fallback is a Python loop over time (~60 s per training step here).
"""

from __future__ import annotations

from typing import Any

ARCHS = ("gpt2", "llama", "mamba", "mamba2", "moe", "opt", "qwen2")
NO_GQA = ("gpt2", "opt")  # one key/value head per query head, learned positions (no RoPE)
ATTENTION_FREE = ("mamba", "mamba2")
# model_type values of the decoder-only transformers with a self-attention KV cache: what the comparisons of
# attention, KV-cache and weight-block methods accept (``ComparisonSpec.kinds``)
ATTENTION_KINDS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "opt", "gpt2", "phi3")


def _round64(x: float) -> int:
    return max(64, int(round(x / 64)) * 64)


def default_kv_heads(arch: str, heads: int) -> int:
    return heads if arch in NO_GQA else max(1, heads // 2)


def check_shape(arch: str, hidden: int, heads: int, kv_heads: int | None) -> str | None:
    """None when ``arch`` can be built at this width and head count, else why not."""
    if arch in ATTENTION_FREE:
        return f"hidden {hidden} must be a multiple of 4 for {arch}" if hidden % 4 else None
    kv = default_kv_heads(arch, heads) if kv_heads is None else kv_heads
    if hidden % heads:
        return f"{heads} heads do not divide hidden {hidden}"
    if arch not in NO_GQA and (hidden // heads) % 2:
        return f"the head width {hidden // heads} (hidden / heads) must be even for rotary positions"
    if arch in NO_GQA and kv != heads:
        return f"{arch} has one key/value head per query head: kv_heads must be {heads} (or unset)"
    if heads % kv:
        return f"{kv} kv_heads do not divide {heads} heads"
    return None


def config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2, max_positions: int = 1024, heads: int = 4,
           kv_heads: int | None = None, special_ids: tuple[int | None, int, int] = (0, 1, 2)) -> Any:
    """A transformers config for ``arch``; inner widths follow from ``hidden``; ``special_ids`` are the tokenizer's
    (pad or None, bos, eos)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")
    problem = check_shape(arch, hidden, heads, kv_heads)
    if problem:
        raise ValueError(problem)
    kv = default_kv_heads(arch, heads) if kv_heads is None else kv_heads
    pad, bos, eos = special_ids
    common = dict(vocab_size=vocab_size, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
                  tie_word_embeddings=False)
    attention = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     max_position_embeddings=max_positions, **common)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=_round64(hidden * 8 / 3), num_key_value_heads=kv, **attention)
    if arch == "qwen2":  # biased q/k/v projections (unbiased o_proj), GQA, RoPE
        from transformers import Qwen2Config

        return Qwen2Config(intermediate_size=_round64(hidden * 8 / 3), num_key_value_heads=kv, use_sliding_window=False,
                           **attention)
    if arch == "gpt2":  # learned positions, one fused c_attn (transformers' Conv1D), biases everywhere
        from transformers import GPT2Config

        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, **common)
    if arch == "opt":  # learned absolute positions and biased projections: no RoPE between Q and K
        from transformers import OPTConfig

        return OPTConfig(ffn_dim=4 * hidden, word_embed_proj_dim=hidden, dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, enable_bias=True, do_layer_norm_before=True, **attention)
    if arch == "moe":
        from transformers import MixtralConfig

        return MixtralConfig(intermediate_size=hidden, num_key_value_heads=kv, num_local_experts=4,
                             num_experts_per_tok=2, **attention)
    ssm = dict(hidden_size=hidden, num_hidden_layers=layers, **common)
    if arch == "mamba":
        from transformers import MambaConfig

        return MambaConfig(state_size=16, expand=2, conv_kernel=4, use_mambapy=True, **ssm)
    from transformers import Mamba2Config

    head_dim = hidden // 4
    return Mamba2Config(state_size=hidden // 4, expand=2, conv_kernel=4, head_dim=head_dim,
                        num_heads=2 * hidden // head_dim, n_groups=1, chunk_size=64, **ssm)


def load_tiny(name: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """The ``tiny:ARCH`` model source."""
    return build_random(name.removeprefix("tiny:"), dtype=dtype, device=device)


def build_random(arch: str, dtype: str = "float32", device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    """A random-init ``tiny:`` model (2 layers, width 64) with the lossless byte tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmx.core.models import torch_dtype
    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config(arch, vocab_size=len(tok)), dtype=torch_dtype(dtype))
    return model.to(device), tok
