"""Run generated code in a child process with limits, for judges that execute it (pass@k, ProSec's checks, FunBO).

What it does: a fresh interpreter (``python -I -B``, one thread for BLAS / OpenMP) in a new session, in a scratch
folder that is removed afterwards; limits on CPU time, address space, file size and core dumps (and processes, where
asked: ``RLIMIT_NPROC`` counts all of the user's processes and threads, and not at all for root); a wall-clock kill of
the whole process group, also when the caller is interrupted; its own network namespace where the kernel allows
unprivileged ones; an audit hook that stops the program (``forbidden``) when it forks, spawns, signals, connects,
binds, sends or resolves a name through a socket, loads a C library through ctypes, changes its limits, or writes,
removes or renames anything (a SQLite file included) outside its folder. A program passes only when it runs to its
end: a ``sys.exit`` or ``os._exit`` half-way fails. A caller's harness may name trusted modules to ``preload``: the
child imports them under the limits but before the hook, as a library's import-time work is not the program's (numpy
1.25 to 2.1.1 run ``lscpu`` when ``numpy.testing`` is imported, which scipy 1.10's ``stats`` and ``optimize`` do).

What it does not protect against: it is not a container. The program can read every file the user can; code in C
extensions it imports (numpy, say) is not audited; the audit hook lives in the same interpreter, so a program
written to escape it (through ``gc`` or frame introspection) can. Run code you would not run by hand in a container
or a VM.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
FORBIDDEN_CODE = 86
CAPTURED = 8192  # bytes of stdout / stderr kept
THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # one thread each, as the official harness


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    processes: int | None = None  # RLIMIT_NPROC, off by default (the audit hook refuses forks for everyone)


@dataclass(frozen=True)
class Outcome:
    status: str  # passed | failed | exited | timeout | cpu | memory | file_size | forbidden | crashed
    reason: str
    seconds: float
    stdout: str = ""
    stderr: str = ""
    network: str = ""  # namespace | audit-hook
    collected: str = ""  # the text of the ``collect`` file the program left in its folder, when asked for one

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run(source: str, limits: Limits = Limits(), root: str | Path | None = None, module_name: str = "__main__",
        collect: str | None = None, preload: Sequence[str] = ()) -> Outcome:
    """Run ``source`` as a program (its ``__name__`` is ``module_name``); the scratch folder is made under ``root``
    (the system temp folder by default). ``collect`` names a file the program writes in its folder (a reply larger
    than the captured stdout): read back, when it is a regular file, before the folder goes. ``preload`` names
    installed modules the child imports before the audit hook (never from the scratch folder, which is not on its
    path yet); one that fails to import fails the run."""
    scratch = tempfile.mkdtemp(prefix="llmx-sandbox-", dir=root)
    try:
        outcome = _run(source, limits, scratch, module_name, tuple(preload))
        return replace(outcome, collected=_collect(scratch, collect)) if collect else outcome
    finally:
        _remove(scratch)


def _collect(scratch: str, name: str) -> str:
    path = os.path.join(scratch, name)
    if os.path.islink(path) or not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def usable_cpus() -> int:
    """The CPUs this process may use (its affinity where the platform has one, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def cancelling_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A thread pool whose queued programs are dropped when the block raises (Ctrl-C, SIGTERM): only those already
    running finish, each within its own limits, instead of every queued one running before the process ends."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def run_many(sources: Sequence[str], limits: Limits = Limits(), workers: int | None = None,
             root: str | Path | None = None) -> list[Outcome]:
    """:func:`run` over ``sources`` on ``workers`` processes at a time (default: :func:`usable_cpus`), in order."""
    with cancelling_pool(workers or usable_cpus()) as pool:
        return list(pool.map(lambda s: run(s, limits, root), sources))


def _remove(folder: str) -> None:
    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=_writable)
    else:
        shutil.rmtree(folder, onerror=_writable)


def _writable(func, path, _exc) -> None:
    """rmtree's error handler: a program may leave folders without write permission; restore it and retry."""
    os.chmod(os.path.dirname(path), stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
    func(path)


def _run(source: str, limits: Limits, scratch: str, module_name: str, preload: tuple[str, ...] = ()) -> Outcome:
    program = os.path.join(scratch, "program.py")
    with open(program, "w", encoding="utf-8") as f:
        f.write(source)
    token = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    cfg = {"scratch": scratch, "program": program, "status_fd": write_end, "forbidden_code": FORBIDDEN_CODE,
           "cpu_seconds": int(limits.cpu_seconds), "memory_bytes": int(limits.memory_mb) << 20,
           "file_bytes": int(limits.file_mb) << 20, "processes": limits.processes, "module_name": module_name,
           "preload": list(preload)}
    env = {"PATH": os.defpath, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", **dict.fromkeys(THREADS, "1")}
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-B", str(CHILD), json.dumps(cfg)], stdin=subprocess.PIPE,
                                    stdout=out, stderr=err, cwd=scratch, env=env, pass_fds=(write_end,),
                                    start_new_session=True)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _kill_group(proc.pid)

        clock = threading.Timer(limits.wall_seconds, expire)
        try:
            try:
                proc.stdin.write(f"{token}\n".encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            clock.start()
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended but not reaped: its group id stays ours
        finally:
            clock.cancel()
            if clock.ident is not None:
                clock.join()  # an expiry already under way finishes before the child is reaped
            _kill_group(proc.pid)  # what the program left running, or the program itself when the caller is interrupted
            rc, cpu = _reap(proc)
            status = _drain(read_end)
        texts = [_tail(f) for f in (out, err)]
    network = next((line.split(" ", 1)[1] for line in status if line.startswith("network ")), "")
    status_, reason = _classify(rc, cpu, status, token, expired.is_set(), limits)
    return Outcome(status_, reason, time.monotonic() - start, texts[0], texts[1], network.strip())


def _reap(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for the child; its return code (minus the signal that killed it) and the CPU seconds it used."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _drain(fd: int) -> list[str]:
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").splitlines()


def _tail(f) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - CAPTURED, 0))
    return f.read().decode("utf-8", "replace")


def _classify(rc: int, cpu: float, status: list[str], token: str, timed_out: bool, limits: Limits) -> tuple[str, str]:
    outcome = next((line for line in reversed(status) if not line.startswith("network ")), "")
    kind, _, detail = outcome.partition(" ")
    if kind == "pass" and detail == token and rc == 0:
        return "passed", ""
    if timed_out:
        return "timeout", f"killed after {limits.wall_seconds:g} s of wall-clock time"
    if rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and cpu >= limits.cpu_seconds):
        return "cpu", f"CPU-time limit of {limits.cpu_seconds} s exceeded"
    if rc == -signal.SIGXFSZ or kind == "file_size":
        return "file_size", f"file-size limit of {limits.file_mb} MiB exceeded"
    if kind in ("forbidden", "memory"):
        return kind, detail or kind
    if kind == "exit":
        return "exited", detail
    if kind == "error":
        return "failed", detail
    if rc == -signal.SIGKILL:
        return "crashed", "killed by SIGKILL (the system's out-of-memory killer?)"
    if rc < 0:
        return "crashed", f"killed by {signal.Signals(-rc).name}"
    return "exited", f"the program stopped before its end (exit code {rc})"
