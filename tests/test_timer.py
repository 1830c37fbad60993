"""`process.Timer`: seconds per stage, summed over its entries, with the device's queued work
counted in the stage that queued it (`synchronize` at each stage's end)."""

from __future__ import annotations

import time

import pytest

from oncurve.process import Timer


def test_a_stage_waits_for_its_own_queued_work_before_the_clock_stops():
    waited = []

    def synchronize() -> None:  # stands in for the device finishing what the stage queued
        time.sleep(0.05)
        waited.append(True)

    timer = Timer(synchronize)
    with timer("reference"):
        pass
    with timer("train"):
        pass
    with timer("train"):
        pass
    assert len(waited) == 3
    assert timer.seconds["reference"] >= 0.05
    assert timer.seconds["train"] >= 0.1


def test_without_synchronize_a_stage_is_its_wall_time_and_an_error_still_counts():
    timer = Timer()
    with pytest.raises(ValueError), timer("rollout"):
        time.sleep(0.02)
        raise ValueError("stage failed")
    assert timer.seconds["rollout"] >= 0.02
    with timer("rollout"):
        pass
    assert set(timer.seconds) == {"rollout"}
