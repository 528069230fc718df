"""The sandbox's child, run as ``python -I -B sandbox_child.py CONFIG`` with the program on stdin (imports nothing from
llmx but ``plain``, by path, before it confines itself).

Three processes. The launcher (A) enters new mount, PID, network, IPC and UTS namespaces and, unless it is root, a new
user namespace (mapping one unprivileged uid, 1000 inside, to its own); it forks B, the PID namespace's init. B builds
a new root on a tmpfs: read-only binds of the system (``/usr``, ``/etc``, ``/lib*``, ``/bin``), the interpreter's
prefixes and the caller's ``packages``, a few device nodes, a fresh ``/proc`` of its own PID namespace (where the
kernel allows one), a size-limited tmpfs at ``/tmp`` (the program's folder); it pivots into it, detaches the old root,
makes every mount read-only but ``/tmp`` and forks C. C drops every capability (root's C becomes a uid of its own),
sets no new privileges and the resource limits, and runs the program: as a whole (``run``), or then serving calls of
its functions with plain values (``session``). B reports C's end on the status descriptor, which C never holds; when B
exits (or A dies, through B's parent-death signal) the kernel kills everything left in the namespace.

Without ``confine`` (the caller's explicit unsafe choice) A forks C directly: limits and a new session only. C's exit
codes: 0 ran to its end, 1 raised, 2 called exit, 3 out of memory, 4 a file too large, 5 its folder full.
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plain  # noqa: E402
import syscalls  # noqa: E402

del sys.path[0]

CLONE = {"user": 0x10000000, "mount": 0x20000, "pid": 0x20000000, "net": 0x40000000, "ipc": 0x8000000,
         "uts": 0x4000000}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, ATTR_RDONLY, ATTR_NOSUID = 2, -100, 0x8000, 1, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (Linux 5.12)
INSIDE_ID = 1000
OWN_UIDS = 1 << 30  # root's programs run as 2^30 + the launcher's pid: no user's uid, one per live sandbox
DEVICES = ("null", "zero", "full", "random", "urandom")
UNAVAILABLE = 125
FILES = 64  # open descriptors of each process
libc = ctypes.CDLL(None, use_errno=True)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    source = sys.stdin.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = cfg["status_fd"]

    def report(*words: object) -> None:
        os.write(status, (" ".join(" ".join(str(w).split()) for w in words)[:500] + "\n").encode())

    _die_with(cfg["caller"])
    if cfg["confine"]:
        try:
            enter(cfg)
        except OSError as e:
            report("unavailable", e)
            os._exit(UNAVAILABLE)
        alive, holder = os.pipe()
        init = os.fork()
        if init:  # A: wait for B, or die with the caller's kill of the group (B follows through its death signal)
            report("init", init)
            for fd in (alive, *cfg["channel_fds"]):
                os.close(fd)
            os._exit(_exit_code(os.waitpid(init, 0)[1]))
        os.close(holder)
        _libc_ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        if select.select([alive], [], [], 0)[0]:  # A ended before the death signal was set: its pipe is at EOF
            os._exit(UNAVAILABLE)
        os.close(alive)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the only signal with a handler: C shares B's uid on a user's path
        try:
            build_root(cfg)
            _libc_ok(libc.sethostname(b"sandbox", 7), "sethostname")
            _libc_ok(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl")  # C cannot ptrace its supervisor
            _libc_ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
            syscalls.install(libc, os.uname().machine)  # B's too: it only forks, waits and writes from here on
        except OSError as e:
            report("unavailable", e)
            os._exit(UNAVAILABLE)
    supervise(cfg, source, report)


def _die_with(caller: int) -> None:
    """A: killed when the caller's process ends, so a killed caller leaves no program running."""
    _libc_ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    if os.getppid() != caller:
        os._exit(UNAVAILABLE)


