"""Pre-training of a reference model on a token stream with the shared training loop: random windows, AdamW,
warmup + cosine, early stopping on the loss of fixed held-out windows."""

from __future__ import annotations

import torch

from llmx.core.data import fixed_windows
from llmx.core.eval.lm import mean_nll
from llmx.core.train.loop import TrainConfig, TrainResult, train
from llmx.core.zoo.presets import Preset


def pretrain(model: torch.nn.Module, train_ids: torch.Tensor, val_ids: torch.Tensor, p: Preset, seed: int,
             steps: int | None = None, progress=None) -> TrainResult:
    """Train ``model`` in place; the best validation checkpoint is restored."""
    gen = torch.Generator().manual_seed(seed)
    held_out = fixed_windows(val_ids, p.seq_len, p.eval_windows)

    def loss(i: int) -> torch.Tensor:  # a stateful sampler: zoo builds never resume
        starts = torch.randint(0, len(train_ids) - p.seq_len - 1, (p.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + p.seq_len] for s in starts])
        return model(input_ids=x, labels=x).loss

    config = TrainConfig(steps=steps or p.max_steps, lr=p.lr, warmup=p.warmup, weight_decay=0.1,
                         eval_every=p.eval_every, patience=p.patience)
    return train(model, model.parameters(), loss, config, evaluate=lambda: mean_nll(model, held_out), progress=progress)
