"""Random-init tiny models for unit tests: real architectures, seconds to build, byte tokenizer."""

from __future__ import annotations

from typing import Any

from llmx.core.tokenizer import byte_tokenizer


def config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2) -> Any:
    """A transformers config for ``arch`` (llama, mamba, mamba2, moe); widths stay multiples of 64."""
    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=1024, **common)
    if arch == "moe":
        from transformers import MixtralConfig

        return MixtralConfig(intermediate_size=hidden, num_attention_heads=4, num_key_value_heads=2,
                             num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=1024, **common)
    if arch == "mamba":
        from transformers import MambaConfig

        return MambaConfig(state_size=16, expand=2, conv_kernel=4, use_mambapy=True, **common)
    if arch == "mamba2":
        from transformers import Mamba2Config

        return Mamba2Config(state_size=16, expand=2, conv_kernel=4, head_dim=16, num_heads=2 * hidden // 16,
                            n_groups=1, chunk_size=64, **common)
    raise ValueError(f"unknown architecture {arch!r}")


def build(arch: str, dtype: str = "float32", device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from llmx.core.models import torch_dtype

    tok = byte_tokenizer()
    cfg = config(arch, vocab_size=len(tok))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype(dtype))
    return model.to(device), tok
