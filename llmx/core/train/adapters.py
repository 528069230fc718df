"""LoRA adapters through the real ``peft`` library: wrap a model, merge it into the base weights, and load a saved
adapter folder as ``--model``. ``core.models.save`` writes the folder: a ``PeftModel``'s ``save_pretrained`` writes
the adapter PEFT itself loads (``PeftModel.from_pretrained``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from llmx.core.train.params import LoraParams
from llmx.errors import MissingRequirement, UsageError, extra_hint

ADAPTER_CONFIG = "adapter_config.json"


def peft():
    """The ``peft`` module (exit 3 with the install hint when absent); bitsandbytes, which it imports, kept quiet."""
    import logging
    import warnings

    if importlib.util.find_spec("peft") is None:
        raise MissingRequirement("LoRA adapters need the Python package 'peft', which is not installed",
                                 hint=extra_hint("lora"))
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    import peft as module

    return module


def is_adapter_folder(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_peft(model: Any) -> bool:
    return type(model).__module__.startswith("peft.")


def wrap(model: Any, p: LoraParams) -> Any:
    """A ``PeftModel`` with a LoRA (or PiSSA-initialised) adapter on ``p.target_modules``; only the adapter's
    tensors train."""
    lib = peft()
    config = lib.LoraConfig(r=p.r, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=p.target_modules,
                            init_lora_weights="pissa" if p.init == "pissa" else True, task_type="CAUSAL_LM")
    try:
        return lib.get_peft_model(model, config)
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(f"cannot add a LoRA adapter: {first} (set lora.target_modules)") from exc


def merge(model: Any) -> Any:
    """The base model with the adapter folded into its weights (no PEFT layers left)."""
    return model.merge_and_unload()


def base_of(path: Path, source: str | None) -> str:
    """The base model of an adapter folder: llmx's ``source``, else PEFT's ``base_model_name_or_path``."""
    import json

    base = source or json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise UsageError(f"{path}: adapter folder names no base model")
    return base


def attach(path: Path, base: str | None, dtype: str, device: str, trainable: bool = False) -> tuple[Any, Any]:
    """A saved adapter folder on its base model (``llmx.json``'s ``source``, else PEFT's ``base_model_name_or_path``),
    as a ``PeftModel``, with the tokenizer saved beside the adapter."""

    lib = peft()
    from transformers import AutoTokenizer

    from llmx.core import models

    models.check_manifest(Path(path))
    base = base_of(path, base)
    model, tok = models.load(base, dtype=dtype, device=device)
    if (path / "tokenizer_config.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    try:
        wrapped = lib.PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot load adapter {path} on {base}: {first}") from exc
    return wrapped.to(device), tok


def load(path: Path, base: str | None, dtype: str, device: str) -> tuple[Any, Any]:
    """A saved adapter folder on its base model, merged (``--model ADAPTER_FOLDER``)."""
    model, tok = attach(path, base, dtype, device)
    return merge(model), tok
