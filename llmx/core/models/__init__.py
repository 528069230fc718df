"""Model loading: named specs from plugins (``tiny:llama``), local folders (a saved model, or a PEFT adapter folder
loaded on its base model and merged), or Hugging Face ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmx.core.names import did_you_mean
from llmx.errors import UsageError


def no_model_error() -> UsageError:
    return UsageError("this pipeline needs a model: pass --model (a local folder, an HF id, tiny:llama or ref:llama)")


def quiet_transformers() -> None:
    """No tqdm bars from transformers' own loading and saving: llmx draws its own progress on stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def load(name: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Return ``(model, tokenizer)`` in eval mode on ``device``."""
    from llmx.core.plugins import host

    specs = host().models
    if name in specs:
        from llmx.core.spec import load_object

        model, tok = load_object(specs[name].impl)(name, dtype=dtype, device=device)
    else:
        namespace, sep, _ = name.partition(":")
        if sep and f"{namespace}:*" in specs:  # a source of open-ended names (ref:NAME): it resolves or explains
            from llmx.core.spec import load_object

            model, tok = load_object(specs[f"{namespace}:*"].impl)(name, dtype=dtype, device=device)
            return model.eval(), tok
        if sep and namespace in {s.split(":")[0] for s in specs}:
            known = sorted(s for s in specs if s.startswith(namespace + ":"))
            raise UsageError(f"unknown model '{name}'.{did_you_mean(name, known)}", hint=f"Known: {', '.join(known)}.")
        model, tok = _load_pretrained(name, dtype, device)
    return model.eval(), tok


def check_manifest(path: Path) -> None:
    """A folder llmx saved carries a SHA-256 manifest: every file must still match it."""
    from llmx.core import manifest

    if (path / manifest.SAVED).is_file() and (problem := manifest.verify(path, manifest.SAVED)):
        raise UsageError(f"{path}: {problem}; the folder changed after llmx saved it (damaged or edited)")


def known_names() -> list[str]:
    """Model names llmx resolves without a path: plugin sources and the zoo's (built-in and user-named)."""
    from llmx.core.plugins import host
    from llmx.core.zoo import known_names as zoo_names

    return sorted({n for n in host().models if not n.endswith(":*")} | set(zoo_names()))


def _load_pretrained(name: str, dtype: str, device: str) -> tuple[Any, Any]:
    path = Path(name).expanduser()
    local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if local:
        if not path.is_dir():
            raise UsageError(f"model folder not found: {name}")
        check_manifest(path)
        from llmx.core.train import adapters

        if adapters.is_adapter_folder(path):
            return adapters.load(path, read_metadata(path).get("source"), dtype, device)
        if not (path / "config.json").is_file():
            raise UsageError(f"{name} is not a model folder (no config.json)")
        from llmx.core.models.storage import check_weight_files

        check_weight_files(path)
    else:
        from llmx.core.models import hub

        hub.check(name, known_names())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    meta = read_metadata(path) if local else {}
    try:
        from llmx.core.models import storage

        if storage.KEY in meta:
            model = storage.load(path, meta, torch_dtype(dtype), device)
        elif _vision_language(path, name, local):
            from llmx.core.multimodal import model as multimodal

            return multimodal.load(str(path) if local else name, torch_dtype(dtype), device, local)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path) if local else name, dtype=torch_dtype(dtype),
                                                         local_files_only=local)
        tok = AutoTokenizer.from_pretrained(str(path) if local else name, local_files_only=local)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot load model '{name}': {first}") from exc
    return model.to(device), tok


def _vision_language(path: Path, name: str, local: bool) -> bool:
    """A LLaVA model (``model_type: llava``), loaded with its processor."""
    from llmx.core.multimodal.model import is_vision_language

    if local:
        return is_vision_language(path)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(name).model_type == "llava"


METADATA = "llmx.json"


def read_metadata(path: Path) -> dict[str, Any]:
    """``llmx.json`` of a saved model folder ({} when absent); unreadable is a usage error."""
    import json

    f = Path(path) / METADATA
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{f}: not valid JSON ({exc.msg})") from exc


def trained_length(name: str) -> int | None:
    """The context a model was trained at, where recorded: a zoo entry's preset (``ref:NAME`` or its folder), or a
    saved folder's ``llmx.json`` (``train_len``, else the lm stage's ``seq_len``); None otherwise."""
    import contextlib
    import json

    folder = Path(name).expanduser()
    if name.startswith("ref:"):
        from llmx.core import zoo

        with contextlib.suppress(UsageError, OSError):
            folder = zoo.locate(name)
    if not folder.is_dir():
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((folder / "zoo.json").read_text())["preset_spec"]["seq_len"])
    params = read_metadata(folder).get("params") or {}
    value = params.get("train_len") or params.get("seq_len")
    return int(value) if value else None


LLMX_ONLY = ("llmx-only folder: its packed layers (llmx.json) run in llmx, not in plain transformers. Load it with "
             "llmx (llmx.load(folder), --model folder), or convert it: llmx export folder out --format "
             "compressed-tensors")


def mark_llmx_only(config_file: Path) -> None:
    """Make plain ``transformers.from_pretrained`` refuse a folder of llmx-owned layers, with a message saying so.

    ``transformers_weights`` names the weight file transformers should load; a name that is not a safetensors file
    is a ValueError quoting it (transformers 5.x), before any weight loads. Without it, transformers builds the base
    architecture, skips the packed tensors with a warning and computes with random weights. llmx's own loader never
    reads the field, and transformers drops it whenever it saves a config again."""
    import json

    cfg = json.loads(config_file.read_text())
    cfg["transformers_weights"] = LLMX_ONLY
    config_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save(model: Any, tokenizer: Any, path: str | Path, metadata: dict[str, Any] | None = None,
         files: dict[str, bytes] | None = None, weights: Any = None) -> Path:
    """``save_pretrained`` (safetensors) into ``path`` atomically, with the tokenizer, ``llmx.json`` (llmx version
    and what produced the model), any extra ``files`` (name -> bytes) beside it, and a SHA-256 manifest of it all.
    ``weights(folder)``, when given, writes what ``save_pretrained`` would (a sharded model's config and weight files,
    ``core/models/shards.py``; an adapter from gathered tensors)."""
    import json

    from llmx import __version__
    from llmx.core import atomic, manifest
    from llmx.core.models.storage import KEY, layer_specs

    quiet_transformers()
    meta = {"llmx": __version__, **(metadata or {})}
    specs = layer_specs(model)
    if specs:
        meta[KEY] = specs
    with atomic.folder(path) as tmp:
        if weights is not None:
            weights(tmp)
            if specs:
                mark_llmx_only(tmp / "config.json")
        elif specs:  # packed layers: write the tensors exactly as they are (save_pretrained may recast them)
            from safetensors.torch import save_model

            model.config.save_pretrained(tmp)
            mark_llmx_only(tmp / "config.json")
            save_model(model, str(tmp / "model.safetensors"))
        else:
            model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / METADATA).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        manifest.write(tmp, manifest.SAVED)
    return Path(path)
