"""The reference zoo: small models trained from real text on the CPU, cached and verified.

``ref:NAME`` (``ref:llama``, ``ref:mamba2``, ...) loads the ``small`` preset, building it on first use; ``ref:NAME-test``,
``ref:NAME-bench``, ``ref:NAME-long`` and ``ref:NAME-medium`` select the other presets; ``llmx zoo build ARCH --data
FILE --name NAME`` builds one on your own text with your shape, addressable as ``ref:NAME``. An entry lives in
``$LLMX_CACHE_DIR/zoo`` (default ``~/.cache/llmx/zoo``) under a key hashed from everything that determines it
(architecture, resolved shape, seed, steps, the corpus' content and the tokenizer). A manifest of SHA-256 sums is
checked on every load; a corrupted entry is rebuilt, never used. Concurrent builds of one entry train it once.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.manifest import verify
from llmx.core.names import did_you_mean
from llmx.core.zoo import names
from llmx.core.zoo.cache import cache_root, info, locked
from llmx.core.zoo.corpus import Corpus, corpus, foreign_tokenizer, tokenizer_fingerprint
from llmx.core.zoo.request import ZOO_VERSION, RefRequest, builtin_names, parse_builtin
from llmx.errors import UsageError

log = logging.getLogger("llmx.zoo")


def resolve(req: RefRequest) -> tuple[Corpus, Any, Path]:
    """The corpus, the named tokenizer (None: one is trained) and the cache folder of ``req``."""
    corp = corpus(req)
    tok = foreign_tokenizer(req.tokenizer) if req.tokenizer else None
    return corp, tok, req.path(corp.fingerprint, tokenizer_fingerprint(tok) if tok is not None else None)


def provide(req: RefRequest, force: bool = False, show_progress: bool | None = None) -> tuple[Path, bool]:
    """The verified folder for ``req`` and whether this call built it (a corrupted entry is rebuilt; a second
    process asking for an entry being built waits for it). A named request binds its name to the folder."""
    corp, tok, path = resolve(req)
    built = False
    if force or verify(path) is not None:
        with locked(path):
            problem = "rebuild requested" if force else verify(path)
            if problem is not None:
                if problem not in ("missing", "rebuild requested"):
                    log.warning("zoo entry %s: %s; rebuilding it", path.name, problem)
                for left in atomic.leftovers(path):  # a killed build's; no one else writes it while we hold the lock
                    if left.is_dir():
                        shutil.rmtree(left, ignore_errors=True)
                    else:
                        left.unlink(missing_ok=True)
                _build(req, corp, tok, path, show_progress)
                built = True
    if not built:
        _check_environment(path)
    if req.name:
        names.bind(req.name, path, req)
    return path, built


_CHECKED: set[Path] = set()


def _check_environment(path: Path) -> None:
    """Warn once per entry when it was built under other versions or CPU kernels: it is reused (the key does not
    hold them, so that an upgrade does not rebuild every entry), but a build here would give other bits."""
    if path in _CHECKED:
        return
    _CHECKED.add(path)
    from llmx.core.zoo.build import environment

    then, now = info(path).get("environment"), environment()
    if then and then != now:
        changed = ", ".join(f"{k} {then.get(k)} -> {v}" for k, v in now.items() if then.get(k) != v)
        log.warning("zoo entry %s was built under other versions (%s): reused as built; --force rebuilds it here "
                    "(to other bits)", path.name, changed)


_SPENT = [0.0]  # seconds this process has spent in builds


def build_seconds() -> float:
    """Seconds this process has spent building entries so far: a run tells a build inside a model's load apart
    from the load (``RunContext``) and from its stage's own time."""
    return _SPENT[0]


def _build(req: RefRequest, corp: Corpus, tok: Any, path: Path, show_progress: bool | None) -> None:
    import time

    import torch

    from llmx.core.zoo.build import build

    t0 = time.perf_counter()
    try:
        with torch.inference_mode(False), torch.enable_grad():  # a caller may be inside inference mode
            build(req, corp, tok, path, show_progress)
    finally:
        _SPENT[0] += time.perf_counter() - t0


