"""Saving and loading models with llmx-owned layers (QuantLinear, bitsandbytes layers, pruned attention): the tensors
in safetensors, each replaced module's spec in ``llmx.json`` (``llmx_modules``: name -> spec with a ``builder``
``"module:callable"`` taking ``(spec, tensors, dtype, config)``), the base architecture in ``config.json``. A rebuilt
layer with ``llmx_after_load(model)`` gets the loaded model (to switch its attention implementation, say)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from llmx.core.models.linear import replace_module
from llmx.errors import UsageError

KEY = "llmx_modules"


def layer_specs(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Every outermost layer that knows how to describe its stored form (``llmx_spec()``), by module name; a layer
    inside another describes itself through its parent's spec."""
    specs: dict[str, dict[str, Any]] = {}
    for name, m in model.named_modules():
        if name and callable(getattr(m, "llmx_spec", None)) and not any(name.startswith(p + ".") for p in specs):
            specs[name] = m.llmx_spec()
    return specs


def build_layer(spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any) -> torch.nn.Module:
    """A stored layer rebuilt by the builder an installed plugin registered for the layer its spec names. A spec
    written before layers were named (``"builder": "module:callable"``) loads only if that callable is a registered
    builder: a string in a file never picks the code that runs."""
    from llmx.core.plugins import host
    from llmx.core.spec import load_object

    layers = host().layers
    if "layer" in spec:
        if spec["layer"] not in layers:
            raise UsageError(f"stored layer type '{spec['layer']}' is provided by no installed plugin",
                             hint=f"Known: {', '.join(sorted(layers))}.")
        builder = layers[spec["layer"]].builder
    else:
        builder = spec.get("builder")
        if builder not in {s.builder for s in layers.values()}:
            raise UsageError(f"stored layer names a builder no installed plugin registers ({builder!r}); refused")
    return load_object(builder)(spec, state, dtype, config)


def transformers_class(path: str) -> type:
    """A torch module class named in a stored spec (``transformers.models.<family>.<module>.<Class>``): only a class
    defined by transformers' model code, so a string in a file never picks other code."""
    import importlib

    module, _, name = path.rpartition(".")
    if not module.startswith("transformers.models."):
        raise ValueError(f"stored class {path!r} is not a transformers model class")
    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ValueError(f"stored class {path!r} is not a torch module")
    return cls


TORCH_WEIGHTS = ("pytorch_model", "adapter_model")  # the torch pickles a loader reads (transformers', PEFT's)


def check_weight_files(path: str | Path) -> None:
    """The weight files a loader will read, before anything loads: safetensors (each header covering its file, the
    files its index names present) where the folder has them, else the torch pickles transformers and PEFT read
    (``pytorch_model*.bin``, ``adapter_model.bin``: tensors only, read weights-only onto the meta device without
    their data, so a payload never runs) and the shards their index names. Other files (an OpenVINO ``.bin``, a
    Trainer's state, a leftover ``.bin`` index beside safetensors) are not read, so not checked. A bad one is a
    usage error naming it."""
    folder = Path(path)
    safetensors = sorted(folder.glob("*.safetensors"))
    for f in safetensors:
        _check_safetensors(f)
    for f in sorted(folder.glob("*.safetensors.index.json")):
        _check_index(f)
    if safetensors:
        return
    for f in sorted(p for p in folder.glob("*.bin") if p.name.startswith(TORCH_WEIGHTS) and p.is_file()):
        _check_pickle(f)
    for f in sorted(folder.glob("*.bin.index.json")):
        _check_index(f)


def _check_safetensors(f: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(f), "pt"):
            pass
    except (SafetensorError, OSError) as exc:
        raise UsageError(f"{f}: not a readable safetensors file, truncated or damaged ({exc})") from exc


def _check_pickle(f: Path) -> None:
    import contextlib
    import pickle
    import warnings
    import zipfile

    skip = getattr(torch.serialization, "skip_data", None)  # no tensor data read, whatever the format
    try:
        with warnings.catch_warnings(), (skip() if skip else contextlib.nullcontext()):
            warnings.simplefilter("ignore")
            torch.load(f, weights_only=True, mmap=zipfile.is_zipfile(f) and skip is None, map_location="meta")
    except pickle.UnpicklingError as exc:
        found = [line for line in str(exc).splitlines() if "GLOBAL" in line]
        if not found:
            raise UsageError(f"{f}: not a torch weights file ({ascii(str(exc).splitlines()[0][:120])})") from exc
        raise UsageError(f"{f}: not a weights-only torch file, loading it would run code or build objects other than "
                         f"tensors ({ascii(found[0].strip().rstrip('.'))})") from exc
    except Exception as exc:  # torch reports a damaged file as RuntimeError, EOFError, OSError, ValueError...
        first = str(exc).strip().splitlines()[0].split(". ")[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{f}: not a readable torch weights file, truncated or damaged ({first})") from exc


def _check_index(f: Path) -> None:
    import json

    try:
        names = set(json.loads(f.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{f}: not a readable shard index (needs a weight_map of tensor -> file)") from exc
    missing = sorted(str(n) for n in names if not isinstance(n, str) or not (f.parent / n).is_file())
    if missing:
        raise UsageError(f"{f}: names {', '.join(missing)}, not in the folder")


def weight_file_bytes(path: str | Path) -> int:
    """Bytes of the weight files in a saved model folder, as stored on disk."""
    files = list(Path(path).glob("*.safetensors")) + list(Path(path).glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def load(path: Path, meta: dict[str, Any], dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Rebuild the architecture from config.json, rebuild each quantized layer from its stored tensors with the
    builder its spec names, then load the remaining tensors."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if hasattr(config, "transformers_weights"):  # the marker that turns plain transformers away (models.mark_llmx_only)
        delattr(config, "transformers_weights")
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # real init: non-persistent buffers (RoPE) need it
    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(f)))
    for name, spec in meta[KEY].items():
        prefix = name + "."
        local = {k[len(prefix):]: state.pop(k) for k in [k for k in state if k.startswith(prefix)]}
        try:
            layer = build_layer(spec, local, dtype, config)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[-1]
            raise UsageError(f"{path}: layer {name} does not match its stored spec ({first})") from exc
        replace_module(model, name, layer)
    missing, unexpected = model.load_state_dict(state, strict=False)
    quantized = tuple(n + "." for n in meta[KEY])
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if k not in tied and not k.startswith(quantized)]
    if missing or unexpected:
        what = f"missing {', '.join(missing[:4])}" if missing else f"unexpected {', '.join(unexpected[:4])}"
        raise UsageError(f"{path}: the weight files do not match the quantized architecture ({what})")
    model.tie_weights()
    for m in list(model.modules()):  # a stored layer that sets something model-wide (an attention implementation)
        if callable(getattr(m, "llmx_after_load", None)):
            m.llmx_after_load(model)
    return model.to(device)
