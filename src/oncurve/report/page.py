"""report.html's sections: a figure with its caption, sample completions, the config, and
the page around them with its style, all inline so that the page needs no network."""

from __future__ import annotations

import base64
import html
import json
import re

import numpy as np
import yaml

from oncurve.errors import UserError
from oncurve.report.figures import FIGURES, FigureSpec, metric_name
from oncurve.report.runs import Run
from oncurve.run.metrics import SAMPLES_FILE, iter_jsonl

# how a report's page begins its title: what marks a folder's report.html as a report's
PAGE_TITLE = b"<title>oncurve report: "
SAMPLES_PER_STEP = 4  # rows shown for each of the early, middle and late steps
GAP_STEPS_SHOWN = 10  # steps named where a drawn metric was non-finite


def figure_section(spec: FigureSpec, png: bytes | None, runs: list[Run]) -> str:
    """A figure's section: its title, caption and PNG inline as base64, or without a PNG a note
    naming the metrics that the runs logged with no finite value and those no run logged."""
    head = f'<section id="{spec.name}"><h2>{html.escape(spec.title)}</h2>'
    caption = f'<p class="caption">{html.escape(spec.caption)}</p>'
    if png is None:
        note = f'<p class="note">{html.escape(_skipped_note(spec, runs))}</p>'
        return head + caption + note + "</section>"
    data = base64.b64encode(png).decode("ascii")
    img = f'<img src="data:image/png;base64,{data}" alt="{html.escape(spec.title)}">'
    gaps = _gaps_note(spec, runs)
    note = f'<p class="note">{html.escape(gaps)}</p>' if gaps else ""
    return head + caption + img + note + "</section>"


def _gaps_note(spec: FigureSpec, runs: list[Run]) -> str:
    """The steps where a drawn metric was non-finite, which its line passes over; "" if none."""
    keys = [k for p in spec.panels for k in (*p.keys, *([p.band] if p.band else []))]
    parts = []
    for run in runs:
        for name, steps in sorted(run.null_steps.items()):
            if any(re.fullmatch(k, name) for k in keys):
                shown = ", ".join(map(str, steps[:GAP_STEPS_SHOWN]))
                more = ", ..." if len(steps) > GAP_STEPS_SHOWN else ""
                at = f"step {shown}" if len(steps) == 1 else f"{len(steps)} steps ({shown}{more})"
                parts.append(f"{run.name}: {name} at {at}" if len(runs) > 1 else f"{name} at {at}")
    return f"Non-finite (NaN or infinite), not drawn: {'; '.join(parts)}." if parts else ""


def _skipped_note(spec: FigureSpec, runs: list[Run]) -> str:
    keys = [k for p in spec.panels for k in p.keys]
    logged = {name for run in runs for name in run.non_finite}
    non_finite = sorted(n for n in logged if any(re.fullmatch(k, n) for k in keys))
    unlogged = [metric_name(k) for k in keys if not any(re.fullmatch(k, n) for n in non_finite)]
    if not non_finite:
        return f"No run logged these metrics ({', '.join(unlogged)}); figure skipped."
    note = f"Non-finite (NaN or infinite) at every step: {', '.join(non_finite)}."
    if unlogged:
        note += f" No run logged {', '.join(unlogged)}."
    return note + " Figure skipped."


def samples_section(run: Run) -> str:
    """Completions of the earliest, middle and latest logged steps of one run."""
    path = run.path / SAMPLES_FILE
    title = f"<h3>{html.escape(run.name)}</h3>"
    steps = sorted({row["step"] for row in iter_jsonl(path)}) if path.is_file() else []
    if not steps:
        return title + f'<p class="note">No {SAMPLES_FILE} rows (log.samples_per_step = 0?).</p>'
    # Set in this order so that with fewer than 3 steps the last is still late, the first early.
    phases = {steps[len(steps) // 2]: "middle"}
    phases[steps[0]] = "early"
    phases[steps[-1]] = "late"
    chosen = sorted(phases)
    rows: dict[int, list[dict]] = {step: [] for step in chosen}
    for row in iter_jsonl(path):
        if row["step"] in rows and len(rows[row["step"]]) < SAMPLES_PER_STEP:
            rows[row["step"]].append(row)
    body = []
    for step in chosen:
        for row in rows[step]:
            body.append(
                "<tr>"
                f'<td class="num">{step}<br><span class="phase">{phases[step]}</span></td>'
                f'<td class="num">{_cell(row.get("reward"))}</td>'
                f"<td>{_cell(row.get('answer'))}</td>"
                f'<td><div class="text">{_cell(row.get("prompt"))}</div></td>'
                f'<td><div class="text">{_cell(row.get("completion"))}</div></td>'
                "</tr>"
            )
    head = "<tr><th>step</th><th>reward</th><th>answer</th><th>prompt</th><th>completion</th></tr>"
    # once per run, the prompt as the model saw it (system prompt, chat template, special
    # tokens), so that a formatting mistake shows
    first = rows[chosen[0]][0] if rows[chosen[0]] else {}
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
    return UNSEEN.sub(_code_point, html.escape(str(value)))


# What a browser acts on unseen in model output: C0 and C1 controls other than tab and line
# ends (it drops NUL), and the bidirectional controls, which reorder the text after them (the
# model's "71" shown as "17"). Each is shown as its code point.
UNSEEN = re.compile(
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _code_point(match: re.Match) -> str:
    return f'<span class="control">U+{ord(match.group()):04X}</span>'


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


def config_section(runs: list[Run]) -> str:
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
    # As YAML spells them (null, false), so that values can be pasted back as overrides; what
    # JSON has no type for (YAML's dates and bytes, in a free-form setting) as its text.
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return html.escape(shown)


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
.control { color: #a00; font-size: 0.75em; border: 1px solid #dbb; border-radius: 2px;
           padding: 0 0.15em; }
.text { white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace;
        font-size: 0.85em; max-height: 16em; overflow: auto; }
"""


def page(runs: list[Run], figures: list[str], samples: list[str], config: str) -> str:
    """The whole report.html: a summary of the runs, links to each section, then the figure,
    sample and config sections given."""
    names = ", ".join(run.name for run in runs)
    links = " ".join(f'<a href="#{spec.name}">{html.escape(spec.title)}</a>' for spec in FIGURES)
    links += ' <a href="#samples">Samples</a> <a href="#config">Config</a>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"{PAGE_TITLE.decode()}{html.escape(names)}</title><style>{STYLE}</style></head><body>"
        f"<h1>oncurve report</h1>{_summary_table(runs)}<nav>{links}</nav>"
        + "".join(figures)
        + '<section id="samples"><h2>Sample completions</h2><p class="caption">'
        "Completions from the earliest, middle and latest logged steps with their rewards.</p>"
        + "".join(samples)
        + '</section><section id="config"><h2>Config</h2>'
        + config
        + "</section></body></html>\n"
    )
