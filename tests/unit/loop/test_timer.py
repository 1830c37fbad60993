"""`process.Timer`: seconds per stage, summed over its entries, with the device's queued work
counted in the stage that queued it (`synchronize` at each stage's end), and each stage's
peak of device memory (`peak_memory`)."""

from __future__ import annotations

import time

import pytest

from oncurve.loop.timer import Timer


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


def test_each_stage_gets_its_own_peak_and_the_step_the_largest_of_all():
    """`peak_memory` (stands in for CUDA's peak counter, reset at each read): a stage's peak
    is what was allocated at most during it, not before it (the time between stages counts
    in the overall peak only); a stage entered twice keeps the larger of its peaks."""
    allocated = [0]
    peak = [0]

    def allocate(nbytes: int) -> None:
        allocated[0] += nbytes
        peak[0] = max(peak[0], allocated[0])

    def read() -> int:
        value, peak[0] = peak[0], allocated[0]
        return value

    timer = Timer(peak_memory=read)
    allocate(100)  # before any stage
    allocate(-100)
    with timer("rollout"):
        allocate(30)
        allocate(-30)
    allocate(70)  # between stages: counted in the overall peak only
    allocate(-60)
    with timer("train"):  # starts with 10 allocated
        allocate(40)
        allocate(-40)
    with pytest.raises(ValueError), timer("train"):
        allocate(20)
        raise ValueError("out of memory")
    assert timer.peak_bytes == {"rollout": 30, "train": 50}
    assert timer.overall_peak() == 100
    allocate(500)
    assert timer.overall_peak() == 530
    assert Timer().overall_peak() == 0 and Timer().peak_bytes == {}
