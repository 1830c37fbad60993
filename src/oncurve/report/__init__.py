"""Plots and one self-contained HTML page of a run, or of several runs overlaid.

`write_report` reads `RUN/metrics.jsonl` and `RUN/samples.jsonl` (see run/metrics.py) and writes
one PNG per figure plus `report.html`, which embeds the PNGs as base64 and has no external CSS,
JS, fonts or links, so it opens anywhere with no network. Importing this package needs
matplotlib (the extra `report`); only figures.py imports it.

The modules: `runs` (`Run`, `load_run`), `figures` (`FIGURES`, smoothing, drawing), `page`
(report.html's sections and style) and `write` (`write_report`).
"""

from oncurve.report.figures import FIGURES, FigureSpec, Panel, auto_smoothing, ema, render_figures
from oncurve.report.runs import Run, load_run
from oncurve.report.write import write_report

__all__ = [
    "FIGURES",
    "FigureSpec",
    "Panel",
    "Run",
    "auto_smoothing",
    "ema",
    "load_run",
    "render_figures",
    "write_report",
]
