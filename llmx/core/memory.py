"""Measured peak memory of a block of tensor work: ``with PeakMemory(device) as pm: ...`` then ``pm.peak_bytes``, the
most bytes held at once above what was held when the block began (transient tensors included).

CUDA: the caching allocator's statistics. CPU: PyTorch's profiler with memory profiling (every tensor allocation
and free in the block, summed in order); slower, so time work outside such a block.
"""

from __future__ import annotations

import torch


class PeakMemory:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._start
            return
        self._prof.__exit__(*exc)
        events = sorted((e.start_ns(), e.nbytes()) for e in self._prof.profiler.kineto_results.events()
                        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
        held = peak = 0
        for _, nbytes in events:
            held += nbytes
            peak = max(peak, held)
        self.peak_bytes = peak
