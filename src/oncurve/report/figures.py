"""The report's figures: what each shows (FIGURES), and each drawn for one run or several.

Figures are drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot: no
display is needed and the caller's matplotlib backend is left alone. This is the only module of
oncurve that imports matplotlib (the extra `report`).

With one run each series has its own colour; with several, each run has a colour and each
series a line style, and legends name the runs. Noisy per-step series are drawn raw and faint
with an exponential moving average bold on top once a run is long enough to need it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from oncurve.report.runs import Run

LINE_STYLES = ("-", "--", ":", "-.")
REWARD_FUNCTIONS = r"reward/(?!mean$|std$|timeouts$|errors$|slowest_row_s$)[^/]+"
# The Panel keys that are patterns, named as the captions name them.
PATTERN_NAMES = {
    REWARD_FUNCTIONS: "reward/<name>",
    r"eval/mean@\d+": "eval/mean@K",
    r"eval/pass@\d+": "eval/pass@K",
}


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
    """One figure: its panels side by side, its title, and the caption report.html shows."""

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
                ("reward/mean", REWARD_FUNCTIONS),
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


def metric_name(key: str) -> str:
    """A Panel key as a reader knows it: the metric's name, or the family a pattern finds
    (reward/<name>, eval/mean@K)."""
    return PATTERN_NAMES.get(key, key)


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
                ax.set_title(panel_runs[0].name, fontsize=11, parse_math=False)
        else:
            for run in panel_runs:
                _draw_lines(ax, panel, run, runs.index(run), several, smoothing)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        # min_n_ticks=1: a one-step run gets its one whole step, not fractional steps around it.
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        if panel.from_zero:
            ax.set_ylim(bottom=0)
        handles, labels = ax.get_legend_handles_labels()
        if len(labels) > 1 or several:
            legend = ax.legend(
                handles, labels, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0)
            )
            for text in legend.get_texts():  # run names as written: `$` is no mathtext here
                text.set_parse_math(False)
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
            label = _shown(run.name if len(keys) == 1 else f"{run.name}: {key}")
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
    # Every step of any part: a part that a resume added or dropped (time/reference when beta
    # changes) counts as 0 where it is missing, rather than hiding the other parts' steps.
    steps = np.unique(np.concatenate([run.series[key][0] for key in keys]))
    weight = _weight(panel, len(steps), smoothing)
    layers = []
    for key in keys:
        key_steps, key_values = run.series[key]
        values = np.zeros(len(steps))
        values[np.searchsorted(steps, key_steps)] = key_values
        layers.append(ema(values, weight) if weight > 0 else values)
    ax.stackplot(
        steps, *layers, labels=keys, colors=[f"C{i}" for i in range(len(keys))], alpha=0.85
    )
    ax.set_ylim(bottom=0)


def _shown(label: str) -> str:
    """`label` with a zero-width space before a leading `_`: matplotlib leaves labels that
    start with `_` out of legends, and a run directory may well be named so."""
    return "\u200b" + label if label.startswith("_") else label


def _weight(panel: Panel, num_points: int, smoothing: float | None) -> float:
    if not panel.smooth:
        return 0.0
    return auto_smoothing(num_points) if smoothing is None else smoothing
