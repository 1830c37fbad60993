"""What a training process needs besides the algorithm: stop signals, per-step seeds,
deterministic kernels, a stage timer, host values' copy to the device and the host's memory."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch


def host_to_device(
    values: list[int] | list[float], device: torch.device, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """`values` as a `dtype` tensor on `device`, in one copy; on CUDA from pinned memory and
    without waiting (a blocking copy there waits for every kernel queued before it)."""
    # on the host on purpose: the values are Python's, and this is their one copy to the device
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


# A container sees its own cgroup at /sys/fs/cgroup: v2's limit, then v1's.
CGROUP_MEMORY_LIMITS = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def host_memory_bytes() -> int:
    """The memory this process's host gives it, in bytes: the physical memory, or a
    container's cgroup limit where that is lower ("max" or none: no limit)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as file:
                limit = file.read().strip()
        except OSError:
            continue
        return min(physical, int(limit)) if limit.isdigit() else physical
    return physical


def step_seed(seed: int, step: int, round_: int, rank: int) -> int:
    """The sampling seed of one round of one step on one rank.

    A pure function of (seed, step, round, rank): resuming at step k samples exactly what an
    uninterrupted run samples there, without saving any sampler state.
    """
    return (seed * 1_000_003 + step * 1_009 + round_ * 101 + rank * 7_919_993) % (2**63)


class NondeterministicOp(RuntimeError):
    """An op of a strict microbatch (`strictly_deterministic`) has no deterministic kernel;
    the microbatches after it run in warn-only mode."""


# Whether `strictly_deterministic` is strict: until an op without a deterministic kernel is
# met, in each `deterministic_kernels` span (one run).
_strict = [True]


@contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Deterministic kernels for the duration, then torch's previous settings. Atomic-add
    kernels (attention's backward, scatters) sum in a varying order on CUDA, and cuBLAS needs a
    fixed workspace, set before its first call in the process, to repeat its sums.

    Without filling uninitialised memory: deterministic mode otherwise writes NaN into every
    tensor made by `empty` (on CUDA, most ops' outputs and their backward's buffers too: a
    kernel each, thousands a step), which only makes a read of memory never written repeat;
    what a step computes never reads such memory (NaN would reach its results)."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        _strict[0] = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


@contextmanager
def strictly_deterministic() -> Iterator[None]:
    """Inside `deterministic_kernels`, a microbatch's forward and backward whose kernels are
    all deterministic: warn-only mode lets the memory-efficient attention's backward (what
    SDPA runs with a padding mask) split the keys and add the splits with atomics, so two
    runs' gradients differ in the last bits; strict mode makes it sum in one order. The
    forward is strict too: with gradient checkpointing the backward runs it again, and a
    compiled layer's code is specialised to the mode it ran under, so a forward in another
    mode than its recomputation would compile each layer's code twice. An op that has no
    deterministic kernel then raises `NondeterministicOp`, after one warning line: the caller
    redoes its microbatches, and this run's later ones are warn-only (a resumed run may then
    differ in the last bits, as before). Outside deterministic mode (the CPU,
    `run.deterministic=false`), nothing changes.
    """
    if not (
        _strict[0]
        and torch.are_deterministic_algorithms_enabled()
        and torch.is_deterministic_algorithms_warn_only_enabled()
    ):
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    except RuntimeError as error:
        if "deterministic" not in str(error):
            raise
        _strict[0] = False
        op = str(error).strip().splitlines()[0].split(", but you set")[0]
        print(
            f"warning: run.deterministic: {op}; the update goes on with torch's warn-only "
            "deterministic mode, so a resumed run may differ from an uninterrupted one in the "
            "last bits",
            file=sys.stderr,
        )
        raise NondeterministicOp(op) from error
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)


# What stops a run at its next step boundary, with a checkpoint: a scheduler's or a user's
# SIGTERM, Ctrl-C, a dropped ssh session (SIGHUP), a scheduler's early warning (SIGUSR1).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# A repeat of the first signal sooner than this is the same request delivered twice (a scheduler
# that signals every process of a job, the launcher forwarding it too), not a second request.
REPEAT_S = 0.5


@dataclass
class StopRequest:
    """What the stop signals asked of the run: `signum`, the first one (None: none came);
    `where` is what the acknowledgment says the run stops at ("after step 3")."""

    where: str = "before step 1"
    signum: int | None = None
    at: float = 0.0  # monotonic time of the first signal

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def status(self) -> int:
        """The exit status of a run this request ended before anything was saved."""
        return 128 + (self.signum or 0)


def write_stderr(text: str) -> None:
    """`text` and a newline straight to file descriptor 2: safe inside a signal handler (no
    buffered writer to re-enter), and a closed or hung-up stderr loses the line, nothing else."""
    with suppress(OSError):
        os.write(2, (text + "\n").encode(errors="replace"))


@contextmanager
def stop_on_signals(
    request_stop: Callable[[], None] | None = None, announce: bool = True
) -> Iterator[StopRequest]:
    """For the duration, SIGTERM, SIGINT, SIGHUP and SIGUSR1 ask the run to stop (the loop
    finishes its step, saves and exits) instead of killing it: the first one is recorded in
    the `StopRequest` yielded, calls `request_stop` and is acknowledged at once on stderr
    (with `announce`; "stopping after step N; signal again to abort"); a second one, of any of
    them, aborts the process at once with status 128 + its number, leaving every checkpoint
    already written whole (a save in progress is a hidden directory until it is complete).
    A repeat of the first signal within `REPEAT_S` seconds counts as the same request. The
    previous handlers come back after. A process forked inside (the reward worker) ignores
    the signals it has not set handlers of its own for: its parent decides when it stops."""
    stop = StopRequest()
    owner = os.getpid()

    def handler(signum: int, _frame: Any) -> None:
        if os.getpid() != owner:
            return
        now = time.monotonic()
        if stop.signum is None:
            stop.signum, stop.at = signum, now
            if announce:
                write_stderr(f"oncurve: {stop.name}: stopping {stop.where}; signal again to abort")
            if request_stop is not None:
                request_stop()
            return
        if signum == stop.signum and now - stop.at < REPEAT_S:
            return
        write_stderr(
            f"oncurve: {signal.Signals(signum).name} again: aborting (the checkpoints already "
            "written are kept)"
        )
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError, RuntimeError):
                stream.flush()
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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
