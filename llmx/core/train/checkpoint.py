"""Resumable training checkpoints: the trained tensors, the optimiser, the step and every RNG state (CPU, CUDA,
Python, NumPy).

The loop's checkpoints are torch's distributed checkpoint (``torch.distributed.checkpoint``): a folder
``step_<n>/`` where each process writes its own shard of every tensor (FSDP's shards; a replicated tensor once), so no
process ever builds the whole state in memory, and a resume at another world size reads back just the slices it
holds. ``checkpoint.json`` beside them holds the step, the identity and the optimiser's non-tensor state; the RNG
states are one small file per rank. DCP keeps its index as a pickle: it is read here with an unpickler that admits
only DCP's metadata classes, and a checkpoint whose entries are not all tensors is refused, so no code runs on load
(as ``torch.load(weights_only=True)`` for the single-file checkpoints of a series, ``training_state.pt``)."""

from __future__ import annotations

import io
import json
import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from llmx.core import atomic
from llmx.errors import UsageError

LATEST = "latest"
STATE, INFO = "training_state.pt", "checkpoint.json"  # a series checkpoint's optimiser state and its description
DCP_INDEX = ".metadata"  # what marks a folder as a distributed checkpoint


def rng_state() -> dict[str, Any]:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def state_bytes(step: int, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                identity: dict[str, Any] | None = None) -> bytes:
    """``identity``: what the checkpoint belongs to (the model and the stage's params), checked on resume."""
    buf = io.BytesIO()
    torch.save({"step": step, "params": {k: v.detach().cpu().clone() for k, v in named.items()},
                "optimizer": opt.state_dict(), "rng": rng_state(), "identity": identity or {}}, buf)
    return buf.getvalue()


def check_identity(state: dict[str, Any], identity: dict[str, Any] | None, source: Path) -> None:
    """A resumed checkpoint must be this run's: the same model and the same params (those that may change on resume,
    such as ``steps`` or ``resume`` itself, excluded by the caller); say what differs."""
    saved = state.get("identity") or {}
    if not identity or not saved:
        return
    if saved.get("model") != identity.get("model"):
        raise UsageError(f"resume: {source} was trained on model {saved.get('model')!r}, this run uses "
                         f"{identity.get('model')!r}")
    old, new = saved.get("params") or {}, identity.get("params") or {}
    differ = [k for k in sorted(old) if k in new and old[k] != new[k]]  # a param added since is not a difference
    if differ:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in differ[:4])
        raise UsageError(f"resume: {source} belongs to a run with other settings ({shown})",
                         hint="Resume with the checkpoint's settings, or start a new run without resume.")


