"""Preference alignment machinery shared by the align methods: data, batching, log-probs, the training run."""
