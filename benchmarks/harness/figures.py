"""Each record's figures in a line, written between markers by `render.py`: benchmarks/README.md's
history, README.md's Results table and LOG.md's entries; from the renderer module's `summary`
and `headline`, else the row's own fields."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS, ROOT
from harness.records import RECORDS, read
from harness.tables import markdown_table

# The README's Results table: one row per area, in this order.
AREAS = (
    "the default job, 2 CPU cores",
    "a step against TRL, 1 x H100",
    "the sampler, 1 x H100",
    "the sampler, 1 x H200",
    "an instruct model, 2 CPU cores",
    "RL on code, 2 CPU cores",
    "a multi-turn environment, 2 CPU cores",
    "memory against PPO with a critic",
)
HEADLINES = ROOT / "README.md"
HISTORY = BENCHMARKS / "README.md"
LOG = BENCHMARKS / "LOG.md"
# a LOG entry's figures: the row of record NAME measured at DATE ("YYYY-MM-DD HH:MM")
LOG_ROW = re.compile(
    r"^( *)(<!-- row: (\S+) ([\d-]+ [\d:]+) -->)\n(?:[^\n]*\n)*?\1<!-- /row -->", re.M
)


def _from_spec(row: dict[str, Any], name: str) -> Any:
    """`name(row)` of the row's renderer module when it defines one, else the row's field."""
    if "renderer" in row:
        module = importlib.import_module(row["renderer"])
        if hasattr(module, name):
            return getattr(module, name)(row)
    return row.get(name)


def machine_label(row: dict[str, Any]) -> str:
    """The machine a row was measured on, short: its GPUs, else its CPU and cores."""
    machine = row.get("machine") or {}
    if "gpu" in machine:
        return str(machine["gpu"]).replace("NVIDIA ", "")
    cpu = " ".join(str(machine.get("cpu", "unknown CPU")).split()[:2])
    return f"{cpu}, {machine.get('cores', '?')} cores"


def all_rows() -> list[dict[str, Any]]:
    """Every row of every record: newest day first, then by record, a record's later row first."""
    rows = [row for path in sorted(RECORDS.glob("*.jsonl")) for row in reversed(read(path.stem))]
    return sorted(rows, key=lambda row: str(row.get("date", ""))[:10], reverse=True)  # stable


def summary_of(row: dict[str, Any]) -> str | None:
    """A row's figures in one line (an imported row's own, else its spec's), or None."""
    return row.get("summary") if "imported" in row else _from_spec(row, "summary")


def history_table(rows: list[dict[str, Any]]) -> str:
    """Date, machine, commit, command and summary of each row with a summary."""
    lines = []
    # a measurement's figures row, once its spec summarises it, stands for its imported line
    summarised = {(r["benchmark"], r.get("commit")) for r in rows if "renderer" in r
                  and summary_of(r)}  # fmt: skip
    for row in rows:
        summary = summary_of(row)
        duplicate = "renderer" not in row and (row["benchmark"], row.get("commit")) in summarised
        if summary and not duplicate:
            when = str(row["date"])[:10]
            command = row.get("shown_command") or f"`{row.get('command', '')}`"
            commit = row.get("commit") or "?"
            lines.append([when, machine_label(row), commit, command, summary])
    return markdown_table(["date", "machine", "commit", "command", "result"], lines)


def headline_table(rows: list[dict[str, Any]]) -> str:
    """The newest headline of each of `AREAS`: its figure and command. ValueError for an area
    without one: the README would lose a row."""
    newest: dict[str, dict[str, str]] = {}
    for row in rows:
        headline = _from_spec(row, "headline")
        if headline and headline["area"] not in newest:
            newest[headline["area"]] = headline
    if missing := [area for area in AREAS if area not in newest]:
        raise ValueError(f"no record holds a headline for {missing}")
    lines = [[area, newest[area]["figure"], f"`{newest[area]['command']}`"] for area in AREAS]
    return markdown_table(["area", "figure", "command"], lines)


def between_markers(text: str, name: str, table: str) -> str:
    """`text` with what stands between `<!-- figures: name -->` and `<!-- /figures: name -->`
    replaced by `table`; ValueError when the markers are missing."""
    pattern = re.compile(rf"(<!-- figures: {name} -->\n).*?(\n<!-- /figures: {name} -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no <!-- figures: {name} --> markers")
    return pattern.sub(lambda m: m.group(1) + table + m.group(2), text)


def log_rows(text: str, rows: list[dict[str, Any]]) -> str:
    """`text` with each `<!-- row: NAME DATE -->` block filled with that row's command, commit
    and summary; ValueError for a marker naming no row or several."""

    def fill(match: re.Match[str]) -> str:
        indent, name, date = match.group(1), match.group(3), match.group(4)
        found = [row for row in rows if row["benchmark"] == name and str(row.get("date")) == date]
        if len(found) != 1:
            raise ValueError(f"<!-- row: {name} {date} --> names {len(found)} rows, not one")
        line = f"`{found[0]['command']}` at {found[0]['commit']}: {summary_of(found[0])}."
        return f"{indent}{match.group(2)}\n{indent}{line}\n{indent}<!-- /row -->"

    return LOG_ROW.sub(fill, text)


def rendered_pages() -> dict[Path, str]:
    """README.md, benchmarks/README.md and benchmarks/LOG.md as the records make them."""
    rows = all_rows()
    return {
        HEADLINES: between_markers(HEADLINES.read_text(), "headlines", headline_table(rows)),
        HISTORY: between_markers(HISTORY.read_text(), "history", history_table(rows)),
        LOG: log_rows(LOG.read_text(), rows),
    }
