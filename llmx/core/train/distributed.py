"""The process group under ``torchrun``: joining it, each rank's device, and the few collectives the loop's own figures need."""

from __future__ import annotations

import os


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside ``torch.distributed``."""
    import torch

    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Rank 0 (or no process group): the process that writes shared artifacts."""
    return world()[0] == 0


def local_device(device: str) -> str:
    """Under ``torchrun`` a bare ``cuda`` means this process's GPU, ``cuda:$LOCAL_RANK``."""
    if device == "cuda" and "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return device


def init(device: str = "auto") -> int:
    """Under ``torchrun`` (``WORLD_SIZE`` set, one process too: fsdp needs the group) join the process group and pin
    this process's GPU; return the rank. A CUDA run's group is NCCL for CUDA tensors and gloo for CPU ones (the
    shards of ``offload``), gloo alone otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "0"))
    if size < 1 or (size == 1 and "MASTER_ADDR" not in os.environ):  # not under torchrun
        return world()[0]
    import torch

    if not torch.distributed.is_initialized():
        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    return torch.distributed.get_rank()


def all_sum(values: list) -> None:
    """Sum each tensor across ranks in place, in one collective (the loop's per-step figures; gradients are the
    engine's, ``core/train/parallel.py``)."""
    import torch

    if not values:
        return
    flat = torch.stack([v.reshape(()) for v in values])
    torch.distributed.all_reduce(flat)
    for v, total in zip(values, flat, strict=True):
        v.copy_(total)


def from_main(value):
    """Rank 0's ``value`` on every rank (a path only rank 0 wrote, say)."""
    import torch

    if world()[1] == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (nothing outside ``torch.distributed``)."""
    import torch

    if world()[1] > 1:
        torch.distributed.barrier()


def gather_shards(mine: list) -> list:
    """Every rank's list (each a shard of one job, taken as ``items[rank::world]``) back in the job's order; ``mine``
    itself outside ``torch.distributed``."""
    rank, size = world()
    if size == 1:
        return list(mine)
    import torch

    parts: list = [None] * size
    torch.distributed.all_gather_object(parts, list(mine))
    out = []
    for k in range(max(len(p) for p in parts)):
        out += [p[k] for p in parts if k < len(p)]
    return out
