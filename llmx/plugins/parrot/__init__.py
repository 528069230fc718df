"""Parrot: multilingual visual instruction tuning with a language-conditioned MoE (Sun et al., ICML 2025), and MMMB."""
