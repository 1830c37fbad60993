"""`write_report`: the runs read, each figure drawn and saved as a PNG, report.html written."""

from __future__ import annotations

import io
from pathlib import Path

from oncurve.errors import UserError
from oncurve.report.figures import FIGURES, render_figures
from oncurve.report.page import (
    PAGE_TITLE,
    config_section,
    figure_section,
    page,
    samples_section,
)
from oncurve.report.runs import load_run, readable, run_names

PAGE = "report.html"


def write_report(
    run_dirs: list[Path], out_dir: Path | None = None, *, smoothing: float | None = None
) -> Path:
    """Write `out_dir/<figure>.png` and `out_dir/report.html`; return the HTML path.

    Args:
        run_dirs: one or more run directories (each with metrics.jsonl).
        out_dir: defaults to `RUN/report` for one run and `./report` for several; a directory
            other than a run's own may hold a report's files only beside its page (a
            UserError names the first file otherwise).
        smoothing: EMA weight in [0, 1) for per-step series; None picks one from the number
            of steps (see `auto_smoothing`), 0 draws raw values only.
    """
    if not run_dirs:
        raise UserError("report needs at least one run directory")
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise UserError(f"smoothing must be in [0, 1), got {smoothing}")
    paths = [Path(d) for d in run_dirs]
    seen: dict[Path, Path] = {}
    for path in paths:
        if (first := seen.get(path.resolve())) is not None:
            raise UserError(f"{path}: given twice (as {first})")
        seen[path.resolve()] = path
    runs = [load_run(p, name) for p, name in zip(paths, run_names(paths), strict=True)]
    if out_dir is None and len(paths) == 1:
        out_dir = paths[0] / "report"  # the run's own folder, which the run counts as its
        _check_is_no_file(out_dir)
    else:
        out_dir = Path("report") if out_dir is None else Path(out_dir)
        _check_out_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / PAGE
    if not _is_report_page(report):
        # the figures are written before the page: a report stopped among them leaves a folder
        # marked as a report's, which the next report writes again
        report.write_text(f"<!DOCTYPE html>\n{PAGE_TITLE.decode()}(unfinished)</title>\n")
    sections = []
    for spec, fig in render_figures(runs, smoothing):
        png_path = out_dir / f"{spec.name}.png"
        if fig is None:
            png_path.unlink(missing_ok=True)  # a stale figure from an earlier report would mislead
            sections.append(figure_section(spec, None, runs))
            continue
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
        png = buffer.getvalue()
        png_path.write_bytes(png)
        sections.append(figure_section(spec, png, runs))
    text = page(runs, sections, [samples_section(run) for run in runs], config_section(runs))
    # a run's path, and config.yaml's run.dir, may hold a name that is not UTF-8
    report.write_text(readable(text), encoding="utf-8")
    return report


def _check_out_dir(out_dir: Path) -> None:
    """Refuse an output directory where the report would replace or delete a file that no
    report wrote: a report's figures and page may be replaced only beside a page of its own."""
    _check_is_no_file(out_dir)
    ours = [f"{spec.name}.png" for spec in FIGURES] + [PAGE]
    taken = [name for name in ours if (out_dir / name).exists()]
    if taken and not _is_report_page(out_dir / PAGE):
        raise UserError(
            f"{out_dir}: holds {taken[0]}, which no oncurve report wrote; name a new or empty "
            "directory for the report"
        )


def _check_is_no_file(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: is a file; name a directory for the report")


def _is_report_page(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return PAGE_TITLE in f.read(4096)
    except OSError:
        return False