def ensure(req: RefRequest, force: bool = False, show_progress: bool | None = None) -> Path:
    """The verified cache folder for ``req``, built (or rebuilt, if corrupted) when needed."""
    return provide(req, force, show_progress)[0]


def known_names() -> list[str]:
    return [f"ref:{n}" for n in builtin_names() + list(names.bound())]


def locate(name: str) -> Path:
    """The verified folder of ``ref:NAME``: a name bound by ``--name`` or a built-in ``ARCH[-PRESET]``."""
    bare = name.removeprefix("ref:")
    bound = names.lookup(bare)
    if bound is not None:
        path = cache_root() / bound["entry"]
        problem = verify(path)
        if problem is None:
            _check_environment(path)
            return path
        req = RefRequest(**{"text_split": "legacy", **bound["request"]})  # names bound before text splits had units
        if resolve(req)[2].name != bound["entry"]:
            raise UsageError(f"ref:{bare}: entry {bound['entry']}: {problem}, and its data or tokenizer has changed "
                             "since it was built, so it cannot be built again as it was",
                             hint=f"Build it anew: llmx zoo build {req.arch} --data {req.data} ... --name {bare}")
        log.warning("ref:%s: entry %s: %s; building it again from its request", bare, bound["entry"], problem)
        return ensure(req)
    req = parse_builtin(bare)
    if req is None:
        known = known_names()
        raise UsageError(f"unknown model 'ref:{bare}'.{did_you_mean(f'ref:{bare}', known)}",
                         hint="Build your own with `llmx zoo build ARCH --data FILE --name NAME`.")
    return ensure(req)


def load(name: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """The ``ref:NAME`` model source: verified from the cache, built first if needed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmx.core.models import quiet_transformers, torch_dtype
    from llmx.core.multimodal import model as multimodal

    quiet_transformers()
    path = locate(name)
    if multimodal.is_vision_language(path):
        return multimodal.load(path, torch_dtype(dtype), device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), local_files_only=True)
    return model.to(device), AutoTokenizer.from_pretrained(path, local_files_only=True)


def _folders() -> list[Path]:
    root = cache_root()
    return [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")] if root.is_dir() else []


def entries() -> list[dict[str, Any]]:
    """Every cached entry with its names, corpus, shape and figures, and whether it verifies."""
    aliases: dict[str, list[str]] = {}
    for n, b in names.bound().items():
        aliases.setdefault(b["entry"], []).append(f"ref:{n}")
    builtin = {f"ref:{n}" for n in builtin_names()}
    out = []
    for entry in _folders():
        problem = verify(entry)
        data = info(entry) if problem is None else {}
        if data and data.get("zoo_version") != ZOO_VERSION:
            problem = f"stale: built by zoo version {data.get('zoo_version')}, never loaded now (llmx zoo rm it)"
        own = [data["name"]] if data.get("name") in builtin and problem is None else []
        out.append({**data, "entry": entry.name, "path": str(entry), "ok": problem is None, "problem": problem,
                    "names": sorted(set(aliases.get(entry.name, []) + own))})
    return out


def remove(targets: list[str]) -> list[str]:
    """Delete entries given as ``ref:NAME``, a bound name or an entry folder, and the names pointing to them; every
    target is checked before anything is removed. Returns the removed folders' names."""
    folders = {p.name: p for p in _folders()}
    chosen: list[Path] = []
    for target in targets:
        bare = target.removeprefix("ref:")
        bound = names.lookup(bare)
        if bound is not None:
            path = cache_root() / bound["entry"]
        elif bare in folders:
            path = folders[bare]
        elif parse_builtin(bare) is not None:
            path = resolve(parse_builtin(bare))[2]
            if not path.is_dir():
                raise UsageError(f"ref:{bare} is not in the cache")
        else:
            known = list(folders) + [f"ref:{n}" for n in names.bound()]
            raise UsageError(f"no zoo entry '{target}'.{did_you_mean(target, known)}", hint="See `llmx zoo list`.")
        chosen.append(path)
    for path in dict.fromkeys(chosen):
        with locked(path):
            shutil.rmtree(path, ignore_errors=True)
        for n, b in names.bound().items():
            if b["entry"] == path.name:
                names.unbind(n)
    return [p.name for p in dict.fromkeys(chosen)]
