"""A model without its weights: the transformers config a name resolves to (nothing built, trained or downloaded) and
the model built from it on the meta device (shapes and dtypes only), with its LoRA adapter where asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmx.errors import UsageError


def model_config(name: str) -> Any:
    """The config of ``name``: ``tiny:ARCH`` and built-in ``ref:ARCH[-PRESET]`` from their presets (an unbuilt
    reference model stays unbuilt), a ``ref:NAME`` you built from its folder, a local folder's ``config.json`` (an
    adapter folder: its base's), or a hub id's cached ``config.json``."""
    from transformers import AutoConfig

    if name.startswith("tiny:"):
        from llmx.core.models.archs import ARCHS, config
        from llmx.core.tokenizer import byte_tokenizer

        arch = name.removeprefix("tiny:")
        if arch not in ARCHS:
            raise UsageError(f"unknown model '{name}'", hint=f"Known: {', '.join('tiny:' + a for a in ARCHS)}.")
        return config(arch, vocab_size=len(byte_tokenizer()))
    if name.startswith("ref:"):
        return _reference(name)
    path = Path(name).expanduser()
    if path.is_dir():
        from llmx.core.train import adapters

        if adapters.is_adapter_folder(path):
            from llmx.core.models import read_metadata

            return model_config(adapters.base_of(path, read_metadata(path).get("source")))
        if not (path / "config.json").is_file():
            raise UsageError(f"{name} is not a model folder (no config.json)")
        return _read(path / "config.json")
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise UsageError(f"model folder not found: {name}")
    from llmx.core.models import hub

    if not hub.cached(name):
        raise UsageError(f"model '{name}': no config.json in the local Hugging Face cache (nothing is downloaded to "
                         "plan)", hint="Pass a local folder holding its config.json.")
    return AutoConfig.from_pretrained(name, local_files_only=True)


def _read(file: Path) -> Any:
    from transformers import AutoConfig

    def floats(d: dict) -> Any:  # transformers writes infinities and NaN as {"__float__": "Infinity"}
        return float(d["__float__"]) if d.keys() == {"__float__"} else d

    try:
        return AutoConfig.for_model(**json.loads(file.read_text(), object_hook=floats))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"{file}: not a model config ({first})") from None


def _reference(name: str) -> Any:
    from llmx.core.zoo import names
    from llmx.core.zoo.cache import cache_root
    from llmx.core.zoo.request import parse_builtin

    bare = name.removeprefix("ref:")
    bound = names.lookup(bare)
    if bound is not None and (cache_root() / bound["entry"] / "config.json").is_file():
        return _read(cache_root() / bound["entry"] / "config.json")
    req = parse_builtin(bare)
    if req is None:
        from llmx.core.names import did_you_mean
        from llmx.core.zoo import known_names

        raise UsageError(f"unknown model '{name}'.{did_you_mean(name, known_names())}")
    return request_config(req)


def model_kind(name: str) -> str | None:
    """The ``model_type`` of ``name`` without loading or building it; an unbuilt multimodal reference model
    (``ref:llava``), which ``model_config`` does not plan, by its architecture."""
    if name.startswith("ref:"):
        from llmx.core.models.archs import ARCHS
        from llmx.core.zoo import names
        from llmx.core.zoo.request import parse_builtin

        req = parse_builtin(name.removeprefix("ref:")) if names.lookup(name.removeprefix("ref:")) is None else None
        if req is not None and req.arch not in ARCHS:
            return req.arch
    return getattr(model_config(name), "model_type", None)


def request_config(req: Any) -> Any:
    """The config of the reference model a ``RefRequest`` builds, as ``core/zoo/build.py`` makes it (its trained
    BPE has the preset's vocabulary), without building it."""
    from llmx.core.models.archs import ARCHS, config

    if req.arch not in ARCHS:
        raise UsageError(f"ref:{req.arch}: not a causal LM (only the text architectures {', '.join(ARCHS)} are planned)")
    spec = req.spec
    return config(req.arch, spec.vocab, spec.hidden, spec.layers, max_positions=max(1024, 2 * spec.seq_len),
                  heads=spec.heads, kv_heads=spec.kv_heads)


def meta_model(config: Any, lora: Any = None) -> Any:
    """``AutoModelForCausalLM.from_config`` on the meta device (no storage), in float32, with ``lora`` (a
    ``LoraParams``) applied through PEFT as ``llmx.core.train.adapters.wrap`` does (PiSSA's SVD init is not run: it
    does not change which tensors train)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"no causal LM for this config ({type(config).__name__}): {first}") from None
    if lora is not None:
        from llmx.core.train.adapters import wrap

        with torch.device("meta"):
            model = wrap(model, lora.model_copy(update={"init": "lora"}))
    return model
