"""PeakMemory on the CPU starts and stops torch's profiler without kineto's ``USDT ... profiler_start`` lines on
stderr (issue 66), and what else is written to stderr meanwhile still gets there."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, torch
    from llmx.core.memory import PeakMemory, _quiet_profiler_log
    with PeakMemory("cpu") as pm:
        with pm.section():
            x = torch.randn(256, 256) @ torch.randn(256, 256)
    assert pm.peak_bytes > 0
    with _quiet_profiler_log():
        os.write(2, b"USDT:2026-01-01 00:00:00 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
        os.write(2, b"a real error line\\n")
    print("done")
""")


def _run(env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)


def test_peak_memory_profiler_is_silent_on_stderr():
    out = _run()
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout
    assert "USDT" not in out.stderr and "profiler_start" not in out.stderr and "profiler_stop" not in out.stderr
    assert "a real error line" in out.stderr  # only kineto's start/stop lines are dropped


def test_kineto_log_level_set_keeps_the_lines():
    out = _run({"KINETO_LOG_LEVEL": "0"})
    assert out.returncode == 0, out.stderr
    assert "profiler_start" in out.stderr
