"""Causal-LM training (``llmx train --method lm``): packed token windows, checkpoint series and cooldown branches."""