def _tensors(named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """What DCP writes (every tensor, by name: ``params.<name>``, ``optim.<index>.<key>``) and what goes to
    ``checkpoint.json`` (the optimiser's param groups and any non-tensor state)."""
    state = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {f"params.{k}": p.detach() for k, p in named.items()}
    plain: dict[str, dict] = {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
            else:
                plain.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "state": plain}


def save(folder: Path, step: int, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
         keep: int | None = None, identity: dict[str, Any] | None = None) -> Path:
    """``folder/step_<n>/`` (a distributed checkpoint, written by every rank: all of them call this) and
    ``folder/latest`` naming it; with ``keep``, older checkpoints beyond the newest ``keep`` are removed. Written
    into a scratch folder that rank 0 renames once every rank's shard is in, so a killed save leaves no
    ``step_<n>``."""
    import shutil

    import torch.distributed.checkpoint as dcp

    from llmx.core.train.distributed import barrier, world

    rank, size = world()
    target, scratch = folder / f"step_{step}", folder / f".step_{step}.partial"
    if rank == 0:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    barrier()
    tensors, rest = _tensors(named, opt)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(single process|process group|ProcessGroup).*")
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(scratch), single_file_per_rank=True))
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    atomic.write_bytes(scratch / f"rng_{rank}.pt", buf.getvalue())
    barrier()
    if rank == 0:
        info = {"step": step, "world_size": size, "identity": identity or {}, "optimizer": rest}
        atomic.write_text(scratch / INFO, json.dumps(info, default=str) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        scratch.rename(target)
        atomic.write_text(folder / LATEST, target.name + "\n")
        if keep:
            steps = sorted((p for p in folder.glob("step_*") if _step_of(p.name) is not None), key=lambda p: _step_of(p.name))
            for old in steps[:-keep]:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
    barrier()
    return target


def _step_of(name: str) -> int | None:
    import re

    match = re.fullmatch(r"step_(\d+)(?:\.pt)?", name)
    return int(match.group(1)) if match else None


def resolve(path: Path) -> Path:
    """A checkpoint: a distributed checkpoint folder, the one a folder's ``latest`` names, a single-file checkpoint,
    or a series checkpoint's ``training_state.pt``."""
    if path.is_dir():
        if (path / DCP_INDEX).is_file():
            return path
        if (path / STATE).is_file():
            return path / STATE
        latest = path / LATEST
        if not latest.is_file():
            raise UsageError(f"no checkpoint in {path} (no '{LATEST}', '{STATE}' or distributed checkpoint)")
        path = path / latest.read_text().strip()
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path}")
    if path.is_dir() and not (path / DCP_INDEX).is_file():
        raise UsageError(f"{path}: not a checkpoint (no {DCP_INDEX} index)")
    return path


def resumed_step(path: Path) -> int:
    """The step a checkpoint holds: from its name (``step_<n>``), a series checkpoint's ``checkpoint.json``, or
    else the checkpoint itself."""
    path = resolve(Path(path))
    if (step := _step_of(path.name)) is not None:
        return step
    info = path.parent / INFO
    if path.name == STATE and info.is_file():
        return int(json.loads(info.read_text())["step"])
    return int(describe(path)["step"])


def stage_folder(path: Path) -> Path | None:
    """The stage artifact folder that wrote a checkpoint (``checkpoints/step_<n>`` or
    ``series/tokens_<n>/training_state.pt`` inside it); None for a checkpoint kept anywhere else."""
    path = resolve(Path(path)).resolve()
    if path.name == STATE and path.parent.parent.name == "series":
        return path.parents[2]
    if path.parent.name == "checkpoints":
        return path.parents[1]
    return None


def load(path: Path) -> dict[str, Any]:
    """Read a single-file checkpoint with ``weights_only=True``; anything that is not plain tensors and containers
    is refused."""
    path = resolve(Path(path))
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - unpickling raises many types; the user needs one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{path}: not a loadable llmx checkpoint ({first})") from exc


