"""Results as data: a JSON row per measurement in `results/records/<benchmark>.jsonl`, with its
context and either figures (rendered by the "renderer" module) or its own "markdown"."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.checkout import RESULTS, ROOT, commit
from harness.machine import describe, load_average, versions

RECORDS = RESULTS / "records"


def record_path(benchmark: str) -> Path:
    """The JSONL record of `benchmark`."""
    return RECORDS / f"{benchmark}.jsonl"


def context() -> dict[str, Any]:
    """What a row says about where and when it was measured."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script.name
    return {
        "date": f"{datetime.now():%Y-%m-%d %H:%M}",
        "commit": commit(),
        "command": " ".join(["python", str(shown), *sys.argv[1:]]),
        "machine": describe(),
        "load": load_average(),
        "versions": versions(),
    }


def append(benchmark: str, title: str, key: str, row: dict[str, Any]) -> dict[str, Any]:
    """Append `row` (figures, or "markdown") as section `key` of `benchmark`'s page titled
    `title`, with this run's context; returns the row as written."""
    full = {"benchmark": benchmark, "title": title, "key": key, **context(), **row}
    path = record_path(benchmark)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(full) + "\n")
    return full


def read(benchmark: str) -> list[dict[str, Any]]:
    """Every row of `benchmark`'s record, oldest first."""
    path = record_path(benchmark)
    return read_jsonl(path) if path.is_file() else []


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON object of each line of `path` that is not blank."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write `rows` to `path`, a JSON line each, characters beyond ASCII as they are."""
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def latest(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The newest row of each section key, keys in the order they first appeared."""
    return {row["key"]: row for row in rows}
