"""Measured peak memory of a block of tensor work, transient tensors included:

    with PeakMemory(device) as pm:
        setup()              # allocations here are tracked too, so their frees inside the section count
        with pm.section():
            work()
    pm.peak_bytes            # the most bytes held at once during the section, above what was held when it began

CUDA: the caching allocator's statistics. CPU: PyTorch's profiler with memory profiling (every tensor allocation
and free, summed in order; a tensor allocated before the profiler started has no recorded free, hence the setup
inside the block); slower, so time work outside such a block. Its start and stop are quiet: kineto logs a
``USDT: ... profiler_start`` / ``profiler_stop`` line to the process's stderr at each, at a level no
``KINETO_LOG_LEVEL`` short of silencing its errors too hides, so those two lines are filtered out of what the
C++ side writes then (anything else it writes is passed on); a ``KINETO_LOG_LEVEL`` in the environment keeps
them, as kineto's own setting.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

import torch

MARK = "llmx::peak_section"
_KINETO_NOISE = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def _quiet_profiler_log():
    """Filter kineto's ``profiler_start``/``profiler_stop`` lines out of what is written to fd 2 in the block;
    everything else written there is written back when it ends. A ``KINETO_LOG_LEVEL`` set keeps them."""
    if "KINETO_LOG_LEVEL" in os.environ:
        yield
        return
    saved = sink = None
    try:
        with contextlib.suppress(AttributeError):  # sys.stderr is None when fd 2 was closed
            sys.stderr.flush()
        saved = os.dup(2)
        sink = tempfile.TemporaryFile()
    except (OSError, ValueError):  # no fd 2 to redirect, no room for the sink: nothing filtered
        if saved is not None:
            os.close(saved)
        yield
        return
    with sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True) if not _KINETO_NOISE.match(line)]
            if kept:
                os.write(2, b"".join(kept))


class PeakMemory:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.base_bytes = 0  # what was held when the section began (CPU: tensors allocated since the block began)

    def __enter__(self) -> PeakMemory:
        if self.device.type != "cuda":
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with _quiet_profiler_log():
                self._prof.__enter__()
        return self

    @contextlib.contextmanager
    def section(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            start = self.base_bytes = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - start
            return
        with torch.profiler.record_function(MARK):
            yield

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            return
        with _quiet_profiler_log():
            self._prof.__exit__(*exc)
        events = self._prof.profiler.kineto_results.events()
        marks = [e for e in events if e.name() == MARK]
        if not marks:
            return
        start, end = marks[0].start_ns(), marks[0].end_ns()
        memory = sorted((e.start_ns(), -e.nbytes()) for e in events
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        held = base = peak = 0
        for t, freed in memory:  # allocations before frees at one timestamp: never an understated peak
            if t > end:
                break
            held -= freed
            if t < start:
                base = peak = held
            else:
                peak = max(peak, held)
        self.base_bytes, self.peak_bytes = base, max(peak - base, 0)


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (``ru_maxrss``), in bytes."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024
