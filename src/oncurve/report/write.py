"""`write_report`: the runs read, each figure drawn and saved as a PNG, report.html written."""

from __future__ import annotations

import io
from pathlib import Path

from oncurve.errors import UserError
from oncurve.report.figures import render_figures
from oncurve.report.page import config_section, figure_section, page, samples_section
from oncurve.report.runs import load_run, run_names


def write_report(
    run_dirs: list[Path], out_dir: Path | None = None, *, smoothing: float | None = None
) -> Path:
    """Write `out_dir/<figure>.png` and `out_dir/report.html`; return the HTML path.

    Args:
        run_dirs: one or more run directories (each with metrics.jsonl).
        out_dir: defaults to `RUN/report` for one run and `./report` for several.
        smoothing: EMA weight in [0, 1) for per-step series; None picks one from the number
            of steps (see `auto_smoothing`), 0 draws raw values only.
    """
    if not run_dirs:
        raise UserError("report needs at least one run directory")
    if smoothing is not None and not 0.0 <= smoothing < 1.0:
        raise UserError(f"smoothing must be in [0, 1), got {smoothing}")
    paths = [Path(d) for d in run_dirs]
    runs = [load_run(p, name) for p, name in zip(paths, run_names(paths), strict=True)]
    out_dir = (
        Path(out_dir)
        if out_dir is not None
        else (paths[0] / "report" if len(paths) == 1 else Path("report"))
    )
    out_dir.mkdir(parents=True, exist_ok=True)
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
    report = out_dir / "report.html"
    report.write_text(text, encoding="utf-8")
    return report
