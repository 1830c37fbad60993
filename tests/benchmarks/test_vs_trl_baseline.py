"""The CPU comparison against TRL held against a stored baseline: `vs_trl.py` on the tiny model
(about 3 minutes on 2 cores), oncurve's s/step and peak RSS as fractions of TRL's, each at most
the baseline plus its tolerance (`vs_trl_tiny_baseline.json` says where its figures come from).
Peak RSS is held always; s/step only when the machine was quiet at the start (1-minute load below
half its cores: the comparison's own runs then load every core), since other work on shared
cores slows one trainer's run and not the other's."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import vs_trl
from harness.machine import load_average
from harness.trl_env import venv_python

BASELINE = Path(__file__).with_name("vs_trl_tiny_baseline.json")


@pytest.mark.slow
def test_the_tiny_comparison_holds_its_baseline():
    if not venv_python().exists():
        pytest.skip("no TRL venv: `python benchmarks/vs_trl.py --model tiny` creates it")
    baseline = json.loads(BASELINE.read_text())
    quiet = load_average()[0] < (os.cpu_count() or 1) / 2
    row = vs_trl.measure(argparse.Namespace(**baseline["args"]))
    ours, trl = row["trainers"]["oncurve"], row["trainers"]["TRL"]
    found = {"s_per_step_vs_trl": ours["s"] / trl["s"], "peak_rss_vs_trl": ours["rss"] / trl["rss"]}
    if not quiet:
        del found["s_per_step_vs_trl"]
    for name, value in found.items():
        limit = baseline[name] + baseline["tolerance"][name]
        assert value <= limit, f"{name} {value:.2f}x, above the baseline's {limit:.2f}x"
