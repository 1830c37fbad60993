"""Held-out accuracy at equal training time (`grpo_vs_ppo.py`): the slower run scored at its
newest checkpoint within the faster run's training time; as a section states it."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from harness import comparison
from harness.children import greedy_accuracy


def score_equal_time(
    runs: dict[str, list[dict]], save_every: int, tokens: int, test_file: Path, start: float
) -> None:
    """Add "equal_time" ({"step", "accuracy", "budget"}) to each pair of runs: the budget is the
    faster run's summed `time/step`; the slower is scored at its newest checkpoint within it
    (never favoured; step 0 scores `start`) by `oncurve eval` with `tokens` new tokens."""
    for pair in zip(*runs.values(), strict=True):
        fast, slow = sorted(pair, key=lambda run: sum(run["seconds"]))
        budget, last = sum(fast["seconds"]), len(slow["seconds"])
        elapsed = list(itertools.accumulate(slow["seconds"]))
        saved = [k for k in range(1, last + 1) if k % save_every == 0 or k == last]
        step = max((k for k in saved if elapsed[k - 1] <= budget), default=0)
        accuracy = slow["accuracy"] if step == last else start
        if 0 < step < last:
            checkpoint = Path(slow["final"]).parent / "checkpoints" / f"step-{step:06d}"
            accuracy = greedy_accuracy(checkpoint, test_file, tokens)
        whole = len(fast["seconds"])
        fast["equal_time"] = {"step": whole, "accuracy": fast["accuracy"], "budget": budget}
        slow["equal_time"] = {"step": step, "accuracy": accuracy, "budget": budget}


# the trainers' table's columns of `summary`
COLUMNS = [
    ("step at equal time", "equal_step", "g"),
    ("greedy acc. at equal time", "equal_acc", ".1%"),
]


def summary(runs: list[dict]) -> dict[str, Any]:
    """One trainer's `comparison.summary` over its runs, with its mean step ("equal_step") and
    accuracy ("equal_acc") at equal time (None unscored)."""
    scored = all("equal_time" in r for r in runs)
    means = {
        name: statistics.mean(r["equal_time"][key] for r in runs) if scored else None
        for name, key in (("equal_step", "step"), ("equal_acc", "accuracy"))
    }
    return comparison.summary(runs) | means


def equal_time_cell(run: dict) -> str:
    """A run's step and accuracy at equal time as a table cell ("n/a" unscored)."""
    if "equal_time" not in run:
        return "n/a"
    return f"{run['equal_time']['step']} / {run['equal_time']['accuracy']:.1%}"


def accuracy_notes(row: dict) -> tuple[str, str]:
    """A scored row's held-out accuracy as its section states it: a sentence (prompts, start,
    two standard errors) and a paragraph on the equal-time figures."""
    s, n, start = row["settings"], row["eval_n"], row["start"]
    first, second = (figures["acc"] for figures in row["trainers"].values())
    noise = comparison.two_errors((first + second) / 2, n)
    sentence = (f" Held-out greedy accuracy ({n} prompts, starting model {start:.1%}; two "
                f"binomial standard errors {noise:.1%}).")  # fmt: skip
    if start == 0 and first == 0 == second:
        sentence += (" Random weights: accuracy is 0 for both after so few steps; the "
                     "accuracy comparison is the bundled default's.")  # fmt: skip
    budget = statistics.mean(r["equal_time"]["budget"] for r in next(iter(row["runs"].values())))
    return sentence, (
        "Equal wall-clock time: the budget is the faster trainer's training time for "
        f"{s['run.steps']} steps (sum of `time/step`, mean {budget:.0f} s); the slower trainer "
        f"is scored at its newest checkpoint (saved every {s['run.save_every']} steps) whose "
        "cumulative `time/step` fits in it (step 0 = the starting model)."
    )
