"""The CPU comparison against TRL, held against a stored baseline: a regression a machine can
catch. `vs_trl.py` on the tiny model for 3 steps (about 5 minutes on 2 shared cores), oncurve's
s/step and peak RSS as fractions of TRL's, each at most the baseline plus its tolerance
(`vs_trl_tiny_baseline.json`, which says where its figures come from)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import vs_trl
from harness.trl_env import venv_python

BASELINE = Path(__file__).with_name("vs_trl_tiny_baseline.json")


@pytest.mark.slow
def test_the_tiny_comparison_holds_its_baseline():
    if not venv_python().exists():
        pytest.skip("no TRL venv: `python benchmarks/vs_trl.py --model tiny` creates it")
    baseline = json.loads(BASELINE.read_text())
    row = vs_trl.measure(argparse.Namespace(**baseline["args"]))
    ours, trl = (vs_trl.summarize(row, row["runs"][label]) for label in ("oncurve", "TRL"))
    found = {"s_per_step_vs_trl": ours["s"] / trl["s"], "peak_rss_vs_trl": ours["rss"] / trl["rss"]}
    for name, value in found.items():
        limit = baseline[name] + baseline["tolerance"][name]
        assert value <= limit, f"{name} {value:.2f}x, above the baseline's {limit:.2f}x"
