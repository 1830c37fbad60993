"""Where a step's time and memory go: each stage timed (the device synchronised first) and the
CUDA peak read around it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class Timer:
    """Wall seconds per named stage, summed over the stage's entries, and with `peak_memory`
    each stage's peak of device memory; each stage is also a `record_function` range
    `oncurve/<name>`, so that a profile groups its ops by stage.

    Args:
        synchronize: called as each stage ends, before the clock is read: on CUDA
            `torch.cuda.synchronize`, so that a stage's seconds hold its own kernels, not the
            ones it only queued (which the next stage's first host read would wait for).
        peak_memory: returns the peak of allocated bytes since its last call and starts a new
            one (`cuda_peak_reader`); read as each stage begins and ends, so stages must not
            nest.
    """

    def __init__(
        self,
        synchronize: Callable[[], None] | None = None,
        peak_memory: Callable[[], int] | None = None,
    ) -> None:
        self.seconds: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}  # by stage, the largest of its entries
        self.synchronize = synchronize
        self.peak_memory = peak_memory
        self._overall_peak = 0

    def overall_peak(self) -> int:
        """The peak bytes since the first read: every stage's and the time between them."""
        if self.peak_memory is not None:
            self._overall_peak = max(self._overall_peak, self.peak_memory())
        return self._overall_peak

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.overall_peak()  # what came before the stage is not the stage's
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"oncurve/{name}"):
                yield
                if self.synchronize is not None:
                    self.synchronize()
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if self.peak_memory is not None:
                peak = self.peak_memory()
                self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), peak)
                self._overall_peak = max(self._overall_peak, peak)


def cuda_peak_reader(device: torch.device) -> Callable[[], int]:
    """`Timer`'s `peak_memory` on a CUDA `device`: torch's peak of allocated bytes, reset at
    each read (the allocator's own count, kept on the host: no wait for the device)."""

    def read() -> int:
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak

    return read
