"""Run folders: ``runs/<utc>_<name>_<hash8>/`` with config.yaml, meta.json, metrics.json, log.txt."""

from __future__ import annotations

import functools
import getpass
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.config import ResolvedRun
from llmx.errors import UsageError

CONFIG, META, METRICS, LOG = "config.yaml", "meta.json", "metrics.json", "log.txt"
LOCK = ".running.lock"


def create(run: ResolvedRun, rank: int = 0) -> Path:
    """Make a fresh run folder and write the resolved config into it (``..._rank<N>`` for ranks above 0 under
    torchrun, so processes never write into one another's folder)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    root = Path(run.config.output_dir)
    path = root / f"{stamp}_{run.config.name}_{run.digest()}{f'_rank{rank}' if rank else ''}"
    try:
        path.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        raise UsageError(f"cannot create run folder {path}: {exc.strerror or exc}") from exc
    atomic.write_text(path / CONFIG, run.to_yaml())
    return path


def versions() -> dict[str, str]:
    """Python's and the stack's versions; llmx's from the package itself (a checkout on ``PYTHONPATH`` has no
    metadata), CuPy's under whichever CUDA build is installed. Read once per process."""
    return dict(_versions())


@functools.cache
def _versions() -> dict[str, str]:
    from llmx import __version__

    out = {"python": platform.python_version(), "llmx": __version__}
    for key in ("torch", "transformers", "pydantic", "typer", "pluggy", "bitsandbytes", "cupy", "tokenizers"):
        for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if key == "cupy" else (key,):
            try:
                out[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


@functools.cache
def git_commit() -> str | None:
    """The commit of the llmx source tree when it is a git checkout (with ``+dirty`` if modified when first asked:
    once per process, two ``git`` calls being as slow as a small evaluation)."""
    src = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def start_meta(run: ResolvedRun) -> dict[str, Any]:
    return {
        "status": "running",
        "name": run.config.name,
        "seed": run.config.seed,
        "device": run.config.device,
        "config_hash": run.digest(),
        "started": datetime.now(timezone.utc).isoformat(),
        "argv": sys.argv,
        "versions": versions(),
        "git_commit": git_commit(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
                 "user": getpass.getuser(), "pid": os.getpid()},
        "_t0": time.time(),
    }


def finish_meta(path: Path, meta: dict[str, Any], status: str, error: str | None = None) -> None:
    meta = dict(meta)
    t0 = meta.pop("_t0", time.time())
    meta.update(status=status, finished=datetime.now(timezone.utc).isoformat(), seconds=round(time.time() - t0, 3))
    if error:
        meta["error"] = error
    atomic.write_json(path / META, meta)


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    atomic.write_json(path / META, {k: v for k, v in meta.items() if not k.startswith("_")})


def hold(folder: Path) -> Any:
    """Take the run's lock (``.running.lock``) for as long as it runs (``drop`` it at the end, which removes the
    file): a lock, unlike a pid, is seen across containers that share a host name but not a process table, and the
    kernel drops it however the process ends (a killed run leaves the file, which is how ``sweep`` finds it)."""
    return take(folder / LOCK)


def _fd(lock: Any) -> int | None:
    """The descriptor a held ``FileLock`` locks (None where filelock fell back to a soft lock or keeps it elsewhere:
    then the file is left in place, as before)."""
    context = getattr(lock, "_context", None)
    if context is None or getattr(context, "soft_fallback", False):
        return None
    fd = getattr(context, "lock_file_fd", None)
    return fd if isinstance(fd, int) else None


def _current(lock: Any) -> bool:
    """Whether the held lock's file is still linked (its last holder may have removed it while we waited on it:
    then holding it excludes no one). Only ``drop`` unlinks a lock file, so a linked one is the one at the path;
    the link count, unlike inode numbers, reads the same through every filesystem (some FUSE mounts renumber)."""
    fd = _fd(lock)
    if fd is None:
        return True
    try:
        return os.fstat(fd).st_nlink > 0
    except OSError:
        return False


def take(path: Path, timeout: float = -1) -> Any:
    """A held ``filelock.FileLock`` on ``path`` (``timeout=0``: raise ``filelock.Timeout`` at once if another
    process holds it). Lock files are removed by their last holder (``drop``), so a waiter may wake holding a file
    no longer at the path: it lets go and takes the path's current file again, so two processes never both hold it."""
    from filelock import FileLock

    while True:
        lock = FileLock(str(path))
        lock.acquire(timeout=timeout)
        if _current(lock):
            return lock
        lock.release()


def drop(lock: Any) -> None:
    """Release ``lock`` and remove its file. The file is unlinked while still held, never after release: a process
    that takes the path afterwards creates a fresh file, and one that waited on the old file sees it gone (``take``)
    and retries; unlinking after release could remove a file another process had just locked."""
    if lock.is_locked and _fd(lock) is not None and _current(lock):
        try:
            os.unlink(lock.lock_file)
        except OSError:
            pass
    lock.release()


def sweep(root: Path) -> list[Path]:
    """Runs under ``root`` whose process died (killed mid-run: ``meta.json`` still says ``running`` and no process
    holds its lock; a run without a lock file, from before locks, counts as alive) are marked ``died`` and their
    half-written ``.tmp`` leftovers removed, all while holding the dead run's lock, whose file then goes. Returns
    them; a run folder this process may not write is left as it is."""
    import shutil

    from filelock import Timeout

    died = []
    for meta_file in sorted(root.glob(f"*/{META}")) if root.is_dir() else []:
        folder = meta_file.parent
        try:
            if json.loads(meta_file.read_text()).get("status") != "running" or not (folder / LOCK).is_file():
                continue
            lock = take(folder / LOCK, timeout=0)
        except (OSError, json.JSONDecodeError, Timeout):
            continue
        try:
            meta = json.loads(meta_file.read_text())  # again, holding the lock: the run may have just finished
            if meta.get("status") != "running":
                continue
            for left in sorted(folder.rglob(".*.tmp"), reverse=True):
                if left.is_dir():
                    shutil.rmtree(left)
                else:
                    left.unlink(missing_ok=True)
            atomic.write_json(meta_file, {**meta, "status": "died"})
        except (OSError, json.JSONDecodeError):
            continue
        finally:
            drop(lock)
        died.append(folder)
    return died


def records(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a ``metrics.jsonl`` (a killed run may leave its last line half-written)."""
    out = []
    for line in path.read_text(errors="replace").split("\n"):  # not splitlines(): U+2028 may sit in a string
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read(path: str | Path) -> dict[str, Any]:
    """Load a finished or partial run folder for ``llmx report``."""
    p = Path(path)
    if not (p / CONFIG).is_file():
        raise UsageError(f"not a run folder (no {CONFIG}): {p}")
    out: dict[str, Any] = {"path": str(p), "meta": {}, "metrics": {}}
    for key, name in (("meta", META), ("metrics", METRICS)):
        f = p / name
        if f.is_file():
            try:
                out[key] = json.loads(f.read_text())
            except json.JSONDecodeError as exc:
                raise UsageError(f"{f}: not valid JSON ({exc.msg})") from exc
    return out
