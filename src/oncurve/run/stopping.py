"""Stopping a run cleanly: SIGTERM, Ctrl-C, SIGHUP and SIGUSR1 ask the loop to finish its step,
save and exit; a second signal aborts."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

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
        if announce:
            write_stderr(
                f"oncurve: {signal.Signals(signum).name} again: aborting (the checkpoints "
                "already written are kept)"
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
