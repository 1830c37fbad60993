import base64
import json
import os
import random
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import oncurve
from oncurve.cli import main
from oncurve.errors import UserError
from oncurve.loop.trainer import train
from oncurve.report import (
    FIGURES,
    Run,
    auto_smoothing,
    ema,
    load_run,
    render_figures,
    write_report,
)
from oncurve.report import write as report_write
from oncurve.report.figures import metric_name
from oncurve.report.page import config_section, figure_section, samples_section
from oncurve.run.metrics import MetricsLogger

FIGURE_NAMES = [
    "reward",
    "eval",
    "kl",
    "entropy",
    "clip",
    "groups",
    "length",
    "time",
    "throughput",
    "optim",
]


def make_run(run_dir, seed=0, steps=30, eval_every=10, beta=0.04, loss_agg="seq-mean-token-mean"):
    """A fake finished run: every metric of the trainer, eval rows, samples, config.yaml."""
    rng = random.Random(seed)
    logger = MetricsLogger(run_dir)
    logged = []
    for step in range(1, steps + 1):
        p = step / steps
        row = {
            "reward/mean": p + rng.gauss(0, 0.1),
            "reward/std": 0.3 * rng.random(),
            "reward/correct": p + rng.gauss(0, 0.1),
            "reward/format": 0.5 * p,
            "reward/timeouts": 0.0,
            "reward/errors": 0.0,
            "reward/slowest_row_s": 0.01,
            "groups/all_equal_frac": 0.5 * (1 - p),
            "adv/abs_mean": 0.8,
            "loss/policy": rng.gauss(0, 0.01),
            "entropy": 1.5 - p,
            "clip/low_frac": 0.01 * rng.random(),
            "clip/high_frac": 0.02 * rng.random(),
            "ratio/mean": 1.0,
            "ratio/min": 0.8,
            "ratio/max": 1.2,
            "grad_norm": 1 + rng.random(),
            "lr": 1e-5,
            "length/mean": 40 + 20 * p,
            "length/max": 64.0,
            "length/truncated_frac": 0.1 * p,
            "time/rollout": 2 + rng.random(),
            "time/reward": 0.1,
            "time/train": 1 + rng.random(),
            "tokens_per_s": 300 + 10 * rng.random(),
            "logprob_diff/max": 0.0,
        }
        if beta:
            row["kl"] = 0.01 * p
            row["time/reference"] = 0.5 + 0.1 * rng.random()
        row["time/step"] = sum(v for k, v in row.items() if k.startswith("time/"))
        logger.log(step, row)
        logged.append(row)
        logger.log_samples(
            step,
            [
                {
                    "prompt": f"What is {step} + {k}? <b>",
                    "completion": f"completion of step {step}\n<script>x</script>",
                    "reward": float(k % 2),
                    "answer": str(step + k),
                }
                for k in range(6)
            ],
        )
        if eval_every and step % eval_every == 0:
            logger.log(step, {"eval/accuracy": 0.2 + 0.5 * p, "eval/mean@4": 0.1 + 0.4 * p})
    logger.close()
    config = {"algo": {"beta": beta, "loss_agg": loss_agg}, "run": {"steps": steps}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return logged


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_real_run_evaluates_every_n_steps_and_its_report_has_every_figure(
    tiny_model_dir, data_file, tmp_path, capsys
):
    from helpers.configs import make_config

    run = tmp_path / "run"
    evals = ("eval.every=2", f"eval.path={data_file}", "eval.num_prompts=6", "eval.samples=3")
    train(make_config(tiny_model_dir, data_file, run, "run.steps=5", *evals), quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "eval/accuracy" in r]
    # before the first step, every 2 steps, and after the last
    assert [r["step"] for r in evaluated] == [0, 2, 4, 5]
    for r in evaluated:
        # 6 prompts, greedy: a multiple of 1/6; 3 samples each: a multiple of 1/18
        assert r["eval/accuracy"] * 6 == pytest.approx(round(r["eval/accuracy"] * 6))
        assert r["eval/mean@3"] * 18 == pytest.approx(round(r["eval/mean@3"] * 18))
        assert 0 <= r["eval/accuracy"] <= 1 and 0 <= r["eval/mean@3"] <= r["eval/pass@3"] <= 1

    # without the start/end evaluations, eval.every still gives the last step its point
    only_every = tmp_path / "only_every"
    config = make_config(
        tiny_model_dir, data_file, only_every, "run.steps=4", *evals, "eval.at_start_end=false"
    )
    train(config, quiet=True)
    rows = [json.loads(line) for line in (only_every / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2, 4]

    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    page = (out / "report.html").read_text()
    for name in FIGURE_NAMES:
        assert (out / f"{name}.png").is_file(), name
        section = re.search(f'<section id="{name}">(.*?)</section>', page, re.S).group(1)
        assert "data:image/png;base64," in section, name
    samples = re.search('<section id="samples">(.*?)</section>', page, re.S).group(1)
    assert len(re.findall(r">\d+\+\d+=<", samples)) == 3 * 4  # early, middle, late steps


def test_figure_list_is_the_one_tested():
    assert [spec.name for spec in FIGURES] == FIGURE_NAMES


def test_every_metric_a_note_names_is_a_name_not_a_pattern():
    keys = [k for spec in FIGURES for panel in spec.panels for k in panel.keys]
    names = [metric_name(k) for k in keys]
    assert all(re.fullmatch(r"[\w/@<>]+", name) for name in names), names
    assert "reward/<name>" in names and "eval/pass@K" in names


def test_report_of_one_run_has_every_figure_and_the_samples(tmp_path):
    run = tmp_path / "grpo"
    make_run(run)
    path = write_report([run])
    assert path == run / "report" / "report.html"
    page = path.read_text()
    for name in FIGURE_NAMES:
        png = (run / "report" / f"{name}.png").read_bytes()
        width, height = png_size(png)
        assert width >= 800 and height >= 350, name
        assert len(png) > 10_000, name
        section = re.search(f'<section id="{name}">(.*?)</section>', page, re.S)
        assert section, name
        embedded = re.search(r'src="data:image/png;base64,([^"]+)"', section.group(1))
        assert base64.b64decode(embedded.group(1)) == png, name
    # Opens with no network: every reference is embedded data or an in-page anchor.
    assert "http://" not in page and "https://" not in page
    assert all(ref.startswith(("data:", "#")) for ref in re.findall(r'(?:src|href)="([^"]*)', page))
    assert "<link" not in page and "<script" not in page
    # Early, middle and late steps, escaped, at most 4 rows each.
    samples = re.search('<section id="samples">(.*?)</section>', page, re.S).group(1)
    shown = re.findall(r"completion of step (\d+)", samples)
    assert shown == ["1"] * 4 + ["16"] * 4 + ["30"] * 4
    assert "&lt;script&gt;x&lt;/script&gt;" in samples and "&lt;b&gt;" in samples
    assert "<td>31</td>" in samples  # the answer of step 30, k=1
    config = re.search('<section id="config">(.*?)</section>', page, re.S).group(1)
    assert "<summary>Resolved config (3 settings)</summary>" in config
    assert "<td><code>algo.beta</code></td><td>0.04</td>" in config


def test_a_series_equal_to_another_is_not_drawn_twice(tmp_path):
    """A lone reward function (weight 1) is reward/mean: its line would hide under the mean's."""
    logger = MetricsLogger(tmp_path / "run")
    for step in range(1, 6):
        mean = 0.1 * step
        logger.log(step, {"reward/mean": mean, "reward/std": 0.1, "reward/correct": mean})
    logger.log(6, {"reward/mean": 0.7, "reward/std": 0.1, "reward/correct": 0.6})
    logger.close()
    (tmp_path / "run" / "config.yaml").write_text("run: {steps: 6}\n")
    figures = {spec.name: fig for spec, fig in render_figures([load_run(tmp_path / "run")], 0.0)}
    labels = sorted(line.get_label() for line in figures["reward"].axes[0].get_lines())
    assert labels == ["reward/correct", "reward/mean"]  # one step differs: both drawn

    other = tmp_path / "same"
    logger = MetricsLogger(other)
    for step in range(1, 6):
        logger.log(
            step, {"reward/mean": 0.1 * step, "reward/std": 0.1, "reward/correct": 0.1 * step}
        )
    logger.close()
    (other / "config.yaml").write_text("run: {steps: 5}\n")
    figures = {spec.name: fig for spec, fig in render_figures([load_run(other)], 0.0)}
    labels = sorted(line.get_label() for line in figures["reward"].axes[0].get_lines())
    assert labels == ["reward/mean"]


def test_plotted_values_are_the_logged_ones(tmp_path):
    logged = make_run(tmp_path / "run")
    figures = {spec.name: fig for spec, fig in render_figures([load_run(tmp_path / "run")], 0.0)}
    steps = np.arange(1, 31)

    lines = {line.get_label(): line for line in figures["reward"].axes[0].get_lines()}
    assert sorted(lines) == ["reward/correct", "reward/format", "reward/mean"]
    np.testing.assert_array_equal(lines["reward/mean"].get_xdata(), steps)
    np.testing.assert_array_equal(
        lines["reward/mean"].get_ydata(), [r["reward/mean"] for r in logged]
    )

    accuracy = {line.get_label(): line for line in figures["eval"].axes[0].get_lines()}
    assert sorted(accuracy) == ["eval/accuracy", "eval/mean@4"]
    np.testing.assert_array_equal(accuracy["eval/accuracy"].get_xdata(), [10, 20, 30])
    np.testing.assert_allclose(
        accuracy["eval/accuracy"].get_ydata(), [0.2 + 0.5 * p for p in (1 / 3, 2 / 3, 1)]
    )

    # Stacked time: the top of the stack is the whole step.
    (time_ax,) = figures["time"].axes
    assert legend_texts(time_ax) == ["time/rollout", "time/reward", "time/reference", "time/train"]
    top = time_ax.collections[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(max(r["time/step"] for r in logged), rel=1e-12)

    length_axes = figures["length"].axes
    assert [ax.get_ylabel() for ax in length_axes] == ["tokens", "fraction truncated"]
    assert all(ax.get_xlabel() == "step" for fig in figures.values() for ax in fig.axes)


def test_two_runs_overlay_with_a_legend_by_run_name(tmp_path, monkeypatch):
    make_run(tmp_path / "grpo", seed=0)
    make_run(tmp_path / "dr_grpo", seed=1, loss_agg="seq-mean-token-sum-norm")
    runs = [load_run(tmp_path / "grpo"), load_run(tmp_path / "dr_grpo")]
    figures = dict(render_figures(runs))
    for spec, fig in figures.items():
        if spec.name == "time":  # stacked areas do not overlay: one axes per run, same scale
            assert [ax.get_title() for ax in fig.axes] == ["grpo", "dr_grpo"]
            assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
            continue
        for ax in fig.axes:
            texts = " ".join(legend_texts(ax))
            assert "grpo" in texts.replace("dr_grpo", "") and "dr_grpo" in texts, spec.name
    assert legend_texts(figures[FIGURES[1]].axes[0]) == [
        "grpo: eval/accuracy",
        "grpo: eval/mean@4",
        "dr_grpo: eval/accuracy",
        "dr_grpo: eval/mean@4",
    ]

    monkeypatch.chdir(tmp_path)
    path = write_report([tmp_path / "grpo", tmp_path / "dr_grpo"])
    assert path.resolve() == tmp_path / "report" / "report.html"
    config = re.search('<section id="config">(.*?)</section>', path.read_text(), re.S).group(1)
    assert "algo.loss_agg" in config and "seq-mean-token-sum-norm" in config
    assert "algo.beta" not in config  # only the settings that differ


def test_figures_without_data_are_skipped_with_a_note(tmp_path):
    run, evaluated = tmp_path / "run", tmp_path / "evaluated"
    # a reward series alone: no eval rows and no kl (beta 0); each figure drawn costs seconds
    log_rows(run, {step: {"reward/mean": step / 4} for step in range(1, 5)})
    log_rows(evaluated, {step: {"reward/mean": 0.5, "eval/accuracy": 0.25} for step in (1, 2)})
    out = tmp_path / "out"
    write_report([evaluated], out)
    assert (out / "eval.png").is_file()  # the earlier report's, which would mislead
    page = write_report([run], out).read_text()
    for name in ("eval", "kl"):
        assert not (out / f"{name}.png").exists()
        section = re.search(f'<section id="{name}">(.*?)</section>', page, re.S).group(1)
        assert "figure skipped" in section and "<img" not in section
    assert (out / "reward.png").is_file()


def test_runs_with_the_same_name_are_told_apart(tmp_path):
    make_run(tmp_path / "a" / "run")
    make_run(tmp_path / "b" / "run", seed=1)
    page = write_report(
        [tmp_path / "a" / "run", tmp_path / "b" / "run"], tmp_path / "out"
    ).read_text()
    assert "<td>a/run</td>" in page and "<td>b/run</td>" in page


def test_a_report_replaces_no_file_a_report_did_not_write(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    # one figure's data (reward): the report is written five times, and each figure costs seconds
    log_rows(run, {step: {"reward/mean": step / 4} for step in range(1, 5)})
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("eval.png", "reward.png", "report.html", "notes.txt"):
        (mine / name).write_text(f"the user's {name}")
    with pytest.raises(UserError, match=r"mine: holds reward.png, which no oncurve report wrote; "):
        write_report([run], mine)
    assert {p.name: p.read_text() for p in mine.iterdir()} == {
        name: f"the user's {name}"
        for name in ("eval.png", "reward.png", "report.html", "notes.txt")
    }
    (mine / "eval.png").unlink(), (mine / "reward.png").unlink(), (mine / "report.html").unlink()
    write_report([run], mine)  # beside files of other names: written, those kept
    assert (mine / "notes.txt").read_text() == "the user's notes.txt"
    write_report([run], mine)  # and again: its own page marks the folder as a report's
    # a report stopped while drawing leaves a folder the next report writes again
    interrupted = tmp_path / "interrupted"

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(report_write, "page", stop)
        with pytest.raises(KeyboardInterrupt):
            write_report([run], interrupted)
    assert (interrupted / "reward.png").is_file()
    assert "<title>oncurve report: " in write_report([run], interrupted).read_text()
    assert main(["report", str(run), "--out", str(mine / "notes.txt")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"oncurve: error: {mine / 'notes.txt'}: is a file; name a directory for the report"
    )
    with pytest.raises(UserError, match=r"run: given twice \(as .*run\)$"):
        write_report([run, run], mine)
    assert main(["report", str(run), str(mine / ".." / "run"), "--out", str(mine)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"oncurve: error: {mine}/../run: given twice (as {run})"
    )


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such run directory"),
        (lambda d: d.mkdir(), "no metrics.jsonl"),
        (
            lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text("")),
            "metrics.jsonl has no metrics yet",
        ),
        (
            lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text('{"step": 1, "kl": null}\n')),
            "every value in metrics.jsonl is null (non-finite)",
        ),
    ],
)
def test_run_without_metrics_gives_a_one_line_error(tmp_path, setup, message):
    run = tmp_path / "myrun"
    setup(run)
    with pytest.raises(UserError) as err:
        write_report([run])
    assert str(err.value).startswith(f"{run}: {message}")
    assert "\n" not in str(err.value)


def test_ema_is_debiased():
    np.testing.assert_allclose(ema(np.full(5, 2.0), 0.9), np.full(5, 2.0))
    np.testing.assert_allclose(ema(np.array([1.0, 3.0]), 0.5), [1.0, 7 / 3])
    np.testing.assert_array_equal(ema(np.array([1.0, 3.0]), 0.0), [1.0, 3.0])
    assert auto_smoothing(30) == 0.0
    assert auto_smoothing(400) == pytest.approx(1 - 2 / 17)


def test_report_without_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    """Plotting is an extra: without matplotlib, `oncurve report` stops with one line that
    names it, and training never needs it."""
    for name in list(sys.modules):
        if name.split(".")[0] == "matplotlib" or name.split(".")[:2] == ["oncurve", "report"]:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    run = tmp_path / "run"
    run.mkdir()
    assert main(["report", str(run)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install 'oncurve[report]'") and "\n" not in err
    package = Path(oncurve.__file__).parent
    importers = [
        str(module.relative_to(package))
        for module in package.rglob("*.py")
        if re.search(r"^\s*(from|import) matplotlib", module.read_text(), re.M)
    ]
    assert importers == ["report/figures.py"]


def log_rows(run_dir, rows):
    """A run directory whose metrics.jsonl holds `rows`, {step: {key: value}}, written as is."""
    run_dir.mkdir(parents=True)
    text = "".join(json.dumps({"step": step, **row}) + "\n" for step, row in rows.items())
    (run_dir / "metrics.jsonl").write_text(text)


def stack_top(ax):
    """step -> height of the stack drawn on `ax` (the top of its last area)."""
    top = {}
    for x, y in ax.collections[-1].get_paths()[0].vertices:
        top[float(x)] = max(top.get(float(x), 0.0), float(y))
    return top


def test_time_figure_keeps_the_steps_where_a_part_is_missing(tmp_path):
    """After a resume with another beta, time/reference stops (or starts): every step is still
    drawn, the missing part counted as 0."""
    rows = {
        step: {"time/rollout": 2.0, "time/reward": 0.5, "time/train": 1.0}
        | ({"time/reference": 0.25} if step <= 4 else {})
        for step in range(1, 7)
    }
    rows[7] = {"time/reference": 0.25}  # a part logged alone still shows
    log_rows(tmp_path / "run", rows)
    figures = dict((s.name, f) for s, f in render_figures([load_run(tmp_path / "run")], 0.0))
    (ax,) = figures["time"].axes
    assert legend_texts(ax) == ["time/rollout", "time/reward", "time/reference", "time/train"]
    assert stack_top(ax) == {1: 3.75, 2: 3.75, 3: 3.75, 4: 3.75, 5: 3.5, 6: 3.5, 7: 0.25}


def test_run_names_show_in_legends_and_titles_as_written(tmp_path):
    """matplotlib hides a label starting with `_` and reads `$...$` as mathtext: the names
    show as they are, and a name that is no valid mathtext does not stop the report."""
    names = ["_base", "a$\\x$"]
    for seed, name in enumerate(names):
        make_run(tmp_path / name, seed=seed)
    runs = [load_run(tmp_path / name) for name in names]
    figures = dict((s.name, f) for s, f in render_figures(runs, 0.0))
    shown = [t.lstrip("\u200b") for t in legend_texts(figures["kl"].axes[0])]
    assert shown == names
    assert [ax.get_title() for ax in figures["time"].axes] == names
    for fig in figures.values():
        for text in fig.findobj(lambda artist: hasattr(artist, "get_parse_math")):
            assert "$" not in text.get_text() or not text.get_parse_math()
    out = tmp_path / "out"
    assert main(["report", *(str(tmp_path / n) for n in names), "--out", str(out)]) == 0
    assert (out / "kl.png").is_file()


def test_a_metric_non_finite_at_every_step_is_named_so(tmp_path):
    """Null in metrics.jsonl is a non-finite value: the note says so, and names the metrics as
    the captions do rather than by the patterns that find them."""
    log_rows(
        tmp_path / "run",
        {s: {"reward/mean": None, "reward/std": None, "length/mean": 3.0} for s in (1, 2, 3)},
    )
    page = write_report([tmp_path / "run"]).read_text()
    reward = re.search('<section id="reward">(.*?)</section>', page, re.S).group(1)
    assert (
        '<p class="note">Non-finite (NaN or infinite) at every step: reward/mean. '
        "No run logged reward/&lt;name&gt;. Figure skipped.</p>"
    ) in reward
    evaluation = re.search('<section id="eval">(.*?)</section>', page, re.S).group(1)
    assert (
        '<p class="note">No run logged these metrics '
        "(eval/accuracy, eval/mean@K, eval/pass@K); figure skipped.</p>"
    ) in evaluation
    assert "(?!" not in page and "\\d" not in page


@pytest.mark.parametrize(
    ("steps", "phases"),
    [
        (1, [(1, "late")]),
        (2, [(1, "early"), (2, "late")]),
        (3, [(1, "early"), (2, "middle"), (3, "late")]),
    ],
)
def test_samples_of_the_first_step_are_early_and_of_the_last_late(tmp_path, steps, phases):
    make_run(tmp_path / "run", steps=steps, eval_every=0)
    page = write_report([tmp_path / "run"]).read_text()
    shown = re.findall(r'<td class="num">(\d+)<br><span class="phase">(\w+)</span>', page)
    assert shown == [(str(step), phase) for step, phase in phases for _ in range(4)]


def test_a_one_step_run_has_whole_step_ticks(tmp_path):
    make_run(tmp_path / "run", steps=1, eval_every=1)
    for spec, fig in render_figures([load_run(tmp_path / "run")]):
        fig.canvas.draw()
        for ax in fig.axes:
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks == [1.0], spec.name


def test_config_values_yaml_reads_as_dates_or_bytes_are_shown(tmp_path):
    """A free-form setting (data.task_options, rollout.env_args) may hold what YAML reads as a
    date, a time or bytes: config.yaml keeps it so, and the report shows it as text."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "data:\n  task_options:\n    since: 2024-01-01\n    at: 2024-01-01 12:30:00\n"
        "    key: !!binary aGk=\n"
    )
    section = config_section([Run("run", run, {})])
    cells = dict(re.findall(r"<td><code>([^<]+)</code></td><td>([^<]*)</td>", section))
    assert cells == {
        "data.task_options.at": "&quot;2024-01-01 12:30:00&quot;",
        "data.task_options.key": "&quot;b&#x27;hi&#x27;&quot;",
        "data.task_options.since": "&quot;2024-01-01&quot;",
    }


def test_a_run_directory_whose_name_is_not_utf8_is_shown_by_its_bytes(tmp_path):
    """A file name on Linux is bytes: one that is not UTF-8 (held in Python as lone surrogates)
    shows its odd bytes as \\xNN in legends and on the page, which is UTF-8 throughout."""
    odd = tmp_path / os.fsdecode(b"run\xff")
    for run in (odd, tmp_path / "good"):
        log_rows(run, {step: {"reward/mean": step / 4} for step in (1, 2)})
        (run / "config.yaml").write_text(yaml.safe_dump({"run": {"dir": str(run)}}))
    runs = [load_run(odd), load_run(tmp_path / "good")]
    figures = dict((s.name, f) for s, f in render_figures(runs, 0.0))
    assert legend_texts(figures["reward"].axes[0]) == ["run\\xff", "good"]
    page = write_report([odd, tmp_path / "good"], tmp_path / "out").read_bytes().decode("utf-8")
    assert "<title>oncurve report: run\\xff, good</title>" in page
    assert f"<td>run\\xff</td><td><code>{tmp_path}/run\\xff</code></td>" in page
    assert f"<td>{tmp_path}/run\\xff</td>" in page  # run.dir in the config's table


def test_a_file_where_a_runs_own_report_folder_goes_is_one_line(tmp_path):
    run = tmp_path / "run"
    log_rows(run, {1: {"reward/mean": 0.5}})
    (run / "report").write_text("the user's notes")
    with pytest.raises(UserError) as info:
        write_report([run])
    assert str(info.value) == f"{run / 'report'}: is a file; name a directory for the report"
    assert (run / "report").read_text() == "the user's notes"


def test_controls_in_a_completion_show_as_code_points(tmp_path):
    """A completion is model output: a bidirectional control would reorder what follows it
    unseen (the model's 71 shown as 17) and a browser drops NUL, so each such character shows
    as its code point; other text, right-to-left scripts too, is kept as written."""
    logger = MetricsLogger(tmp_path)
    logger.log_samples(
        1, [{"prompt": "p\x1b[0m", "completion": "a \u202e71\u202c b\x00c\tשלום\n", "answer": "71"}]
    )
    section = samples_section(Run("run", tmp_path, {}))
    assert (
        '<div class="text">a <span class="control">U+202E</span>71'
        '<span class="control">U+202C</span> b<span class="control">U+0000</span>c\tשלום\n</div>'
    ) in section
    assert '<div class="text">p<span class="control">U+001B</span>[0m</div>' in section


def test_steps_where_a_drawn_metric_was_non_finite_are_named_under_its_figure(tmp_path):
    """The line of a metric joins the finite values either side of a null (a NaN gradient
    norm): the figure's section names those steps, which the drawing does not show."""
    rows = {step: {"grad_norm": 1.0, "loss/policy": 0.5} for step in range(1, 16)}
    for step in range(3, 15):
        rows[step]["grad_norm"] = None
    rows[2]["loss/policy"] = None
    log_rows(tmp_path / "run", rows)
    run = load_run(tmp_path / "run")
    optim = next(spec for spec in FIGURES if spec.name == "optim")
    section = figure_section(optim, b"png", [run])
    assert (
        '<p class="note">Non-finite (NaN or infinite), not drawn: grad_norm at 12 steps '
        "(3, 4, 5, 6, 7, 8, 9, 10, 11, 12, ...); loss/policy at step 2.</p>"
    ) in section
    entropy = next(spec for spec in FIGURES if spec.name == "entropy")
    assert '"note"' not in figure_section(entropy, b"png", [run])
    log_rows(tmp_path / "other", {1: {"grad_norm": None}, 2: {"grad_norm": 1.0}})
    section = figure_section(optim, b"png", [run, load_run(tmp_path / "other")])
    assert "; run: loss/policy at step 2; other: grad_norm at step 1.</p>" in section
    assert "run: grad_norm at 12 steps" in section
