"""The shared training loop: exact resume from a checkpoint, and two gloo processes agreeing with one."""

from __future__ import annotations

import torch

from llmx.core.train.loop import TrainConfig, train

TOKENS = torch.Generator().manual_seed(0)
DATA = torch.randint(3, 259, (64, 24), generator=TOKENS)


def tiny_model():
    from llmx.core.models.archs import build_random

    return build_random("llama", seed=1)[0]


def lm_loss(model, noisy: bool):
    def loss(i: int):
        x = DATA[(i * 2) % 64:][:2]
        labels = x.clone()
        if noisy:  # uses the global RNG, so a resume must restore it
            labels[torch.rand(labels.shape) < 0.2] = -100
        out = model(input_ids=x, labels=labels)
        return out.loss, {"tokens": float((labels != -100).sum())}
    return loss


def params(model):
    return {n: p for n, p in model.named_parameters()}


def test_resumed_training_matches_uninterrupted_exactly(tmp_path):
    cfg = TrainConfig(steps=8, lr=3e-3, warmup=2, grad_accum=2, checkpoint_every=3)
    torch.manual_seed(5)
    straight = tiny_model()
    train(straight, params(straight), lm_loss(straight, True), cfg, checkpoint_dir=tmp_path / "a")

    torch.manual_seed(5)
    first = tiny_model()
    cut = TrainConfig(**{**cfg.__dict__, "stop_after": 5})
    r1 = train(first, params(first), lm_loss(first, True), cut, checkpoint_dir=tmp_path / "b",
               metrics_file=tmp_path / "m.jsonl")
    assert r1.steps == 5 and (tmp_path / "b" / "step_5").is_dir()
    torch.manual_seed(123)  # a fresh process: different RNG state, fresh weights
    second = tiny_model()
    r2 = train(second, params(second), lm_loss(second, True), cfg, checkpoint_dir=tmp_path / "b",
               resume=tmp_path / "b", metrics_file=tmp_path / "m.jsonl")
    assert r2.resumed_from == 5 and r2.steps == 8
    for (name, a), b in zip(straight.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert len(lines) == 8 and '"tokens"' in lines[0]


def _worker(rank: int, size: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    torch.set_num_threads(1)
    from llmx.core.train import parallel

    model = tiny_model()
    engine = parallel.wrap(model, "ddp")
    train(model, params(model), lm_loss(model, False), TrainConfig(steps=4, lr=3e-3, grad_accum=1), engine=engine)
    engine.release()
    if rank == 0:
        torch.save(model.state_dict(), out)
    torch.distributed.destroy_process_group()


def test_two_gloo_processes_agree_with_one(tmp_path):
    out = str(tmp_path / "ddp.pt")
    torch.multiprocessing.spawn(_worker, args=(2, f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
    single = tiny_model()
    train(single, params(single), lm_loss(single, False), TrainConfig(steps=4, lr=3e-3, grad_accum=2))
    ddp = torch.load(out, weights_only=True)
    for name, value in single.state_dict().items():
        assert torch.equal(value, ddp[name]), name  # two ranks' sum is the one process's two-term sum, bit for bit
    assert not torch.equal(single.state_dict()["lm_head.weight"], tiny_model().state_dict()["lm_head.weight"])


def test_missing_checkpoint_is_a_usage_error(tmp_path):
    import pytest

    from llmx.errors import UsageError

    model = tiny_model()
    with pytest.raises(UsageError, match="no checkpoint"):
        train(model, params(model), lm_loss(model, False), TrainConfig(steps=1, lr=1e-3), resume=tmp_path)
