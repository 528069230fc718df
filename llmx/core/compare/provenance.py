"""What a finished comparison run must share with a new plan to be reused, beyond its resolved config: the model
folder and data files it read (names, sizes, modification times: a model retrained or a text edited in place), the
zoo entry a ``ref:`` name stands for, the llmx source it ran (a digest of the package's code: a fixed bug reruns
its arms) and the versions of the libraries that compute the figures. Each run's ``compare.json`` records them
with the machine it ran on."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

FILE = "compare.json"
SUFFIXES = (".txt", ".jsonl", ".json", ".tsv", ".csv", ".yaml", ".yml", ".safetensors", ".bin", ".pt", ".py")


def inputs(config: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint of a run's inputs (``config``: the resolved run's dict)."""
    from llmx.core.runs import versions

    found: dict[str, str] = {}
    model = str(config.get("model") or "")
    if model.startswith("ref:"):
        found[model] = _zoo_entry(model)
    elif model and Path(model).expanduser().exists():
        found[model] = _fingerprint(Path(model).expanduser())

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and value and value not in found and (
                path_like(value) and Path(value).expanduser().exists() or Path(value).is_file()):
            found[value] = _fingerprint(Path(value).expanduser())

    source = str((config.get("data") or {}).get("source") or "")
    if local_file(source) and Path(source).expanduser().is_file():  # the corpus, whatever its suffix
        found[source] = _fingerprint(Path(source).expanduser())
    walk({k: v for k, v in config.items() if k not in ("model", "output_dir")})
    stack = versions()
    return {"paths": found, "code": code_digest(),
            "versions": {k: stack.get(k) for k in ("llmx", "torch", "transformers")}}


def local_file(value: str) -> bool:
    """Whether a text source names a local file (not a built-in dataset or an ``hf:`` hub dataset)."""
    from llmx.core.plugins import host

    return bool(value) and not value.startswith("hf:") and value not in host().datasets and (
        path_like(value) or Path(value).expanduser().is_file())


def path_like(value: str) -> bool:
    """A string meant as a path: with a separator, a leading ``.``/``~`` or a file suffix (never ``train``, ``stdlib``)."""
    return "/" in value or value.startswith((".", "~")) or value.lower().endswith(SUFFIXES)


def _fingerprint(path: Path) -> str:
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if path.is_dir() else f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


@functools.cache
def _zoo_entry(name: str) -> str:
    """The cache entry ``ref:NAME`` stands for (its key digests the request, corpus and tokenizer), built or not."""
    from llmx.core.zoo import names, resolve
    from llmx.core.zoo.request import parse_builtin

    bare = name.removeprefix("ref:")
    bound = names.lookup(bare)
    if bound is not None:
        return str(bound["entry"])
    req = parse_builtin(bare)
    return resolve(req)[2].name if req is not None else name


@functools.cache
def code_digest() -> str:
    """A digest of llmx's own source (its Python, CUDA kernels and data files), read once per process."""
    import llmx

    root = Path(llmx.__file__).parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cu", ".cuh", ".yaml", ".json")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
