"""Markdown from result rows: tables, and each benchmark's page (`results/<benchmark>.md`)
rendered from its record, a section per key with the newest row of that key."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.checkout import RESULTS
from harness.records import append, latest, read


def markdown_table(header: list[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table, each cell as `str` writes it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def page_title(heading: str, spec: str, sections: str) -> str:
    """A page's title: `heading`, then that the spec `benchmarks/<spec>.py` writes the page, one
    section per `sections`."""
    return f"{heading}\n\nWritten by `benchmarks/{spec}.py`, one section per {sections}."


def cell(value: float | None, spec: str = ".2f") -> str:
    """`value` formatted with `spec`, or "n/a" when it was not measured."""
    return "n/a" if value is None else format(value, spec)


def code_cell(text: object, limit: int | None = None) -> str:
    """`text` as a code cell: "(none)" for None, line breaks as `\\n`, whitespace collapsed,
    cut to `limit` with "…", backticks and `|` escaped."""
    if text is None:
        return "(none)"
    text = re.sub(r"\s*\n\s*", "\\\\n", str(text).strip())
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`" if text else ""


def measured(row: dict[str, Any]) -> str:
    """Where a row was measured: date, commit (if any), command, torch and transformers."""
    versions, at = row["versions"], f" at {row['commit']}" if row["commit"] else ""
    return (
        f"{row['date']}{at}, `{row['command']}`, torch {versions['torch']}, "
        f"transformers {versions['transformers']}"
    )


def section_text(row: dict[str, Any]) -> str:
    """A row's own "markdown", or its "renderer" module's `section(row)`."""
    if "markdown" in row:
        return row["markdown"]
    return importlib.import_module(row["renderer"]).section(row)


def render_page(benchmark: str) -> Path | None:
    """Write `results/<benchmark>.md`: the newest title, then each key's newest section behind a
    `<!-- model: key -->` marker (key "": the whole page); None without a rendered row."""
    sections = latest([row for row in read(benchmark) if "markdown" in row or "renderer" in row])
    if not sections:
        return None
    path = RESULTS / f"{benchmark}.md"
    if "" in sections:
        text = section_text(sections[""])
    else:
        title = list(sections.values())[-1]["title"]
        body = [
            f"<!-- model: {key} -->\n{section_text(row).strip()}" for key, row in sections.items()
        ]
        text = f"# {title}\n\n" + "\n\n".join(body) + "\n"
    path.write_text(text)
    return path


def publish(benchmark: str, title: str, key: str, row: dict[str, Any]) -> Path:
    """Record `row` as section `key` of `benchmark` and render its page again; prints where."""
    append(benchmark, title, key, row)
    path = render_page(benchmark)
    assert path is not None  # the row just appended
    print(f"recorded {benchmark} (section {key or 'page'}); wrote {path}")
    return path
