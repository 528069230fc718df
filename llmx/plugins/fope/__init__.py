"""FoPE: Fourier position embedding for length generalisation (Hua et al., ICML 2025, arXiv 2412.17739), with RoPE
and ALiBi through the same training stage, RoPE + YaRN as the training-free baseline, and a length evaluation."""
