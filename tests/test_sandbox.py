"""The sandbox for generated code: each way out is stopped with its reason, and nothing is left behind."""

from __future__ import annotations

import os

import pytest

from llmx.core.eval.sandbox import Limits, run, run_many

QUICK = Limits(wall_seconds=5, cpu_seconds=1, memory_mb=256, file_mb=1)


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / "scratch"
    folder.mkdir()
    yield folder
    assert list(folder.iterdir()) == []  # the scratch folder of every run is gone


def test_a_program_that_runs_to_its_end_passes_and_one_that_raises_fails(root):
    ok = run("import math\nassert math.gcd(12, 18) == 6\nprint('done')", QUICK, root)
    assert ok.passed and ok.stdout.strip() == "done"
    bad = run("assert 1 + 1 == 3", QUICK, root)
    assert bad.status == "failed" and "AssertionError" in bad.reason


def test_an_endless_loop_is_killed_by_the_cpu_limit(root):
    o = run("while True:\n    pass", QUICK, root)
    assert o.status == "cpu" and "CPU-time limit" in o.reason and o.seconds < 4


def test_a_sleeper_is_killed_by_the_wall_clock(root):
    o = run("import time\ntime.sleep(60)", Limits(wall_seconds=1, cpu_seconds=5), root)
    assert o.status == "timeout" and "wall-clock" in o.reason and o.seconds < 5


@pytest.mark.parametrize("bomb", ["x = bytearray(8 << 30)", "a = []\nwhile True:\n    a.append(bytearray(1 << 20))"])
def test_a_memory_bomb_hits_the_memory_limit(root, bomb):
    o = run(bomb, QUICK, root)
    assert o.status == "memory" and "memory limit" in o.reason


@pytest.mark.parametrize("bomb,event", [("import os\nwhile True:\n    os.fork()", "os.fork"),
                                        ("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])",
                                         "subprocess.Popen"),
                                        ("import os\nos.system('echo hi')", "os.system")])
def test_a_fork_bomb_is_refused(root, bomb, event):
    o = run(bomb, QUICK, root)
    assert o.status == "forbidden" and event in o.reason


def test_writes_outside_the_folder_are_refused_and_do_not_happen(root, tmp_path):
    outside = tmp_path / "outside.txt"
    keep = tmp_path / "keep.txt"
    keep.write_text("k")
    programs = [f"open({str(outside)!r}, 'w').write('x')",
                f"import os\nos.open({str(outside)!r}, os.O_CREAT | os.O_WRONLY)",
                f"try:\n    open({str(outside)!r}, 'a')\nexcept BaseException:\n    pass",  # catching does not help
                f"import os\nos.remove({str(keep)!r})",
                f"import os\nos.symlink({str(keep)!r}, 'link')\nopen('link', 'w')",
                f"import sqlite3\nsqlite3.connect({str(outside)!r})",
                f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\nos.open('outside.txt', os.O_CREAT | os.O_WRONLY, "
                "dir_fd=fd)"]
    for program in programs:
        o = run(program, QUICK, root)
        assert o.status == "forbidden" and "outside the scratch folder" in o.reason, program
    assert not outside.exists() and keep.read_text() == "k"


def test_files_inside_the_folder_are_fine_but_size_is_limited(root):
    assert run("open('a.txt', 'w').write('x')\nimport tempfile\ntempfile.NamedTemporaryFile(delete=False)", QUICK,
               root).passed
    o = run("open('big', 'wb').write(b'x' * (4 << 20))", QUICK, root)
    assert o.status == "file_size" and "1 MiB" in o.reason


@pytest.mark.parametrize("program", ["import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))",
                                     "import socket\nsocket.gethostbyname('localhost')",
                                     "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')"])
def test_no_network(root, program):
    o = run(program, QUICK, root)
    assert o.status == "forbidden" and "socket" in o.reason
    assert o.network in ("namespace", "audit-hook")


def test_legitimate_programs_pass(root):
    """Threads, in-memory SQLite, a BLAS library and a __main__ guard are ordinary Python, not escapes."""
    assert run("import threading\nt = threading.Thread(target=print)\nt.start()\nt.join()", QUICK, root).passed
    assert run("import sqlite3\nsqlite3.connect(':memory:').execute('select 1')", QUICK, root).passed
    assert run("import numpy\nassert numpy.ones((64, 64)).dot(numpy.ones(64)).sum() == 64 * 64", QUICK, root).passed
    guarded = "if __name__ == '__main__':\n    raise SystemExit(3)"
    assert run(guarded, QUICK, root).status == "exited" and run(guarded, QUICK, root, module_name="judged").passed


def test_an_interrupted_caller_leaves_no_child_running(root, monkeypatch):
    import llmx.core.eval.sandbox as sandbox

    seen = []
    real = sandbox._reap

    def recording(proc):
        seen.append(proc.pid)
        return real(proc)

    monkeypatch.setattr(sandbox._reap.__globals__["os"], "waitid",
                        lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(sandbox, "_reap", recording)
    with pytest.raises(KeyboardInterrupt):
        run("import time\ntime.sleep(60)", QUICK, root)
    with pytest.raises(ProcessLookupError):
        os.kill(seen[0], 0)  # killed and reaped


def test_leaving_early_is_not_passing(root):
    assert run("import sys\nsys.exit(0)", QUICK, root).status == "exited"
    assert run("import os\nos._exit(0)", QUICK, root).status == "exited"


def test_run_many_keeps_the_order(root):
    out = run_many(["pass", "raise ValueError('x')", "pass"], QUICK, workers=2, root=root)
    assert [o.status for o in out] == ["passed", "failed", "passed"]


def test_the_child_gets_a_clean_environment(root, monkeypatch):
    monkeypatch.setenv("LLMX_SECRET", "s3cret")
    o = run("import os\nprint(sorted(os.environ))\nprint(os.getcwd())", QUICK, root)
    assert o.passed and "LLMX_SECRET" not in o.stdout and os.path.basename(str(root)) in o.stdout


def test_collect_reads_back_the_reply_file_left_in_the_folder_but_not_a_link(root):
    out = run("open('reply.json', 'w').write('x' * 20000)", QUICK, root, collect="reply.json")
    assert out.passed and out.collected == "x" * 20000  # past what stdout keeps
    link = run("import os\nos.symlink('/etc/hostname', 'reply.json')", QUICK, root, collect="reply.json")
    assert link.collected == ""
    assert run("pass", QUICK, root, collect="reply.json").collected == ""
