"""The default job (`make run`, `oncurve train` with no settings): its wall time from start to
final model and the held-out accuracy the trainer measures before step 1 and after the last.

    .venv/bin/python benchmarks/default_job.py
"""

from __future__ import annotations

import argparse
import os

from harness import learning
from harness.checkout import CACHE
from harness.tables import markdown_table, publish

NAME = "default_job"
TITLE = "The default job"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("settings", nargs="*", help="oncurve settings (none: the default job)")
    args = parser.parse_args()
    run = learning.train(args.settings, CACHE / NAME)
    # the held-out accuracies the run logged: before step 1, then after the last
    before, after = run["evals"][0][2], run["evals"][-1][2]
    row = {"renderer": NAME, "steps": len(run["seconds"]), "wall_s": run["wall_s"]}
    row |= {"rss_mb": run["rss_mb"], "accuracy_before": before, "accuracy_after": after}
    publish(NAME, TITLE, " ".join(args.settings) or "default", {**row, "cores": os.cpu_count()})


def minutes(seconds: float) -> str:
    """`1 min 34 s`."""
    return f"{int(seconds // 60)} min {round(seconds % 60)} s"


def summary(row: dict) -> str:
    """The run in one line: wall time and held-out accuracy before and after."""
    before, after = 100 * row["accuracy_before"], 100 * row["accuracy_after"]
    return f"{minutes(row['wall_s'])}; held-out {before:.1f}% -> {after:.1f}%"


def headline(row: dict) -> dict | None:
    """The README's row for the default job on the CPU (a run with settings has none)."""
    if row["key"] != "default" or "gpu" in row["machine"]:
        return None
    area = f"the default job, {row['cores']} CPU cores"
    return {"area": area, "figure": summary(row), "command": "make run"}


def section(row: dict) -> str:
    """One run's section of results/default_job.md."""
    cells = [row["date"], row["commit"], str(row["steps"]), minutes(row["wall_s"]),
             f"{row['rss_mb']:,.0f}", f"{100 * row['accuracy_before']:.1f}%",
             f"{100 * row['accuracy_after']:.1f}%"]  # fmt: skip
    header = ["date", "commit", "steps", "wall", "peak RSS MB", "held-out before", "after"]
    return f"`{row['command']}`\n\n" + markdown_table(header, [cells])


if __name__ == "__main__":
    main()
