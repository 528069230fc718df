"""Architecture configs for the built-in models (random ``tiny:*`` and trained ``ref:*``).

All widths are multiples of 64 (bitsandbytes' CPU 4-bit path needs it). Mamba1 uses the ``mambapy``
parallel scan: transformers' pure-PyTorch fallback is a Python loop over time (~60 s per training step here).
"""

from __future__ import annotations

from typing import Any

ARCHS = ("llama", "mamba", "mamba2", "moe", "opt")


def _round64(x: float) -> int:
    return max(64, int(round(x / 64)) * 64)


def config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2, max_positions: int = 1024) -> Any:
    """A transformers config for ``arch``; head counts and inner widths follow from ``hidden``."""
    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=_round64(hidden * 8 / 3), num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=max_positions, **common)
    if arch == "opt":  # learned absolute positions and biased projections: no RoPE between Q and K
        from transformers import OPTConfig

        return OPTConfig(ffn_dim=4 * hidden, num_attention_heads=4, max_position_embeddings=max_positions,
                         word_embed_proj_dim=hidden, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                         enable_bias=True, do_layer_norm_before=True, **common)
    if arch == "moe":
        from transformers import MixtralConfig

        return MixtralConfig(intermediate_size=hidden, num_attention_heads=4, num_key_value_heads=2,
                             num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=max_positions, **common)
    if arch == "mamba":
        from transformers import MambaConfig

        return MambaConfig(state_size=16, expand=2, conv_kernel=4, use_mambapy=True, **common)
    if arch == "mamba2":
        from transformers import Mamba2Config

        head_dim = hidden // 4
        return Mamba2Config(state_size=hidden // 4, expand=2, conv_kernel=4, head_dim=head_dim,
                            num_heads=2 * hidden // head_dim, n_groups=1, chunk_size=64, **common)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHS)}")


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
