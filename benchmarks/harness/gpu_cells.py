"""Cells of the GPU check's table (`gpu_check.py`): GiB that may be missing, a target met or
missed, the memory plan's peaks against the measured ones, the sampler's compile and capture
seconds against their target."""

from __future__ import annotations

COMPILE_CAPTURE_TARGET = 30  # seconds a run spends compiling and capturing its sampler, at most


def gib(value: float | None) -> str:
    """`0.33 GiB`, or "n/a" when not measured."""
    return "n/a" if value is None else f"{value:.2f} GiB"


def met(done: bool) -> str:
    """Whether a target was met, in a word."""
    return "met" if done else "missed"


def phase_peaks(measured: dict[str, float], planned: dict[str, float]) -> str:
    """Each phase's measured peak against the plan's (`harness.run_logs.PEAK_PHASES`), GiB."""
    pairs = [
        f"{phase} {value:.2f} / {gib(planned.get(phase))}" for phase, value in measured.items()
    ]
    return ", ".join(pairs) or "n/a"


def plan_against(plan: float | None, measured: float | None) -> str:
    """The plan's predicted peak (GiB, to 0.1 as the trainer prints it) against the measured."""
    if plan is None or measured is None:
        return f"{gib(plan)} / {gib(measured)}"
    return f"{plan:.1f} / {measured:.2f} GiB ({plan - measured:+.2f} GiB)"


def compile_capture(seconds: float | None) -> str:
    """A run's compile plus capture seconds against `COMPILE_CAPTURE_TARGET`."""
    if seconds is None:
        return "n/a"
    target = COMPILE_CAPTURE_TARGET
    return f"{seconds:.1f} s (target <= {target} s: {met(seconds <= target)})"
