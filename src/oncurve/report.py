"""Plots and one self-contained HTML page of a run, or of several runs overlaid.

`write_report` reads `RUN/metrics.jsonl` and `RUN/samples.jsonl` (see metrics.py) and writes one
PNG per figure plus `report.html`, which embeds the PNGs as base64 and has no external CSS, JS,
fonts or links, so it opens anywhere with no network. Figures are drawn on matplotlib `Figure`
objects with the Agg canvas, never through pyplot: no display is needed and the caller's
matplotlib backend is left alone.

With one run each series has its own colour; with several, each run has a colour and each
series a line style, and legends name the runs. Noisy per-step series are drawn raw and faint
with an exponential moving average bold on top once a run is long enough to need it.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from oncurve.errors import UserError
from oncurve.run.metrics import METRICS_FILE, SAMPLES_FILE, iter_jsonl

SAMPLES_PER_STEP = 4  # rows shown for each of the early, middle and late steps
LINE_STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class Panel:
    """One axes: the metrics matching `keys` (regular expressions, full match) against step."""

    ylabel: str
    keys: tuple[str, ...]
    band: str | None = None  # a std metric drawn as mean +- std around the first key
    stacked: bool = False  # stacked areas, one axes per run
    from_zero: bool = False
    smooth: bool = True  # False for sparse series (evaluations)


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file name stem and HTML anchor
    title: str
    panels: tuple[Panel, ...]
    caption: str


FIGURES = (
    FigureSpec(
        "reward",
        "Reward",
        (
            Panel(
                "reward",
                ("reward/mean", r"reward/(?!mean$|std$|timeouts$|errors$|slowest_row_s$)[^/]+"),
                band="reward/std",
            ),
        ),
        "Mean training reward per step (band: ± std over the batch) and the mean of each "
        "reward function (reward/<name>).",
    ),
    FigureSpec(
        "eval",
        "Held-out accuracy",
        (
            Panel(
                "accuracy",
                (r"eval/accuracy", r"eval/mean@\d+", r"eval/pass@\d+"),
                from_zero=True,
                smooth=False,
            ),
        ),
        "Greedy accuracy and mean@K / pass@K on the task's test split (eval.every).",
    ),
    FigureSpec(
        "kl",
        "KL divergence to the reference",
        (Panel("KL", ("kl",), from_zero=True),),
        "Estimated KL(policy || reference) per token (only logged when algo.beta > 0).",
    ),
    FigureSpec(
        "entropy",
        "Policy entropy",
        (Panel("entropy (nats / token)", ("entropy",), from_zero=True),),
        "Mean entropy of the sampling distribution over completion tokens; a collapse to 0 "
        "means the policy stopped exploring.",
    ),
    FigureSpec(
        "clip",
        "Clipped tokens",
        (
            Panel(
                "fraction of tokens",
                ("clip/low_frac", "clip/high_frac", "ratio/clamped_frac"),
                from_zero=True,
            ),
        ),
        "Fraction of tokens whose ratio was clipped below 1 - eps_low or above 1 + eps_high, "
        "and of those whose log-ratio was clamped to +-20 before exp() (pi far from pi_old).",
    ),
    FigureSpec(
        "groups",
        "Groups with all-equal rewards",
        (Panel("fraction of groups", ("groups/all_equal_frac",), from_zero=True),),
        "Fraction of prompt groups whose G completions all got the same reward: zero "
        "advantage, no learning signal.",
    ),
    FigureSpec(
        "length",
        "Completion length",
        (
            Panel("tokens", ("length/mean", "length/max"), from_zero=True),
            Panel("fraction truncated", ("length/truncated_frac",), from_zero=True),
        ),
        "Completion length in tokens (mean and max over the batch) and the fraction of "
        "completions cut at rollout.max_new_tokens.",
    ),
    FigureSpec(
        "time",
        "Time per step",
        (
            Panel(
                "seconds",
                ("time/rollout", "time/reward", "time/reference", "time/train"),
                stacked=True,
            ),
        ),
        "Wall-clock seconds per step, split into rollout (sampling), reward, the reference "
        "model's forward (when beta > 0) and train.",
    ),
    FigureSpec(
        "throughput",
        "Throughput",
        (Panel("completion tokens / s", ("tokens_per_s",), from_zero=True),),
        "Sampled completion tokens per second of step time.",
    ),
    FigureSpec(
        "optim",
        "Optimisation",
        (Panel("policy loss", ("loss/policy",)), Panel("gradient norm", ("grad_norm",))),
        "Policy loss and gradient norm before clipping.",
    ),
)


@dataclass
class Run:
    """The metrics of one run: metric name -> (steps [S], values [S]), sorted by step."""

    name: str
    path: Path
    series: dict[str, tuple[np.ndarray, np.ndarray]]

    def keys(self, pattern: str) -> list[str]:
        return sorted(k for k in self.series if re.fullmatch(pattern, k))


def load_run(run_dir: Path, name: str | None = None) -> Run:
    """Read `run_dir/metrics.jsonl`; null values are skipped, a repeated (step, key) keeps the
    last value. Raises UserError naming the directory when there is nothing to read."""
    run_dir = Path(run_dir)
    path = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    if not path.is_file():
        raise UserError(f"{run_dir}: no {METRICS_FILE}; is it the run.dir of `oncurve train`?")
    values: dict[str, dict[int, float]] = {}
    for row in iter_jsonl(path):
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, {})[row["step"]] = float(value)
    if not values:
        raise UserError(f"{run_dir}: {METRICS_FILE} has no metrics yet (no step has finished)")
    series = {}
    for key, by_step in values.items():
        steps = np.array(sorted(by_step))
        series[key] = (steps, np.array([by_step[s] for s in steps.tolist()]))
    return Run(name or run_dir.name, run_dir, series)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Exponential moving average with bias correction (as TensorBoard): [S] -> [S].

    out[i] = sum_j<=i (1-w) w^(i-j) x[j] / (1 - w^(i+1)), so a constant stays constant and
    the first point is not pulled towards 0.
    """
    out = np.empty(len(values))
    acc = 0.0
    for i, x in enumerate(values):
        acc = weight * acc + (1.0 - weight) * x
        out[i] = acc / (1.0 - weight ** (i + 1)) if weight > 0 else x
    return out


