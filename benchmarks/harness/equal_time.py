"""Held-out accuracy at equal training time, for a comparison of two trainers whose runs save
checkpoints (`grpo_vs_ppo.py`): the budget is the faster run's training time, and the slower run
is scored at its newest checkpoint within it."""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.children import greedy_accuracy


def budget_step(fast: list[float], slow: list[float], save_every: int) -> tuple[float, int]:
    """(the budget: the sum of `fast`'s seconds per step, the newest step the run of `slow`
    seconds per step saved within it; 0 if none)."""
    budget = sum(fast)
    elapsed, best = 0.0, 0
    for step, seconds in enumerate(slow, start=1):
        elapsed += seconds
        if elapsed > budget:
            break
        if step % save_every == 0 or step == len(slow):
            best = step
    return budget, best


def score_equal_time(
    runs: dict[str, list[dict]], save_every: int, tokens: int, test_file: Path, start: float
) -> None:
    """Add "equal_time" ({"step", "accuracy", "budget"}) to the runs of both trainers, pair by
    pair. The budget is the faster run's training time for all its steps (the sum of its
    `time/step`, without start-up, saving or logging); the faster run is scored at its last
    step, the slower at its newest checkpoint within the budget (at most one save interval
    short of the exact point, so the comparison never favours it; step 0: the starting model,
    whose accuracy is `start`), that checkpoint evaluated as `oncurve eval` loads it with
    `tokens` new tokens at most."""
    for pair in zip(*runs.values(), strict=True):
        fast, slow = sorted(pair, key=lambda run: sum(run["seconds"]))
        budget, step = budget_step(fast["seconds"], slow["seconds"], save_every)
        accuracy = slow["accuracy"] if step == len(slow["seconds"]) else start
        if 0 < step < len(slow["seconds"]):
            checkpoint = Path(slow["final"]).parent / "checkpoints" / f"step-{step:06d}"
            accuracy = greedy_accuracy(checkpoint, test_file, tokens)
        last = len(fast["seconds"])
        fast["equal_time"] = {"step": last, "accuracy": fast["accuracy"], "budget": budget}
        slow["equal_time"] = {"step": step, "accuracy": accuracy, "budget": budget}


def equal_time_means(runs: list[dict]) -> dict[str, float | None]:
    """One trainer's mean step and accuracy at equal time over its runs (None unscored)."""
    if not all("equal_time" in r for r in runs):
        return {"equal_step": None, "equal_acc": None}
    return {
        "equal_step": statistics.mean(r["equal_time"]["step"] for r in runs),
        "equal_acc": statistics.mean(r["equal_time"]["accuracy"] for r in runs),
    }


def equal_time_cell(run: dict) -> str:
    """A run's step and accuracy at equal time as a table cell ("n/a" unscored)."""
    if "equal_time" not in run:
        return "n/a"
    return f"{run['equal_time']['step']} / {run['equal_time']['accuracy']:.1%}"


def equal_time_note(runs: list[dict], steps: int, save_every: int) -> str:
    """What the equal-time figures of `runs` (one trainer's, scored) mean, with their mean
    budget, as a sentence of a section."""
    budget = statistics.mean(r["equal_time"]["budget"] for r in runs)
    return (
        "Equal wall-clock time: the budget is the faster trainer's training time for "
        f"{steps} steps (sum of `time/step`, mean {budget:.0f} s); the slower trainer is "
        f"scored at its newest checkpoint (saved every {save_every} steps) whose "
        "cumulative `time/step` fits in it (step 0 = the starting model)."
    )
