"""Export: llmx's quantized models as folders that other tools load, shared by ``llmx export`` and the ``export``
pipeline stage. One format today, ``compressed-tensors`` (the llm-compressor checkpoint format, which plain
``transformers`` loads with the ``compressed-tensors`` package). A model the format cannot express is a one-line
UsageError before anything is written (:mod:`llmx.core.export.plan`); the folder is written beside its target, loaded
once by plain transformers on the meta device, and only then renamed into place, so a failed export leaves nothing.

    from llmx.core import export

    export.export_saved("runs/<run>/artifacts/0_rtn/model", "out/w4-ct")      # a saved folder, or its run folder
    plan = export.prepare(model)                                               # an in-memory model
    export.write(plan, model, tokenizer, "out/w4-ct")
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmx.errors import UsageError

if TYPE_CHECKING:
    from llmx.core.export.plan import Scheme

FORMATS = ("compressed-tensors",)
DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class Plan:
    """What :func:`write` will write: each quantized layer's scheme and the linear layers left in float."""

    format: str
    source: str
    schemes: dict[str, Scheme]
    ignore: list[str] = field(default_factory=list)


def require(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"unknown export format '{fmt}'; formats: {', '.join(FORMATS)}")
    from llmx.core.pipeline import require_modules

    require_modules(f"export --format {fmt}", ["compressed_tensors"])


def prepare(model: Any, fmt: str = "compressed-tensors", source: str = "the model") -> Plan:
    """Check that ``model`` can be written in ``fmt``, layer by layer, against its plain transformers architecture."""
    from llmx.core.export import plan
    from llmx.core.models.storage import layer_specs

    require(fmt)
    schemes = plan.schemes_from_specs(layer_specs(model), source)
    ignore = plan.check_model(model, schemes, model.config)
    return Plan(fmt, source, schemes, ignore)


def write(plan: Plan, model: Any, tokenizer: Any, target: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """Write the folder atomically (replacing ``target`` if it exists); with ``verify``, reload it with plain
    transformers and report the largest logit difference from ``model``."""
    from llmx import __version__
    from llmx.core import atomic, manifest
    from llmx.core.export import compressed_tensors
    from llmx.core.export.verify import check_loads
    from llmx.core.models import METADATA
    from llmx.core.models.storage import weight_file_bytes

    parent = Path(target).parent
    made_parent = not parent.exists()
    try:
        with atomic.folder(target) as tmp:
            written = compressed_tensors.write(model, tokenizer, tmp, plan.schemes, plan.ignore)
            check_loads(tmp, type(model).__name__)  # before the rename: a folder transformers refuses is never written
            counts: dict[str, int] = {}
            for s in plan.schemes.values():
                counts[s.describe()] = counts.get(s.describe(), 0) + 1
            info = {"format": plan.format, **written, "layers": len(plan.schemes), "schemes": counts}
            (tmp / METADATA).write_text(json.dumps({"llmx": __version__, "exported_from": plan.source, **info},
                                                   indent=2, default=str) + "\n")
            manifest.write(tmp, manifest.SAVED)
    except BaseException:
        if made_parent:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if still empty
        raise
    out = {"model_dir": str(target), **info, "stored_weight_bytes": weight_file_bytes(target)}
    if verify:
        from llmx.core.export.verify import max_logit_difference

        out["max_abs_logit_diff"] = max_logit_difference(model, target)
    return out


def model_folder(source: str | Path) -> Path:
    """A saved model folder, or the model a run folder saved last (``artifacts/<index>_<method>/model``), preferring
    one with llmx layers (a run that quantized and then exported holds both)."""
    from llmx.core.models import read_metadata
    from llmx.core.models.storage import KEY

    path = Path(source).expanduser()
    if not path.is_dir():
        raise UsageError(f"{source}: not a folder (export takes a saved model folder or the run folder that saved it)")
    if (path / "config.json").is_file():
        return path
    found = [p for p in (path / "artifacts").glob("*/model") if (p / "config.json").is_file()]
    if not found:
        raise UsageError(f"{source}: neither a model folder (no config.json) nor a run folder with a saved model")

    def rank(folder: Path) -> tuple[bool, int]:
        index = folder.parent.name.partition("_")[0]
        return KEY in read_metadata(folder), int(index) if index.isdigit() else -1

    return max(found, key=rank)


def saved_dtype(folder: Path) -> str:
    """The float dtype a saved folder's config records (float32 when it records none llmx loads)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{folder / 'config.json'}: unreadable ({exc})") from exc
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    return dtype if dtype in DTYPES else "float32"


def check_target(target: Path, source: Path, force: bool) -> None:
    target, source = target.expanduser().resolve(), source.resolve()
    if target == source or source.is_relative_to(target) or target.is_relative_to(source):
        raise UsageError(f"{target}: the export must go outside the model folder it reads ({source})")
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} exists and is not a folder")
    if target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to replace it")


def export_saved(source: str | Path, target: str | Path, *, fmt: str = "compressed-tensors", force: bool = False,
                 verify: bool = False, device: str = "cpu") -> dict[str, Any]:
    """Export a saved llmx folder (or a run folder's saved model). The stored layers are checked from ``llmx.json``
    before anything loads, then again on the loaded model; nothing is written unless every check passes."""
    from llmx.core import models
    from llmx.core.export import plan as checks
    from llmx.core.models.storage import KEY

    folder = model_folder(source)
    models.check_manifest(folder)
    checks.schemes_from_specs(models.read_metadata(folder).get(KEY, {}), str(folder))
    check_target(Path(target), folder, force)
    require(fmt)
    model, tokenizer = models.load(str(folder), dtype=saved_dtype(folder), device=device)
    return write(prepare(model, fmt, str(folder)), model, tokenizer, target, verify=verify)
