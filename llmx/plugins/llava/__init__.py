"""LLaVA's visual instruction tuning (Liu et al. 2023; LLaVA-1.5, Liu et al. 2024) and the digit-scene VQA task."""
