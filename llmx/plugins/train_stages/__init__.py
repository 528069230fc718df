"""The generic training stages: causal-LM training and supervised fine-tuning (their code lives in ``core.train``)."""
