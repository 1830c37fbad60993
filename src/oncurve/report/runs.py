"""The runs a report reads: each run directory's metrics as series, and the names it shows
(`readable`: the bytes of a name that is not UTF-8 as \\xNN)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from oncurve.errors import UserError
from oncurve.run.metrics import METRICS_FILE, iter_jsonl


@dataclass(eq=False)  # a run is itself: its arrays have no truth value to compare by
class Run:
    """The metrics of one run: metric name -> (steps [S], values [S]), sorted by step; the
    names of the metrics logged with no finite value (null at every step); and, for a series,
    the steps where it was null (non-finite), which it leaves out."""

    name: str
    path: Path
    series: dict[str, tuple[np.ndarray, np.ndarray]]
    non_finite: set[str] = field(default_factory=set)
    null_steps: dict[str, list[int]] = field(default_factory=dict)

    def keys(self, pattern: str) -> list[str]:
        """The names of this run's series that `pattern` matches in full, sorted."""
        return sorted(k for k in self.series if re.fullmatch(pattern, k))


def load_run(run_dir: Path, name: str | None = None) -> Run:
    """Read `run_dir/metrics.jsonl`; null (non-finite) values are skipped, a repeated (step, key)
    keeps the last value. Raises UserError naming the directory when there is nothing to read."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise UserError(f"{run_dir}: no {METRICS_FILE}; is it the run.dir of `oncurve train`?")
    values: dict[str, dict[int, float]] = {}
    nulls: dict[str, set[int]] = {}
    for row in iter_jsonl(path):
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, {})[row["step"]] = float(value)
            elif value is None:
                nulls.setdefault(key, set()).add(row["step"])
    if not values:
        if nulls:
            raise UserError(f"{run_dir}: every value in {METRICS_FILE} is null (non-finite)")
        raise UserError(f"{run_dir}: {METRICS_FILE} has no metrics yet (no step has finished)")
    series = {}
    for key, by_step in values.items():
        steps = np.array(sorted(by_step))
        series[key] = (steps, np.array([by_step[s] for s in steps.tolist()]))
    null_steps = {
        key: sorted(steps - values[key].keys())
        for key, steps in nulls.items()
        if key in values and steps - values[key].keys()
    }
    return Run(
        readable(name or run_dir.name), run_dir, series, set(nulls) - set(values), null_steps
    )


def readable(text: str) -> str:
    """`text` as UTF-8 can hold it: the bytes of a file name that is not UTF-8 (which Python
    holds as lone surrogates) as \\xNN, any other lone surrogate as \\uNNNN."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no file name's byte stands for
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def run_names(paths: list[Path]) -> list[str]:
    """Directory names, or parent/name when two runs share a name."""
    names = [p.resolve().name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    return names
