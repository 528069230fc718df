"""A model's weights written as sharded safetensors without the whole model in memory: each tensor is gathered in
turn (a sharded one from every rank: all ranks iterate together) and only the shard being filled is held, on the
writing rank. The layout is transformers' (``model-0000k-of-0000n.safetensors`` and
``model.safetensors.index.json``; one file ``model.safetensors`` when it fits one shard), so the folder loads in
plain ``from_pretrained``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
SHARD_BYTES = 5 * 2**30  # transformers' default max_shard_size


def write(tensors: Iterable[tuple[str, torch.Tensor]], folder: Path | None, shard_bytes: int = SHARD_BYTES,
          gather: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict[str, str]:
    """Write ``tensors`` (name, tensor) through ``gather`` (which every rank calls for every tensor) into ``folder``
    (the writing rank; None elsewhere); returns the weight map (name -> file). A tensor whose storage was seen
    under an earlier name (tied weights) is written once, as ``save_pretrained`` does."""
    from safetensors.torch import save_file

    shard: dict[str, torch.Tensor] = {}
    held, total, parts, weight_map, seen = 0, 0, [], {}, set()

    def flush() -> None:
        nonlocal shard, held
        if shard and folder is not None:
            part = folder / f".part-{len(parts)}.safetensors"
            save_file(shard, str(part), metadata={"format": "pt"})
            parts.append((part, list(shard)))
        shard, held = {}, 0

    for name, t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # a state dict's tied entries share their storage
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(t.shape)) if local.numel() else None
        if key in seen:
            continue
        if key is not None:
            seen.add(key)
        whole = gather(t)
        if folder is None:
            continue
        whole = whole.detach().to("cpu").contiguous()
        if held and held + whole.numel() * whole.element_size() > shard_bytes:
            flush()
        shard[name] = whole
        held += whole.numel() * whole.element_size()
        total += whole.numel() * whole.element_size()
    flush()
    if folder is None:
        return {}
    for k, (part, names) in enumerate(parts):
        final = "model.safetensors" if len(parts) == 1 else f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        part.rename(folder / final)
        weight_map.update({n: final for n in names})
    if len(parts) > 1:
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                               indent=2) + "\n")
    return weight_map
