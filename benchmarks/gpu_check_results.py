"""pytest plugin of `gpu_check.py`'s tests stage: `--results-jsonl PATH` appends one JSON line
per test as its result comes in, {"test": node id, "outcome": passed | failed | skipped,
"seconds": its call's (its setup's when that ended it)}, with a failure's "message" (its error's line) and "detail" (the end of its report), so that a run
stopped at the stage's time limit still says what it got done and why a test failed (pytest
writes its JUnit XML only at the end). With pytest-xdist the controller writes, not the
workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

_results: Path | None = None
DETAIL_LINES = 60


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--results-jsonl", help="append each test's outcome to this file")


def pytest_configure(config: pytest.Config) -> None:
    global _results
    path = config.getoption("results_jsonl")
    if path and not hasattr(config, "workerinput"):  # an xdist worker's config has it
        _results = Path(path)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # a test's outcome: its call's, or its setup's when that failed or skipped it
    ended = report.when == "call" or (report.when == "setup" and not report.passed)
    if _results is None or not (ended or (report.when == "teardown" and report.failed)):
        return
    result = {
        "test": report.nodeid,
        "outcome": "failed" if report.failed else report.outcome,
        "seconds": round(report.duration, 1),
    }
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        result["message"] = crash.message if crash else report.longreprtext.strip()[-300:]
        result["detail"] = "\n".join(report.longreprtext.splitlines()[-DETAIL_LINES:])
    with _results.open("a") as out:
        out.write(json.dumps(result) + "\n")
