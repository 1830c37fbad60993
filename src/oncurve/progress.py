"""The live view of a run: a rich progress bar with reward, KL and length, or plain log lines."""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

LOG_EVERY = 10


class Progress:
    """`with Progress(total, start, quiet) as p: p.update(step, metrics)`: a live bar, or log
    lines when `quiet` or stderr is not a terminal; nothing when not `enabled` (ranks > 0)."""

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
            )
            self._bar.start()
            self._task = self._bar.add_task(
                "train", total=self.total, completed=self._start, stats=""
            )
        return self

    def update(self, step: int, metrics: dict[str, float]) -> None:
        stats = (
            f"reward {metrics.get('reward/mean', float('nan')):.3f}  "
            f"kl {metrics.get('kl', 0.0):.4f}  len {metrics.get('length/mean', 0.0):.1f}  "
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
            self._bar.stop()
