"""Render every benchmark's page, `results/<benchmark>.md`, from its JSONL record in
`results/records/` (one command after editing or merging records):

    .venv/bin/python benchmarks/render.py            # every record
    .venv/bin/python benchmarks/render.py vs_trl     # one
"""

from __future__ import annotations

import argparse

from harness.records import RECORDS
from harness.tables import render_page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmarks", nargs="*", help="record names (default: all)")
    names = parser.parse_args().benchmarks or sorted(p.stem for p in RECORDS.glob("*.jsonl"))
    for name in names:
        path = render_page(name)
        print(f"{name}: {path or 'no record'}")


if __name__ == "__main__":
    main()
