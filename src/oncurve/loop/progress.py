"""The live view of a run: a rich progress bar with reward, KL and length, or plain log lines;
and output that never stops a run (`guarded_output`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

LOG_EVERY = 10


def silence(stream: TextIO) -> bool:
    """Point `stream`'s file descriptor, and stdout's or stderr's where it is the same file
    (`2>&1 | head`), at /dev/null, and drop what its buffer holds there: the standard recipe
    for a reader gone (a closed pipe, a hung-up terminal), after which writes succeed unseen
    and the interpreter's flush at exit has nothing to complain about. False where `stream`
    has no descriptor of its own (a test's capture)."""
    try:
        fd = stream.fileno()
        broken = os.fstat(fd)
    except (OSError, ValueError, AttributeError):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for other in sorted({fd, 1, 2}):
            try:
                same = os.fstat(other)
            except OSError:
                continue
            if (same.st_dev, same.st_ino) == (broken.st_dev, broken.st_ino):
                os.dup2(devnull, other)
    finally:
        os.close(devnull)
    with suppress(OSError, ValueError):
        stream.flush()
    return True


class _Guarded:
    """A text stream whose first failed write or flush (`OSError`: EPIPE, EIO) silences it
    (`silence`) instead of raising: the run's output ends, the run goes on."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._dropped = False

    def write(self, text: str) -> int:
        if self._dropped:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError:
            self._dropped = not silence(self._stream)
            return len(text)

    def flush(self) -> None:
        if self._dropped:
            return
        try:
            self._stream.flush()
        except OSError:
            self._dropped = not silence(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded_output() -> Iterator[None]:
    """For the duration, `sys.stdout` and `sys.stderr` never raise on a write: a closed or
    hung-up one is silenced at its first failure (`silence`), so `... | head` ends the
    output, not the run. The streams come back after."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Guarded(before[0]), _Guarded(before[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


class Progress:
    """`with Progress(total, start, quiet) as p: p.update(step, metrics)`: a live bar, or log
    lines when `quiet` or stderr is not a terminal; nothing when not `enabled` (ranks > 0).
    Output that fails (a closed pipe) ends the display, never the run: lines go through
    `sys.stderr`, which `guarded_output` guards for a run."""

    def __init__(
        self, total: int, start: int = 0, quiet: bool = False, enabled: bool = True
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.quiet = quiet or not sys.stderr.isatty()
        self._bar: RichProgress | None = None
        self._task = None
        self._start = start
        self._began = time.perf_counter()

    def __enter__(self) -> Progress:
        if self.enabled and not self.quiet:
            self._bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                transient=False,
                console=Console(file=sys.stderr),  # stdout is the run's summary
            )
            self._bar.start()
            self._task = self._bar.add_task(
                "train", total=self.total, completed=self._start, stats=""
            )
        return self

    def update(self, step: int, metrics: dict[str, float]) -> None:
        kl = f"kl {metrics['kl']:.4f}  " if "kl" in metrics else ""  # none without a KL term
        stats = (
            f"reward {metrics.get('reward/mean', float('nan')):.3f}  {kl}"
            f"len {metrics.get('length/mean', 0.0):.1f}  "
            f"{metrics.get('time/step', 0.0):.2f}s/step"
        )
        if "memory/gpu_peak_gb" in metrics:
            stats += f"  {metrics['memory/gpu_peak_gb']:.1f} GiB"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, stats=stats)
        elif self.enabled and (step % LOG_EVERY == 0 or step == self.total):
            elapsed = time.perf_counter() - self._began
            print(f"step {step}/{self.total}  {stats}  {elapsed:.0f}s", file=sys.stderr, flush=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            try:
                self._bar.stop()
            except OSError:  # the terminal or pipe is gone: nothing left to show
                silence(sys.stderr)
