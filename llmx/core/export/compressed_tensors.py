"""compressed-tensors folders (the checkpoint format of llm-compressor: transformers loads it with the
``compressed-tensors`` package, vLLM serves it) from llmx's packed linears.

The codes are written as they are, never re-quantized. compressed-tensors dequantizes ``w = (q - zero) * scale`` with
signed codes ``q`` in ``[-2^(b-1), 2^(b-1) - 1]``: llmx's symmetric codes already are, asymmetric ones (``0..2^b - 1``
with a zero point in the same range) are shifted by ``2^(b-1)``, codes and zero point alike, which leaves ``q - zero``
unchanged. Per layer:

- weight-only (``pack-quantized``): ``weight_packed`` (int32, 32 codes in ``b`` words, the library's
  ``pack_to_int32``), ``weight_shape``, ``weight_scale`` (``[out, groups]`` group, ``[out, 1]`` channel, ``[1]`` tensor)
  and, when asymmetric, ``weight_zero_point`` (int32, packed along the output dimension, for group and channel);
- W8A8 (``int-quantized``): ``weight`` (int8), ``weight_scale``, and ``input_scale`` for a static activation scale
  (strategy tensor); dynamic per-token activations store nothing.

Scales are written in the model's float dtype, as compressed-tensors allocates them (exact for float32 and float16
models). The library's own classes build the ``quantization_config`` and write it into config.json.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from llmx.core.export.plan import Scheme

FORMAT = "compressed-tensors"


def layer_tensors(layer: Any, scheme: Scheme, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The stored tensors of one QuantLinear, by their local names."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    codes = layer.codes()  # int16: signed when symmetric; 0..2^b - 1 with a zero point when asymmetric
    shift = 0 if scheme.symmetric else 2 ** (scheme.bits - 1)
    scale = layer.scales.to(dtype)
    out = {"weight_scale": scale.reshape(1) if scheme.strategy == "tensor" else scale}
    if scheme.format == "int-quantized":
        out["weight"] = codes.to(torch.int8)
        if scheme.act == "static":
            out["input_scale"] = layer.act_scale.reshape(1).to(dtype)
    else:
        out["weight_packed"] = pack_to_int32((codes - shift).to(torch.int8), scheme.bits)
        out["weight_shape"] = torch.tensor([layer.out_features, layer.in_features], device=codes.device)
        if not scheme.symmetric:
            zero = (layer.zeros.to(torch.int16) - shift).to(torch.int8)  # in range: checked by the plan
            out["weight_zero_point"] = (pack_to_int32(zero, scheme.bits, packed_dim=0) if scheme.packed_zero_point
                                        else zero.reshape(1))
    if layer.bias is not None:
        out["bias"] = layer.bias.detach()
    return out


def quantization_config(schemes: dict[str, Scheme], ignore: list[str]) -> Any:
    """The library's ``QuantizationConfig``: one config group per scheme (targets ``Linear`` when there is one, the
    layer names otherwise), the float linears in ``ignore``, status compressed."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    groups: dict[Scheme, list[str]] = {}
    for name, s in schemes.items():
        groups.setdefault(s, []).append(name)
    config_groups = {}
    for i, (s, names) in enumerate(groups.items()):
        weights = QuantizationArgs(num_bits=s.bits, type="int", symmetric=s.symmetric, strategy=s.strategy,
                                   group_size=s.group_size if s.strategy == "group" else None)
        acts = None if s.act is None else QuantizationArgs(
            num_bits=8, type="int", symmetric=True, strategy="tensor" if s.act == "static" else "token",
            dynamic=s.act == "dynamic")
        config_groups[f"group_{i}"] = QuantizationScheme(targets=["Linear"] if len(groups) == 1 else names,
                                                         weights=weights, input_activations=acts, format=s.format)
    formats = {s.format for s in groups}
    return QuantizationConfig(config_groups=config_groups, ignore=ignore, quantization_status="compressed",
                              format=formats.pop() if len(formats) == 1 else "mixed-precision")


def state(model: Any, schemes: dict[str, Scheme], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the folder: the float ones as the model holds them (a tied copy once), the packed layers'."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for key, t in model.state_dict().items():
        if key.rpartition(".")[0] in schemes:
            continue
        ident = (t.untyped_storage().data_ptr(), tuple(t.shape))
        if ident not in seen:  # tied weights: transformers ties them again on load
            seen.add(ident)
            out[key] = t
    for name, s in schemes.items():
        for key, t in layer_tensors(model.get_submodule(name), s, dtype).items():
            out[f"{name}.{key}"] = t
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def write(model: Any, tokenizer: Any, folder: Path, schemes: dict[str, Scheme], ignore: list[str]) -> dict[str, Any]:
    """Write config.json (with its ``quantization_config``), model.safetensors and the tokenizer into ``folder`` (an
    empty folder: the caller makes the write atomic). Returns what was written."""
    from compressed_tensors.compressors import ModelCompressor
    from safetensors.torch import save_file

    dtype = model.get_input_embeddings().weight.dtype
    qconfig = quantization_config(schemes, ignore)
    config = copy.deepcopy(model.config)
    if hasattr(config, "transformers_weights"):  # llmx's marker of its own folders: not for this one
        delattr(config, "transformers_weights")
    config.dtype = dtype
    config.save_pretrained(folder)
    save_file(state(model, schemes, dtype), str(folder / "model.safetensors"), metadata={"format": "pt"})
    ModelCompressor(quantization_config=qconfig).update_config(str(folder))
    # compressed-tensors 0.20.1 cannot build a packed zero point on transformers' meta-device load path
    # (vllm-project/llm-compressor#1618): such a folder asks transformers to dequantize while loading instead.
    dequantize = any(s.packed_zero_point for s in schemes.values())
    if dequantize:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"]["dequantize"] = True
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return {"compression": qconfig.format, "dequantize_on_load": dequantize, "ignored": ignore}
