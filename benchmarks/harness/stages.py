"""A check run as stages (`gpu_check.py`): each a child process with its own time limit, whose
results are read from what it wrote however it ended; a markdown table of them all, and the log
tails of those that failed or ran out of time.

A stage's report, kept as it is in a result row: "name", "title", "limit", "seconds" (None when
skipped), exit "code" (None when out of time), "rows" ([check, result]), and for a stage that did
not pass its "log" and that log's last `TAIL_LINES` lines ("tail")."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.children import log_tail, run_limited
from harness.tables import markdown_table

TAIL_LINES = 30


@dataclass(frozen=True)
class Outcome:
    """How a stage's child ended: `code` None when it ran out of its `limit` seconds."""

    code: int | None
    seconds: float
    limit: float
    log: Path


@dataclass(frozen=True)
class Stage:
    """A check's child, at most `limit` seconds: `command()` gives its command or why it is
    skipped, `read` its rows however it ended; its `outputs` are deleted before it runs, lest a
    stale one be read as its result."""

    name: str
    title: str
    limit: float
    command: Callable[[], list[str] | str]
    read: Callable[[Outcome], list[list[str]]]
    outputs: tuple[Path, ...] = ()


def status(report: dict[str, Any]) -> str:
    """ "passed", "failed (exit N)", "timed out at N s" or "skipped"."""
    if report["seconds"] is None:
        return "skipped"
    if report["code"] is None:
        return f"timed out at {report['limit']:.0f} s"
    return "passed" if report["code"] == 0 else f"failed (exit {report['code']})"


def run_stage(stage: Stage, env: dict[str, str], logs: Path, cwd: Path) -> dict[str, Any]:
    """Run `stage` in `cwd` with its log in `logs`; its report (module docstring), rows included
    when it wrote nothing readable."""
    report: dict[str, Any] = {"name": stage.name, "title": stage.title, "limit": stage.limit}
    command = stage.command()
    if isinstance(command, str):
        print(f"{stage.name}: skipped: {command}", flush=True)
        return report | {"code": None, "seconds": None, "rows": [["skipped", command]]}
    print(f"{stage.name} (limit {stage.limit:.0f} s): {' '.join(command)}", flush=True)
    for path in stage.outputs:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{stage.name}.log"
    code, seconds = run_limited(command, env, log, stage.limit, cwd=cwd)
    try:
        rows = stage.read(Outcome(code, seconds, stage.limit, log))
    except Exception as error:  # noqa: BLE001 - a stage that wrote nothing readable still gets its row
        rows = [["results", f"none readable ({type(error).__name__}: {error})"]]
    report |= {"code": code, "seconds": round(seconds), "rows": rows}
    if code != 0:  # read after `read`, which may add to the log
        report |= {"log": str(log), "tail": log_tail(log, TAIL_LINES).rstrip("\n")}
    print(f"{stage.name}: {status(report)} after {seconds:.0f} s", flush=True)
    return report


def table(reports: list[dict[str, Any]]) -> str:
    """One markdown table: a stage's first row names it, its status and its seconds."""
    lines = []
    for report in reports:
        seconds = report["seconds"]
        spent = "" if seconds is None else f"{seconds:.0f} ({report['limit']:.0f})"
        for i, (check, result) in enumerate(report["rows"] or [["results", "none"]]):
            first = [report["title"], status(report), spent] if i == 0 else ["", "", ""]
            # an error message may hold what would end the row or the cell early
            lines.append([*first, check, " ".join(result.split()).replace("|", "\\|")])
    return markdown_table(["stage", "status", "s (limit)", "check", "result"], lines)


def tails(reports: list[dict[str, Any]]) -> str:
    """The log tail of every stage that failed or ran out of time, as markdown."""
    return "\n".join(
        f"#### {r['name']}: {status(r)}, last {TAIL_LINES} lines of {r['log']}\n\n```\n"
        f"{r['tail'] or '(no output)'}\n```\n"
        for r in reports
        if "log" in r
    )