def auto_smoothing(num_points: int) -> float:
    """EMA weight for a series of this length: none below 50 points, then a span of ~S/25."""
    if num_points < 50:
        return 0.0
    span = num_points / 25
    return 1.0 - 2.0 / (span + 1.0)


def render_figures(
    runs: list[Run], smoothing: float | None = None
) -> list[tuple[FigureSpec, Figure | None]]:
    """One matplotlib Figure per spec in FIGURES, or None when no run has any of its metrics."""
    return [(spec, _render(spec, runs, smoothing)) for spec in FIGURES]


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
    runs = [load_run(p, name) for p, name in zip(paths, _run_names(paths), strict=True)]
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
            sections.append(_figure_section(spec, None))
            continue
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
        png = buffer.getvalue()
        png_path.write_bytes(png)
        sections.append(_figure_section(spec, png))
    page = _page(runs, sections, [_samples_section(run) for run in runs], _config_section(runs))
    report = out_dir / "report.html"
    report.write_text(page, encoding="utf-8")
    return report


def _run_names(paths: list[Path]) -> list[str]:
    """Directory names, or parent/name when two runs share a name."""
    names = [p.resolve().name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    return names


def _render(spec: FigureSpec, runs: list[Run], smoothing: float | None) -> Figure | None:
    # (panel, runs drawn on that axes): a stacked panel gets one axes per run.
    axes_plan = []
    for panel in spec.panels:
        with_data = [r for r in runs if any(r.keys(k) for k in panel.keys)]
        if not with_data:
            continue
        if panel.stacked:
            axes_plan.extend((panel, [r]) for r in with_data)
        else:
            axes_plan.append((panel, with_data))
    if not axes_plan:
        return None
    ncols = min(len(axes_plan), 2)
    nrows = math.ceil(len(axes_plan) / ncols)
    fig = Figure(figsize=(9 if ncols == 1 else 13, 4.2 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(spec.title, fontsize=14)
    several = len(runs) > 1
    stacked_axes = []
    for index, (panel, panel_runs) in enumerate(axes_plan):
        ax = fig.add_subplot(nrows, ncols, index + 1)
        if panel.stacked:
            _draw_stacked(ax, panel, panel_runs[0], smoothing)
            stacked_axes.append(ax)
            if several:
                ax.set_title(panel_runs[0].name, fontsize=11)
        else:
            for run in panel_runs:
                _draw_lines(ax, panel, run, runs.index(run), several, smoothing)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if panel.from_zero:
            ax.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
        if len(labels) > 1 or several:
            ax.legend(handles, labels, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if len(stacked_axes) > 1:  # one scale, so that the runs' step times compare by eye
        top = max(ax.get_ylim()[1] for ax in stacked_axes)
        for ax in stacked_axes:
            ax.set_ylim(0, top)
    return fig


def _draw_lines(
    ax, panel: Panel, run: Run, run_index: int, several: bool, smoothing: float | None
) -> None:
    keys = _all_keys(panel, run)
    for key_index, key in enumerate(keys):
        steps, values = run.series[key]
        if several:
            color = f"C{run_index % 10}"
            style = LINE_STYLES[key_index % len(LINE_STYLES)]
            label = run.name if len(keys) == 1 else f"{run.name}: {key}"
        else:
            color, style, label = f"C{key_index % 10}", "-", key
        marker = "o" if not panel.smooth or len(steps) < 2 else None
        weight = _weight(panel, len(steps), smoothing)
        line = values
        if weight > 0:
            ax.plot(steps, values, color=color, linestyle=style, linewidth=0.6, alpha=0.2)
            line = ema(values, weight)
        ax.plot(
            steps,
            line,
            color=color,
            linestyle=style,
            linewidth=1.8,
            marker=marker,
            markersize=4,
            label=label,
        )
        if panel.band and key_index == 0 and panel.band in run.series:
            band_steps, std = run.series[panel.band]
            common, at_line, at_band = np.intersect1d(steps, band_steps, return_indices=True)
            std = std[at_band]
            if weight > 0:
                std = ema(std, weight)
            center = line[at_line]
            ax.fill_between(
                common,
                center - std,
                center + std,
                color=color,
                alpha=0.15,
                linewidth=0,
                label=f"{label} ± std" if not several else None,
            )


def _all_keys(panel: Panel, run: Run) -> list[str]:
    """The run's series of this panel, less any that equals one already listed: it would lie
    hidden under it (a lone reward function with weight 1 is `reward/mean`)."""
    keys: list[str] = []
    for key in (k for pattern in panel.keys for k in run.keys(pattern)):
        steps, values = run.series[key]
        if not any(
            np.array_equal(steps, run.series[kept][0])
            and np.array_equal(values, run.series[kept][1], equal_nan=True)
            for kept in keys
        ):
            keys.append(key)
    return keys


def _draw_stacked(ax, panel: Panel, run: Run, smoothing: float | None) -> None:
    keys = _all_keys(panel, run)
    steps = run.series[keys[0]][0]
    for key in keys[1:]:
        steps = np.intersect1d(steps, run.series[key][0])
    weight = _weight(panel, len(steps), smoothing)
    layers = []
    for key in keys:
        key_steps, values = run.series[key]
        values = values[np.isin(key_steps, steps)]
        layers.append(ema(values, weight) if weight > 0 else values)
    ax.stackplot(
        steps, *layers, labels=keys, colors=[f"C{i}" for i in range(len(keys))], alpha=0.85
    )
    ax.set_ylim(bottom=0)


def _weight(panel: Panel, num_points: int, smoothing: float | None) -> float:
    if not panel.smooth:
        return 0.0
    return auto_smoothing(num_points) if smoothing is None else smoothing


def _figure_section(spec: FigureSpec, png: bytes | None) -> str:
    head = f'<section id="{spec.name}"><h2>{html.escape(spec.title)}</h2>'
    caption = f'<p class="caption">{html.escape(spec.caption)}</p>'
    if png is None:
        wanted = ", ".join(k for p in spec.panels for k in p.keys)
        note = f'<p class="note">No run logged these metrics ({html.escape(wanted)}); figure skipped.</p>'
        return head + caption + note + "</section>"
    data = base64.b64encode(png).decode("ascii")
    img = f'<img src="data:image/png;base64,{data}" alt="{html.escape(spec.title)}">'
    return head + caption + img + "</section>"


def _samples_section(run: Run) -> str:
    """Completions of the earliest, middle and latest logged steps of one run."""
    path = run.path / SAMPLES_FILE
    title = f"<h3>{html.escape(run.name)}</h3>"
    steps = sorted({row["step"] for row in iter_jsonl(path)}) if path.is_file() else []
    if not steps:
        return title + f'<p class="note">No {SAMPLES_FILE} rows (log.samples_per_step = 0?).</p>'
    chosen = dict.fromkeys([steps[0], steps[len(steps) // 2], steps[-1]])
    rows: dict[int, list[dict]] = {step: [] for step in chosen}
    for row in iter_jsonl(path):
        if row["step"] in rows and len(rows[row["step"]]) < SAMPLES_PER_STEP:
            rows[row["step"]].append(row)
    body = []
    for phase, step in zip(("early", "middle", "late"), chosen, strict=False):
        for row in rows[step]:
            body.append(
                "<tr>"
                f'<td class="num">{step}<br><span class="phase">{phase}</span></td>'
                f'<td class="num">{_cell(row.get("reward"))}</td>'
                f"<td>{_cell(row.get('answer'))}</td>"
                f'<td><div class="text">{_cell(row.get("prompt"))}</div></td>'
                f'<td><div class="text">{_cell(row.get("completion"))}</div></td>'
                "</tr>"
            )
    head = "<tr><th>step</th><th>reward</th><th>answer</th><th>prompt</th><th>completion</th></tr>"
    # once per run, the prompt as the model saw it (system prompt, chat template, special
    # tokens), so that a formatting mistake shows
    first = rows[next(iter(chosen))][0] if rows[next(iter(chosen))] else {}
    seen = first.get("prompt_as_seen")
    shown = (
        f'<p class="note">The first prompt as the model saw it:</p><div class="text">'
        f"{_cell(seen)}</div>"
        if seen is not None
        else ""
    )
    return title + shown + f'<table class="samples">{head}{"".join(body)}</table>'


def _cell(value) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _summary_table(runs: list[Run]) -> str:
    def last(run: Run, key: str) -> str:
        if key not in run.series:
            return "&ndash;"
        steps, values = run.series[key]
        return f"{values[-1]:.4g} <small>(step {steps[-1]})</small>"

    def median(run: Run, key: str) -> str:
        return f"{np.median(run.series[key][1]):.4g}" if key in run.series else "&ndash;"

    rows = [
        "<tr><th>run</th><th>directory</th><th>steps</th><th>reward/mean, last</th>"
        "<th>eval/accuracy, last</th><th>time/step, median (s)</th><th>tokens/s, median</th></tr>"
    ]
    for run in runs:
        last_step = max(int(steps[-1]) for steps, _ in run.series.values())
        rows.append(
            f"<tr><td>{html.escape(run.name)}</td><td><code>{html.escape(str(run.path))}</code></td>"
            f'<td class="num">{last_step}</td><td class="num">{last(run, "reward/mean")}</td>'
            f'<td class="num">{last(run, "eval/accuracy")}</td>'
            f'<td class="num">{median(run, "time/step")}</td>'
            f'<td class="num">{median(run, "tokens_per_s")}</td></tr>'
        )
    return f'<table class="summary">{"".join(rows)}</table>'


def _config_section(runs: list[Run]) -> str:
    """The resolved config of one run, or the settings that differ between several."""
    configs = {}
    for run in runs:
        path = run.path / "config.yaml"
        if path.is_file():
            try:
                configs[run.name] = _flatten(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
            except (yaml.YAMLError, UnicodeDecodeError):
                raise UserError(f"{path} is not a readable config (not valid YAML)") from None
    if not configs:
        return '<p class="note">No config.yaml in the run directories.</p>'
    keys = sorted({k for c in configs.values() for k in c})
    if len(configs) > 1:
        keys = [k for k in keys if len({repr(c.get(k)) for c in configs.values()}) > 1]
        if not keys:
            return "<p>The runs have identical configs.</p>"
    head = "<tr><th>setting</th>" + "".join(f"<th>{html.escape(n)}</th>" for n in configs) + "</tr>"
    body = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td>"
        + "".join(f"<td>{_config_value(c, k)}</td>" for c in configs.values())
        + "</tr>"
        for k in keys
    )
    table = f'<table class="config">{head}{body}</table>'
    if len(configs) > 1:
        return "<p>Settings that differ between the runs.</p>" + table
    return f"<details><summary>Resolved config ({len(keys)} settings)</summary>{table}</details>"


def _config_value(config: dict, key: str) -> str:
    if key not in config:
        return "&ndash;"
    value = config[key]
    # As YAML spells them (null, false), so that values can be pasted back as overrides.
    return html.escape(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def _flatten(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return {k.rstrip("."): v for k, v in flat.items()}


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
nav a { margin-right: 1em; }
img { max-width: 100%; height: auto; display: block; }
.caption { color: #555; margin: 0.3em 0 0.6em; }
.note { color: #8a5a00; background: #fff6e0; padding: 0.4em 0.8em; border-radius: 4px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; vertical-align: top; text-align: left; }
th { background: #f4f4f4; }
td.num { text-align: right; white-space: nowrap; }
.phase { color: #777; font-size: 0.85em; }
table.samples { width: 100%; table-layout: fixed; }
table.samples th:nth-child(-n+3) { width: 6em; }
table.samples th:nth-child(4) { width: 30%; }
.text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace;
        font-size: 0.85em; max-height: 16em; overflow: auto; }
"""


def _page(runs: list[Run], figures: list[str], samples: list[str], config: str) -> str:
    names = ", ".join(run.name for run in runs)
    links = " ".join(f'<a href="#{spec.name}">{html.escape(spec.title)}</a>' for spec in FIGURES)
    links += ' <a href="#samples">Samples</a> <a href="#config">Config</a>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>oncurve report: {html.escape(names)}</title><style>{STYLE}</style></head><body>"
        f"<h1>oncurve report</h1>{_summary_table(runs)}<nav>{links}</nav>"
        + "".join(figures)
        + '<section id="samples"><h2>Sample completions</h2><p class="caption">'
        "Completions from the earliest, middle and latest logged steps with their rewards.</p>"
        + "".join(samples)
        + '</section><section id="config"><h2>Config</h2>'
        + config
        + "</section></body></html>\n"
    )
