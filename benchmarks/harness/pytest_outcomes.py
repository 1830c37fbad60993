"""Each test's outcome as it ends: a pytest plugin (`pytest -p harness.pytest_outcomes
--results-jsonl PATH`; with pytest-xdist the controller writes) appends a JSON line per test,
{"test": node id, "outcome", "seconds"}, with a failure's "message" and "detail" (its error's
line, the end of its report), so that a pytest stopped at a time limit, before its JUnit XML,
still says what it got done and why a test failed. `read` takes the XML, else those lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

if TYPE_CHECKING:  # pytest loads the plugin; a reader of its lines needs no pytest
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


def read(junit_xml: Path, results_jsonl: Path) -> list[dict[str, Any]]:
    """{"test": `test_file::test_x`, "outcome": passed | failed | skipped, and for a failure
    "message" and "detail"} per test, from the JUnit XML, else from the plugin's lines."""
    if not junit_xml.is_file():
        lines = results_jsonl.read_text().splitlines() if results_jsonl.is_file() else []
        rows = list(map(json.loads, lines))
        for row in rows:  # node ids: tests/gpu/test_gpu.py::test_x -> test_gpu::test_x
            row["test"] = row["test"].rsplit("/", 1)[-1].replace(".py::", "::")
        return rows
    found = []
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        children = {child.tag: child for child in case}
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failure = children.get("failure", children.get("error"))
        outcome = "skipped" if "skipped" in children else "passed"
        found.append({"test": name, "outcome": outcome if failure is None else "failed"})
        if failure is not None:
            found[-1] |= {"message": failure.get("message", ""), "detail": failure.text or ""}
    return found
