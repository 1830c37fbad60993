"""`benchmarks/gpu_curve.py` on the CPU: the time to reach an accuracy on a curve, the row's
figures with and without TRL, the steps read from a run being written
(`children.logged_steps`, whose seconds stop oncurve at its budget), and its page.
The comparison itself needs a GPU (`gpu_check.py`'s `curve` stage); its `--smoke` path on the
CPU is the `slow` test."""

from __future__ import annotations

import json
import subprocess
import sys

import gpu_curve
import pytest
from harness.checkout import BENCHMARKS, checkout_env
from harness.children import logged_steps


def test_the_time_to_trls_final_is_that_of_oncurves_first_checkpoint_at_it_or_above():
    trl = [[0.0, 0.2], [120.0, 0.5]]
    oncurve = [[0.0, 0.5], [30.0, 0.35], [60.0, 0.5], [90.0, 0.45], [120.0, 0.6]]
    assert gpu_curve.figures({"oncurve": oncurve, "TRL": trl})["reach_s"] == 60.0  # not the start
    oncurve[2][1] = 0.49
    assert gpu_curve.figures({"oncurve": oncurve, "TRL": trl})["reach_s"] == 120.0


def test_the_figures_hold_oncurves_time_to_trls_final_accuracy():
    curves = {"oncurve": [[0.0, 0.2], [20.0, 0.4], [45.0, 0.55]],
              "TRL": [[0.0, 0.2], [60.0, 0.3], [120.0, 0.5]]}  # fmt: skip
    assert gpu_curve.figures(curves) == {
        "trl_final": 0.5, "trl_seconds": 120.0, "reach_s": 45.0, "ratio": 45.0 / 120.0
    }  # fmt: skip
    curves["oncurve"][-1][1] = 0.45  # never at TRL's final accuracy
    assert gpu_curve.figures(curves)["reach_s"] is None
    assert gpu_curve.figures(curves)["ratio"] is None
    curves["TRL"][-1][1] = 0.2  # TRL no better than the start: nothing to reach
    assert gpu_curve.figures(curves)["ratio"] is None
    del curves["TRL"]
    assert set(gpu_curve.figures(curves).values()) == {None}


def test_the_steps_are_read_while_a_line_is_being_written(tmp_path):
    assert logged_steps(tmp_path) == []  # no metrics yet
    rows = [
        {"step": 1, "time/step": 1.5},
        {"step": 1, "eval/accuracy": 0.3},
        {"step": 2, "time/step": 2.0},
    ]
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "metrics.jsonl").write_text(lines + '{"step": 3, "time/st')
    assert [r["time/step"] for r in logged_steps(tmp_path)] == [1.5, 2.0]


def test_a_rows_page_gives_both_curves_and_the_target():
    row = {"key": "30m", "date": "2026-11-28", "commit": "abc", "gpu": "NVIDIA H100",
           "command": "python benchmarks/gpu_curve.py", "warm_accuracy": 0.2, "budget": 150.0,
           "save_every": 20,
           "curves": {"oncurve": [[0.0, 0.2], [45.0, 0.55]], "TRL": [[0.0, 0.2], [120.0, 0.5]]},
           "trl_final": 0.5, "trl_seconds": 120.0, "reach_s": 45.0, "ratio": 0.375}  # fmt: skip
    text = gpu_curve.section(row)
    assert "| oncurve | 45 | 20.0% | 55.0% | 45 s 55% |" in text
    assert "| TRL | 120 | 20.0% | 50.0% | 120 s 50% |" in text
    assert "45 s of TRL's 120 s = 0.38x: met" in text
    assert "checkpoints every 20 steps" in text
    assert gpu_curve.summary(row) == (
        "held-out accuracy oncurve 20.0% -> 55.0% in 45 s; TRL 20.0% -> 50.0% in 120 s; "
        "TRL's final reached in 0.38x its time"
    )


@pytest.mark.slow
def test_the_smoke_path_trains_for_its_budget_and_scores_every_checkpoint(tmp_path):
    out = tmp_path / "row.json"
    command = [sys.executable, str(BENCHMARKS / "gpu_curve.py"), "--smoke", "--json", str(out)]
    subprocess.run(command, check=True, env=checkout_env(), capture_output=True)
    row = json.loads(out.read_text())
    points = row["curves"]["oncurve"]
    assert points[0] == [0.0, row["warm_accuracy"]] and len(points) >= 2
    seconds = [s for s, _ in points]
    assert seconds == sorted(seconds) and seconds[-1] >= row["budget"]  # ran until its budget
    assert all(0.0 <= a <= 1.0 for _, a in points)
