"""Supervised fine-tuning (``llmx train --method sft``): prompt/completion and conversational rows, loss on the
completion only, one truncation policy, optional packing with per-document attention boundaries."""
