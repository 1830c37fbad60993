"""The small commands: `oncurve warmstart`, `tasks export`, `models import`, `report`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oncurve.cli.common import print_out
from oncurve.errors import UserError

DEFAULT_EXPORT_ROWS = 500  # `tasks export` without -n: this many, or a smaller split whole


def warmstart_command(args: argparse.Namespace) -> int:
    from oncurve.warmstart import warmstart

    warmstart(Path(args.out), steps=args.steps, seed=args.seed)
    return 0


def export_command(args: argparse.Namespace) -> int:
    from oncurve.data.files import ROW_COLUMNS
    from oncurve.data.tasks import get_task
    from oncurve.data.tasks.base import TooFewProblems

    task = get_task(args.name, given="NAME")
    try:
        rows = task.examples(args.split, args.n or DEFAULT_EXPORT_ROWS, args.seed)
    except UserError:
        raise
    except TooFewProblems as short:
        if args.n is not None:
            raise UserError(f"-n {args.n}: {short}") from None
        rows = short.rows  # no -n: the whole split where it has fewer
    except ValueError as err:
        raise UserError(f"-n {args.n}: {err}") from None
    # every column the task's rewards read (`tests`, `numbers` and `target`, ...) goes with it
    lines = "".join(
        json.dumps({k: v for k, v in r.items() if k not in ROW_COLUMNS}) + "\n" for r in rows
    )
    if args.output:
        Path(args.output).write_text(lines)
    else:
        print_out(lines, end="")
    return 0


def import_model_command(args: argparse.Namespace) -> int:
    from oncurve.model.sources import import_gguf

    print_out(str(import_gguf(args.file, args.out, args.dtype)))
    return 0


def report_command(args: argparse.Namespace) -> int:
    try:
        from oncurve.report import write_report
    except ModuleNotFoundError as missing:
        if missing.name is None or missing.name.split(".")[0] != "matplotlib":
            raise
        raise UserError(
            "oncurve report draws with matplotlib: pip install 'oncurve[report]'"
        ) from None

    path = write_report([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None)
    print_out(str(path))
    return 0
