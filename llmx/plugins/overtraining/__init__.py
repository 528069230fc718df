"""Catastrophic overtraining (Springer et al., ICML 2025): a study over the checkpoints of one pre-training run,
Gaussian sensitivity S(T, gamma) (§3.2) and fine-tuning degradation (§3.3) with their turning points."""
