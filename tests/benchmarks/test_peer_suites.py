"""oncurve's strict `correct` on the peers' test suites (`peer_suites.py`) gives the verdicts its
newest record row holds: a change to the answer checker that turns any case of math-verify's,
TRL's or verl's suites from agreeing to disagreeing (or back) fails here until the benchmark is
run again and its row recorded."""

from __future__ import annotations

from harness.checkout import BENCHMARKS
from harness.peer_child import oncurve_checks
from harness.records import latest, read, read_jsonl
from peer_suites import NAME, SUITES, reference


def test_strict_verdicts_on_every_peer_suite_are_the_recorded_ones():
    recorded = latest(read(NAME))[""]["suites"]
    strict = oncurve_checks()["strict"]
    for suite, row in zip(SUITES["suites"], recorded, strict=True):
        assert row["name"] == suite["name"]
        cases = read_jsonl(BENCHMARKS / suite["cases"])
        assert len(cases) == row["cases"]
        disagreeing = set()
        for case in cases:
            gold = reference(case["gold"])
            paid = bool(strict({"prompt": None, "completion": case["prediction"], "gold": gold}))
            if paid != case["expected"]:
                disagreeing.add(f"{case['test']}#{case['index']}")
        expected = {w["test"] for w in row["disagreements"] if w["strict"] != w["expected"]}
        assert disagreeing == expected, suite["name"]
        assert len(cases) - len(disagreeing) == row["agree"]["strict"][0]