def enter(cfg: dict) -> None:
    """A: enter the namespaces. A user's process maps its uid to 1000 inside a new user namespace (which gives it the
    right to mount there); root needs no user namespace to mount, and its program later runs as a uid of its own
    (``program``): the kernel exempts uid 0 from the process limit, and root reads what others cannot."""
    rooted = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    flags = 0
    for name in cfg["namespaces"]:
        if name not in CLONE:
            raise OSError(errno.EINVAL, f"no {name} namespace")
        flags |= 0 if rooted and name == "user" else CLONE[name]
    _libc_ok(libc.unshare(flags), "unshare " + "+".join(cfg["namespaces"]))
    if rooted:
        cfg["program_uid"] = OWN_UIDS + os.getpid()  # unique while A lives: one process count per sandbox
        return
    for name, text in (("setgroups", "deny"), ("uid_map", f"{INSIDE_ID} {uid} 1"), ("gid_map", f"{INSIDE_ID} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def build_root(cfg: dict) -> None:
    """B: the new root on a tmpfs at the caller's empty folder, then pivot into it."""
    new = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    done: list[str] = []
    for src in cfg["system"] + cfg["binds"]:
        src = os.path.normpath(src)
        if not os.path.lexists(src) or any(src == d or src.startswith(d + "/") for d in done):
            continue
        if os.path.islink(src) and os.path.dirname(src) == "/":  # /bin -> usr/bin on merged-/usr systems
            os.symlink(os.readlink(src), new + src)
        else:
            os.makedirs(new + src, exist_ok=True)
            _mount(src, new + src, None, MS_BIND | MS_REC)
        done.append(src)
    for path in cfg["hidden"]:  # installed packages: only those the caller names are visible (at /packages)
        if os.path.isdir(new + path):
            _mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=0555")
    for name, src in cfg["packages"].items():
        os.makedirs(f"{new}/packages/{name}")
        _mount(src, f"{new}/packages/{name}", None, MS_BIND | MS_REC)
    os.makedirs(new + "/dev")
    for dev in DEVICES:
        if os.path.exists("/dev/" + dev):
            open(f"{new}/dev/{dev}", "w").close()
            _mount("/dev/" + dev, f"{new}/dev/{dev}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.symlink("/tmp", f"{new}/dev/shm")  # multiprocessing's semaphores, inside the folder's size limit
    os.makedirs(new + "/proc")
    os.makedirs(new + "/tmp")
    _mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['scratch_bytes']},mode=1777")
    os.makedirs(new + "/.old")
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(errno.ENOSYS, f"pivot_root on {os.uname().machine}")
    _libc_ok(libc.syscall(nr, new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    try:  # a /proc of this PID namespace; refused where the host's own /proc is partly masked (some containers)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    _libc_ok(libc.umount2(b"/.old", MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    _setattr("/", AT_RECURSIVE, ATTR_RDONLY | ATTR_NOSUID, 0)  # not nodev: the bound device nodes must open
    _setattr("/tmp", 0, 0, ATTR_RDONLY)
    os.chdir("/tmp")


def supervise(cfg: dict, source: str, report) -> None:
    """Fork C and wait for it (reaping orphans, as an init must); report its end with the CPU time it used."""
    report("ready")
    child = os.fork()
    if child == 0:
        os.close(cfg["status_fd"])
        program(cfg, source)
    for fd in cfg["channel_fds"]:
        os.close(fd)
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == child:
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            report("ended", how, f"{usage.ru_utime + usage.ru_stime:.3f}")
            os._exit(0)


def program(cfg: dict, source: str) -> None:
    """C: no capabilities, no new privileges, the limits (processes counted for its uid in its user namespace: the
    supervisor's two count there too, so two more are allowed; root's program has a uid of its own); then the
    program, and its calls when serving."""
    limits = [(resource.RLIMIT_AS, cfg["memory_bytes"]), (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
              (resource.RLIMIT_CORE, 0)]
    if cfg["confine"]:
        _libc_ok(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        own = cfg.get("program_uid")
        if own is not None:  # leaving uid 0 clears every capability
            os.setgroups([])
            os.setresgid(own, own, own)
            os.setresuid(own, own, own)
            _libc_ok(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl")  # its /proc/self stays its own
        limits.append((resource.RLIMIT_NPROC, cfg["processes"] + (0 if own is not None else 2)))
        limits.append((resource.RLIMIT_NOFILE, FILES))  # pipes hold memory the address-space limit does not count
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        _libc_ok(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _libc_ok(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl")
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_seconds"], cfg["cpu_seconds"] + 1))
    for which, value in limits:
        resource.setrlimit(which, (value, value))
    if cfg["packages"]:
        sys.path.insert(0, "/packages")
    scope = {"__name__": cfg["module_name"], "__builtins__": __builtins__}
    try:
        exec(compile(source, "<program>", "exec"), scope)  # noqa: S102 -- the program, confined
        if cfg["serve"]:
            serve(scope, cfg["request_fd"], cfg["reply_fd"])
    except MemoryError:
        _end(3, "MemoryError: the program exceeded its memory limit")
    except SystemExit as exc:
        _end(2, f"the program called exit({exc.code!r}) before its end")
    except BaseException as exc:  # noqa: BLE001 - the program's failure is the result
        traceback.print_exc()
        code = {errno.EFBIG: 4, errno.ENOSPC: 5}.get(getattr(exc, "errno", None), 1)
        _end(code, "")
    _end(0, "")


def serve(scope: dict, request_fd: int, reply_fd: int) -> None:
    """Answer ``[name, args, kwargs]`` lines with ``{"value": ...}`` or ``{"raised": [type, message]}`` until EOF."""
    requests = os.fdopen(request_fd, "rb")
    for line in requests:
        name, args, kwargs = plain.loads(line)
        try:
            reply = {"value": plain.encode(scope[name](*args, **kwargs))}
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the candidate's exception is the caller's to judge
            reply = {"raised": [type(exc).__name__, str(exc)[:500]]}
        data = (json.dumps(reply, allow_nan=True, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(reply_fd, data):]


def _end(code: int, message: str) -> None:
    if message:
        print(message, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            code = code or 4
    os._exit(code)


def _exit_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _mount(src, dst: str, fstype, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _libc_ok(libc.mount(enc(src), dst.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {dst}")


def _setattr(path: str, flags: int, set_: int, clear: int) -> None:
    attr = MountAttr(set_, clear, 0, 0)
    _libc_ok(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
             f"mount_setattr {path} (Linux 5.12 or later)")


def _libc_ok(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


if __name__ == "__main__":
    main()
