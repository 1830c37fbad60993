"""What an oncurve run logged, read back: each step's phases, the sampler's compile and capture
seconds, and peak memory per phase, measured (metrics) and planned (the printed memory plan)."""

from __future__ import annotations

import re

# phase -> (the trainer's stage, whose peak a step logs as `memory/<stage>_peak_gb`; the memory
# plan's name for the phase in its printed line)
PEAK_PHASES = {
    "sampling": ("rollout", "sampling"),
    "reference": ("reference", "reference pass"),
    "update": ("train", "training"),
}


def step_phases(rows: list[dict]) -> dict[str, list[float]]:
    """Seconds per phase of each step, from an oncurve run's metrics rows: the `time/<phase>`
    keys the trainer wrote (reference only when beta > 0), in the order a step runs them."""
    names = [k for k in ("rollout", "reward", "reference", "train") if f"time/{k}" in rows[0]]
    return {k: [r[f"time/{k}"] for r in rows] for k in names}


def sampler_setup_seconds(row: dict) -> float | None:
    """The sampler's compile plus capture seconds so far, from a step's metrics (None without
    the `cuda_graph` sampler)."""
    if "time/sampler_compile_total" not in row:
        return None
    return row["time/sampler_compile_total"] + row["time/sampler_capture_total"]


def measured_phase_peaks_gb(rows: list[dict]) -> dict[str, float]:
    """The largest peak GiB of each phase over an oncurve run's steps (`PEAK_PHASES`; a
    phase the steps did not log, as on the CPU or with beta 0, is left out)."""
    peaks = {}
    for phase, (stage, _) in PEAK_PHASES.items():
        values = [r[f"memory/{stage}_peak_gb"] for r in rows if f"memory/{stage}_peak_gb" in r]
        if values:
            peaks[phase] = max(values)
    return peaks


def planned_phase_peaks_gb(log_text: str) -> dict[str, float]:
    """The peak GiB of each phase in the last memory plan an `oncurve train` process printed
    (`MemoryPlan.describe`); empty when it printed none."""
    lines = re.findall(r"memory plan: .*", log_text)
    if not lines:
        return {}
    found = dict(re.findall(r"(training|sampling|reference pass) ([0-9.]+)", lines[-1]))
    return {phase: float(found[name]) for phase, (_, name) in PEAK_PHASES.items() if name in found}


def planned_peak_gb(log_text: str) -> float | None:
    """The peak GiB of the memory plan an `oncurve train` process printed at start
    (`MemoryPlan.describe`), the last one in `log_text`; None when it printed none (the CPU)."""
    found = re.findall(r"memory plan: .*?predicted peak ([0-9.]+) GiB", log_text)
    return float(found[-1]) if found else None
