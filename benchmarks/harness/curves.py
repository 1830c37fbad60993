"""Learning curves of a study's runs (`curriculum.py`): a run's held-out curve as figures (before,
after, best, mean, time to each target accuracy), an arm's figures over its seeds, and the
curves drawn as a figure beside the page: each arm's held-out accuracy, every seed faint and
their mean bold, next to the moving mean of a per-step metric."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def curve_figures(
    curve: list[tuple[int, float]], seconds: dict[int, float], targets: list[float]
) -> dict[str, Any]:
    """A run's held-out curve ([(step, accuracy)], the start first) as figures: the accuracy
    before, after, at best and on average after the start (less noisy than one evaluation), per
    target the first evaluated step reaching it and the training seconds to it ([step, seconds];
    None unreached), and all its training seconds (`seconds`: each step's)."""

    def until(step: int) -> float:
        return sum(s for k, s in seconds.items() if k <= step)

    reach = [next((step for step, acc in curve if acc >= t), None) for t in targets]
    return {
        "before": curve[0][1],
        "after": curve[-1][1],
        "best": max(acc for _, acc in curve),
        "mean": statistics.fmean(acc for step, acc in curve if step > 0),
        "reach": [None if step is None else [step, until(step)] for step in reach],
        "train_s": until(max(seconds)),
    }


def over_seeds(runs: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    """An arm's figures over its seeds' runs (`curve_figures` and more): the mean of each of
    `keys`, and per target the runs that reached it ([reached, runs, their mean first step])."""
    firsts = [
        [r["reach"][i][0] for r in runs if r["reach"][i]] for i in range(len(runs[0]["reach"]))
    ]
    reach = [[len(f), len(runs), statistics.fmean(f) if f else None] for f in firsts]
    return {key: statistics.fmean(r[key] for r in runs) for key in keys} | {"reach": reach}


def plot_arms(
    path: Path, arms: dict[str, list[dict]], metric: str, title: str, window: int = 10
) -> None:
    """Write the PNG `path`: on the left each arm's runs' held-out curves ("curve": [(step,
    accuracy)], the same steps in every run) titled `title`, on the right the `window`-step
    mean of `metric` over the arm's runs ("steps": {step: {metric: value}}, steps 1..N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for index, (arm, runs) in enumerate(arms.items()):
        color = f"C{index}"
        for run in runs:
            left.plot(*zip(*run["curve"], strict=True), color=color, alpha=0.25)
        steps = [s for s, _ in runs[0]["curve"]]
        mean = [statistics.fmean(dict(r["curve"])[s] for r in runs) for s in steps]
        left.plot(steps, mean, color=color, marker="o", label=f"{arm} (mean of {len(runs)})")
        values = [[r["steps"][s][metric] for s in sorted(r["steps"])] for r in runs]
        smooth = [
            statistics.fmean(x for v in values for x in v[max(0, t + 1 - window) : t + 1])
            for t in range(len(values[0]))
        ]
        right.plot(range(1, len(smooth) + 1), smooth, color=color, label=arm)
    left.set(xlabel="step", ylabel="held-out greedy accuracy", title=title)
    right.set(xlabel="step", ylabel=f"{metric} ({window}-step mean)")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
