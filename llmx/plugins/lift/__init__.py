"""LIFT: low-rank informed sparse fine-tuning of principal weights (Liu et al., ICML 2025)."""
