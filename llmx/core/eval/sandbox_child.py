"""The sandboxed child (run as ``python -I -B sandbox_child.py CONFIG``; imports nothing from llmx).

Order matters: read the pass token from stdin, leave the network namespace where the kernel allows it, set the
resource limits, import the caller's trusted ``preload`` modules, install the audit hook, then run the program.
Outcome lines go to the status descriptor: ``pass TOKEN`` only when the program ran to its end; ``forbidden``,
``memory``, ``file_size``, ``exit`` or ``error`` otherwise.
"""

import ctypes
import errno
import importlib
import json
import os
import resource
import sys
import traceback

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
FORBIDDEN_EVENTS = {
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "os.kill",
    "os.killpg", "pty.spawn", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo", "ctypes.dlopen", "ctypes.dlsym",
    "ctypes.call_function", "os.setuid", "os.setgid", "os.chroot", "resource.setrlimit", "resource.prlimit",
}
PATH_EVENTS = {  # event: indices of path arguments that must stay inside the scratch folder
    "os.remove": (0,), "os.rename": (0, 1), "os.replace": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
    "os.chown": (0,), "os.link": (0, 1), "os.symlink": (0, 1), "os.truncate": (0,), "os.utime": (0,),
    "shutil.rmtree": (0,), "shutil.move": (0, 1), "os.mkfifo": (0,), "os.mknod": (0,), "os.chflags": (0,),
    "sqlite3.connect": (0,),
}
IN_MEMORY = {":memory:", ""}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def main() -> None:
    cfg = json.loads(sys.argv[1])
    token = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    status = cfg["status_fd"]

    def report(kind: str, detail: str = "") -> None:
        os.write(status, f"{kind} {' '.join(detail.split())[:400]}\n".encode())

    libc = ctypes.CDLL(None, use_errno=True)
    isolated = libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    report("network", "namespace" if isolated else "audit-hook")
    scratch = os.path.realpath(cfg["scratch"])
    allowed = (scratch, os.devnull)
    limits = [(resource.RLIMIT_AS, cfg["memory_bytes"]), (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
              (resource.RLIMIT_CORE, 0)]
    if cfg["processes"] is not None:
        limits.append((resource.RLIMIT_NPROC, cfg["processes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    for which, value in limits:
        resource.setrlimit(which, (value, value))

    def inside(path) -> bool:
        if isinstance(path, int) or os.fsdecode(path) in IN_MEMORY:
            return True
        real = os.path.realpath(os.fsdecode(path))
        return any(real == a or real.startswith(a + os.sep) for a in allowed)

    def refuse(what: str) -> None:
        report("forbidden", what)
        os._exit(cfg["forbidden_code"])

    def hook(event: str, args: tuple) -> None:
        if event in FORBIDDEN_EVENTS:
            refuse(f"{event} is not allowed")
        elif event == "open":
            path, mode, flags = args
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
            if writing and not inside(path):
                refuse(f"writing {os.fsdecode(path)} (outside the scratch folder)")
        elif event in PATH_EVENTS:
            for i in PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    refuse(f"{event} {os.fsdecode(args[i])} (outside the scratch folder)")

    real_open = os.open

    def open_fd(path, flags, mode=0o777, *, dir_fd=None):  # the audit event does not carry dir_fd
        if dir_fd is not None and flags & WRITE_FLAGS and not os.path.isabs(os.fsdecode(path)):
            refuse(f"writing {os.fsdecode(path)} relative to a directory descriptor (it may be outside the scratch folder)")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with open(cfg["program"], encoding="utf-8") as f:
        source = f.read()
    for name in cfg["preload"]:  # trusted libraries, whose import-time work (numpy.testing's lscpu) is not the program's
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - reported as the run's error
            report("error", f"preloading {name}: {type(exc).__name__}: {exc}")
            os._exit(1)
    sys.path.insert(0, scratch)
    os.open = open_fd
    sys.addaudithook(hook)
    try:
        exec(compile(source, cfg["program"], "exec"), {"__name__": cfg["module_name"], "__builtins__": __builtins__})
    except MemoryError:
        report("memory", "MemoryError: the program exceeded its memory limit")
        os._exit(1)
    except SystemExit as exc:
        report("exit", f"the program called exit({exc.code!r}) before its end")
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - the program's failure is the result
        too_big = isinstance(exc, OSError) and exc.errno == errno.EFBIG  # Python ignores SIGXFSZ: writes fail instead
        report("file_size" if too_big else "error", "".join(traceback.format_exception_only(type(exc), exc)).strip())
        traceback.print_exc()
        os._exit(1)
    sys.stdout.flush()
    report("pass", token)
    os._exit(0)


main()
