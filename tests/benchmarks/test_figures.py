"""The README's Results table, benchmarks/README.md's recorded figures and LOG.md's entries'
figures are what the records give (`benchmarks/render.py` writes them), each area keeps a
headline, and benchmarks/README.md's tables name every script and harness module."""

from __future__ import annotations

import re

import pytest
from harness.figures import (
    AREAS,
    HISTORY,
    all_rows,
    between_markers,
    headline_table,
    history_table,
    log_rows,
    machine_label,
    rendered_pages,
)


def test_the_pages_tables_are_the_records():
    for path, text in rendered_pages().items():
        assert path.read_text() == text, (
            f"{path} differs from its records: run benchmarks/render.py"
        )


def test_every_area_has_a_headline_and_every_row_a_line():
    rows = all_rows()
    table = headline_table(rows).splitlines()
    assert [line.split(" | ")[0].lstrip("| ") for line in table[2:]] == list(AREAS)
    with_summary = [row for row in rows if row.get("summary")]
    assert len(history_table(rows).splitlines()) >= 2 + len(with_summary)
    with pytest.raises(ValueError, match="no record holds a headline for"):
        headline_table([row for row in rows if row.get("benchmark") != "default_job"])


def test_machines_and_markers():
    assert machine_label({"machine": {"gpu": "1 x NVIDIA H200"}}) == "1 x H200"
    assert machine_label({"machine": {"cpu": "AMD EPYC 7B13 64-Core", "cores": 2}}) == (
        "AMD EPYC, 2 cores"
    )
    text = "a\n<!-- figures: x -->\nold\n<!-- /figures: x -->\nb"
    assert (
        between_markers(text, "x", "new") == "a\n<!-- figures: x -->\nnew\n<!-- /figures: x -->\nb"
    )
    with pytest.raises(ValueError, match="no <!-- figures: y --> markers"):
        between_markers(text, "y", "new")


def test_every_measured_row_is_a_line_of_the_recorded_figures():
    rows = all_rows()
    table = history_table(rows)
    measured = [row for row in rows if "renderer" in row and "imported" not in row]
    assert {row["benchmark"] for row in measured} >= {"smollm2", "vs_trl", "answer_checkers"}
    for row in measured:  # a spec without `summary(row)` would leave its rows out
        line = f"| {str(row['date'])[:10]} | {machine_label(row)} | {row['commit']} |"
        assert line in table, (row["benchmark"], row.get("key"))


def test_a_log_marker_is_filled_with_its_row_and_an_unknown_one_is_an_error():
    row = {"benchmark": "b", "date": "2026-01-02 03:04", "command": "python b.py",
           "commit": "abc", "summary": "1.5x"}  # fmt: skip
    text = "- why:\n  <!-- row: b 2026-01-02 03:04 -->\n  stale\n  <!-- /row -->\nafter\n"
    assert log_rows(text, [row]) == (
        "- why:\n  <!-- row: b 2026-01-02 03:04 -->\n  `python b.py` at abc: 1.5x.\n"
        "  <!-- /row -->\nafter\n"
    )
    empty = "<!-- row: b 2026-01-02 03:04 -->\n<!-- /row -->\n"
    assert log_rows(empty * 2, [row]) == (  # an empty block does not reach into the next
        "<!-- row: b 2026-01-02 03:04 -->\n`python b.py` at abc: 1.5x.\n<!-- /row -->\n" * 2
    )
    with pytest.raises(ValueError, match="row: b 2026-01-09 00:00 --> names 0 rows"):
        log_rows("<!-- row: b 2026-01-09 00:00 -->\n<!-- /row -->", [row])
    with pytest.raises(ValueError, match="names 2 rows"):
        log_rows(empty, [row, {**row, "commit": "def"}])


def test_every_script_and_harness_module_is_in_the_benchmarks_tables():
    text = HISTORY.read_text()
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", text, re.M))
    harness = {path.name for path in (HISTORY.parent / "harness").glob("*.py")} - {"__init__.py"}
    # render.py writes the pages and measures nothing
    scripts = {path.name for path in HISTORY.parent.glob("*.py")} - {"render.py"}
    assert scripts == listed - harness, f"not in benchmarks/README.md's tables: {scripts - listed}"
    rows = re.findall(r"^\| ((?:`\w+\.py`(?:, )?)+) \|", text, re.M)
    named = {name for row in rows for name in re.findall(r"`(\w+\.py)`", row)}
    assert harness <= named, f"not in the harness table: {harness - named}"
