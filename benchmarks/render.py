"""Render every benchmark's page, `results/<benchmark>.md`, from its JSONL record in
`results/records/`, and the tables of figures in README.md and benchmarks/README.md from all of
them (one command after recording, editing or merging records):

    .venv/bin/python benchmarks/render.py            # every record
    .venv/bin/python benchmarks/render.py vs_trl     # one
"""

from __future__ import annotations

import argparse

from harness.figures import rendered_pages
from harness.records import RECORDS
from harness.tables import render_page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", help="record names (default: all)")
    names = parser.parse_args().benchmarks or sorted(p.stem for p in RECORDS.glob("*.jsonl"))
    for name in names:
        print(f"{name}: {render_page(name) or 'no record'}")
    for path, text in rendered_pages().items():
        path.write_text(text)
        print(f"figures: {path}")


if __name__ == "__main__":
    main()