def describe(path: Path) -> dict[str, Any]:
    """A checkpoint's step and identity (what ``check_identity`` reads), without its tensors for a distributed one."""
    path = resolve(Path(path))
    if not path.is_dir():
        return load(path)
    try:
        return json.loads((path / INFO).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a loadable llmx checkpoint (its {INFO} is missing or damaged)") from exc


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's index, with only the classes DCP writes into it, each named exactly (no dotted names: protocol 4 would
    resolve ``pathlib`` + ``os.system``)."""

    NAMES = {("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
        "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")} | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
        ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and "." not in name and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in self.NAMES or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")


def _reader(path: Path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    class Reader(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            try:
                with open(path / DCP_INDEX, "rb") as f:
                    meta = _MetadataUnpickler(f).load()
            except Exception as exc:  # noqa: BLE001 - a damaged or hostile index: one line
                raise UsageError(f"{path}: not a loadable llmx checkpoint ({exc})") from exc
            odd = [k for k, v in meta.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)]
            if odd:
                raise UsageError(f"{path}: the checkpoint holds non-tensor entries ({odd[0]}); refused (they would "
                                 "be unpickled)")
            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return Reader(str(path))


def restore(path: Path, named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer) -> int:
    """Copy a checkpoint into the trained tensors, the optimiser and the RNGs; return its step. A distributed
    checkpoint is read into the tensors as they are now laid out (sharded or whole), whatever world size wrote it."""
    path = resolve(Path(path))
    if not path.is_dir():
        return _restore_file(load(path), named, opt, path)
    import torch.distributed.checkpoint as dcp

    from llmx.core.train.distributed import world

    reader = _reader(path)
    meta = reader.read_metadata().state_dict_metadata
    info = describe(path)
    saved = {k.removeprefix("params."): v.size for k, v in meta.items() if k.startswith("params.")}
    _check_names(saved, named, path)
    by_index = {i: p for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    dest: dict[str, torch.Tensor] = {f"params.{k}": p.detach() for k, p in named.items()}
    for key, md in meta.items():
        if not key.startswith("optim."):
            continue
        index, name = key.removeprefix("optim.").split(".", 1)
        p = by_index.get(int(index))
        if p is None:
            raise UsageError(f"checkpoint {path} does not match the optimiser (it has state for tensor {index})")
        like = p.detach()  # a moment shaped like its tensor (sharded the same way); a step count on the CPU (torch's
        # AdamW keeps it there unless capturable, and load_state_dict moves it where the optimiser wants it)
        if name == "step":
            dest[key] = torch.zeros(md.size, dtype=md.properties.dtype, device="cpu")
        elif tuple(md.size) == tuple(p.shape):
            dest[key] = torch.zeros_like(like, dtype=md.properties.dtype)
        else:
            dest[key] = torch.zeros(md.size, dtype=md.properties.dtype, device=_local_device(p))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(single process|process group|ProcessGroup).*")
        dcp.load(dest, storage_reader=reader)
    state: dict[int, dict[str, Any]] = {}
    for key, value in dest.items():
        if key.startswith("optim."):
            index, name = key.removeprefix("optim.").split(".", 1)
            state.setdefault(int(index), {})[name] = value
    for index, rest in info["optimizer"]["state"].items():
        state.setdefault(int(index), {}).update(rest)
    opt.load_state_dict({"state": state, "param_groups": info["optimizer"]["param_groups"]})
    rank = world()[0]
    rng = path / f"rng_{rank}.pt"
    if rng.is_file():  # a rank the saving run did not have keeps its own (each micro-batch is seeded by its index)
        set_rng_state(torch.load(rng, weights_only=True))
    return int(info["step"])


def _local_device(p: torch.Tensor) -> torch.device:
    return p.to_local().device if hasattr(p, "to_local") else p.device


def _check_names(saved: dict[str, Any], named: dict[str, torch.nn.Parameter], source: Path) -> None:
    missing, extra = sorted(set(named) - set(saved)), sorted(set(saved) - set(named))
    if missing or extra:
        what = f"lacks {', '.join(missing[:3])}" if missing else f"has unknown {', '.join(extra[:3])}"
        raise UsageError(f"checkpoint {source} does not match the trained tensors (it {what})")
    for k, p in named.items():
        if tuple(saved[k]) != tuple(p.shape):
            raise UsageError(f"checkpoint {source}: {k} has shape {tuple(saved[k])}, the model {tuple(p.shape)}")


def _restore_file(state: dict[str, Any], named: dict[str, torch.nn.Parameter], opt: torch.optim.Optimizer,
                  source: Path) -> int:
    """A single-file checkpoint (a series' ``training_state.pt``): whole tensors."""
    _check_names({k: v.shape for k, v in state["params"].items()}, named, source)
    if any(hasattr(p, "device_mesh") for p in named.values()):
        raise UsageError(f"{source}: a single-file checkpoint resumes without sharding (strategy: ddp)")
    with torch.no_grad():
        for k, p in named.items():
            p.copy_(state["params"][k])
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    return int(state["step"])
