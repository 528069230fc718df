"""Dictionary files: safetensors with one K and one V dictionary per layer and the model's identity in the metadata;
a file for another model, or a damaged one, is a usage error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from llmx.core.models.blocks import decoder_blocks
from llmx.errors import UsageError


def model_identity(model) -> str:
    """Architecture and weights: the config plus a hash of the first decoder layer's parameters."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    first = decoder_blocks(model)[0]
    for t in first.state_dict().values():
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def save(path: Path, dicts: list[tuple[torch.Tensor, torch.Tensor]], model, sparsity: int) -> Path:
    from safetensors.torch import save_file

    from llmx.core import atomic

    tensors = {}
    for i, (k, v) in enumerate(dicts):
        tensors[f"layer{i}.keys"], tensors[f"layer{i}.values"] = k.contiguous(), v.contiguous()
    meta = {"model": model_identity(model), "sparsity": str(sparsity), "layers": str(len(dicts)),
            "atoms": str(dicts[0][0].shape[1])}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    atomic.write_bytes(path, tmp.read_bytes())
    tmp.unlink()
    return path


def load(path: str | Path, model) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"dictionary file not found: {p}")
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            layers = int(meta["layers"])
            dicts = [(f.get_tensor(f"layer{i}.keys"), f.get_tensor(f"layer{i}.values")) for i in range(layers)]
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a damaged file
        raise UsageError(f"{p} is not a readable Lexico dictionary file ({type(exc).__name__}: {exc})") from exc
    if meta.get("model") != model_identity(model):
        raise UsageError(f"{p} was learned for another model (identity {meta.get('model')}); train one for this model "
                         "with `llmx train --method lexico`")
    return dicts, int(meta["sparsity"])
