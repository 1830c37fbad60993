"""What the learning-curve studies share: held-out scores as the trainer's evaluation gives
them, runs (also for a budget of seconds) and their curves as figures and plots."""

from __future__ import annotations

import functools
import shutil
import statistics
from pathlib import Path
from typing import Any

from harness.checkout import checkout_env
from harness.children import train_oncurve, train_oncurve_for
from harness.run_logs import step_phases
from harness.spec import Job
from harness.trl_env import run_trl

# the settings a study's page states, as `key=value` overrides name them
SETTINGS = ("run.steps", "data.prompts_per_step", "rollout.group_size", "rollout.max_new_tokens",
            "optim.lr", "optim.schedule", "algo.beta")  # fmt: skip


def settings(config: Any) -> dict[str, Any]:
    """`SETTINGS` of an oncurve `Config`."""
    return {key: functools.reduce(getattr, key.split("."), config) for key in SETTINGS}


def describe(values: dict[str, Any]) -> str:
    """`settings` as "10 steps of 8 prompts x G=8, 32 new tokens, lr 2e-05 (cosine), beta 0.0"."""
    schedule = f" ({values['optim.schedule']})" if "optim.schedule" in values else ""
    return (
        f"{values['run.steps']} steps of {values['data.prompts_per_step']} prompts x "
        f"G={values['rollout.group_size']}, {values['rollout.max_new_tokens']} new tokens, lr "
        f"{values['optim.lr']}{schedule}, beta {values['algo.beta']}"
    )


def require(*paths: Path) -> None:
    """Exit with a pointer to `make smollm2` when one of `paths` (a model, data) is missing."""
    for path in paths:
        if not path.exists():
            raise SystemExit(f"{path} is missing: run `make smollm2` first")


def held_out(
    model_dir: str, config: Any, samples: int = 1, device: str = "cpu", backend: str = "auto"
) -> tuple[dict[str, float], list[dict], list[dict]]:
    """A model's or checkpoint's held-out scores as the trainer evaluates `config`'s task, in
    float32 on `device` with sampler `backend` (`samples` > 1: that many more at temperature 1):
    `evaluate`'s result, the prompt rows and a record per row."""
    from oncurve.data.prompts import PromptData, correctness_fn
    from oncurve.data.tasks import get_task
    from oncurve.loop.collect import sampling_params
    from oncurve.loop.evaluate import evaluate
    from oncurve.model.sources import load_model, load_tokenizer
    from oncurve.rollout import build_sampler
    from oncurve.run.checkpoint_model import checkpoint_config, find_checkpoint
    from oncurve.run.checkpoint_model import load_checkpoint_model as load_checkpoint

    task = get_task(config.data.task, config.data.task_options)
    reward = correctness_fn(config, task)
    if hasattr(reward, "configure"):  # the code sandbox's settings, as a run applies them
        reward.configure(config.reward)
    if (found := find_checkpoint(model_dir)) is not None:
        model, tokenizer = load_checkpoint(found, checkpoint_config(found), "float32", device)
    else:
        tokenizer = load_tokenizer(model_dir)
        model = load_model(model_dir, "float32", device)
    model.eval()
    examples = task.examples("test", config.eval.num_prompts, config.run.seed)
    rows = PromptData(examples, tokenizer, config.data, seed=config.run.seed).rows
    records: list[dict] = []
    sampler = build_sampler(backend, model, tokenizer)
    params = sampling_params(config, config.run.seed)
    result = evaluate(sampler, rows, reward, params, samples=samples, records=records)
    return result, rows, records


def checkpoint_accuracy(model_dir: str | Path, config: Any, device: str) -> float:
    """`held_out` greedy accuracy by HF's decode (`cuda_graph` would compile per checkpoint)."""
    return held_out(str(model_dir), config, device=device, backend="hf")[0]["accuracy"]


def checkpoint_curve(
    folder: Path, pattern: str, step_seconds: list[float], config: Any, device: str, start: float
) -> list[list[float]]:
    """[[training seconds, accuracy]]: `start` at 0 s, then each `pattern` (`step-N`,
    `checkpoint-N`) checkpoint in `folder` at the sum of its N `step_seconds`."""
    saved = sorted((int(path.name.split("-")[1]), path) for path in folder.glob(pattern))
    return [[0.0, start]] + [
        [round(sum(step_seconds[:step]), 2), checkpoint_accuracy(path, config, device)]
        for step, path in saved
    ]


def budget_curves(
    job: Job,
    work: Path,
    envs: dict[str, dict[str, str]],
    trl_python: str,
    device: str,
    start: float,
) -> dict[str, list[list[float]]]:
    """oncurve's and (where `envs` has "TRL" and its run finishes) TRL's held-out curve on `job`,
    each trained for `job.seconds_budget` seconds of steps; checkpoints scored after both."""
    run_dir = work / "oncurve" / "run"
    seconds = train_oncurve_for(
        job.oncurve_args(), run_dir, work / "oncurve" / "oncurve.log", job.seconds_budget
    )
    runs = {"oncurve": (run_dir / "checkpoints", "step-*", seconds)}
    shutil.rmtree(work / "trl", ignore_errors=True)  # an earlier run's checkpoints
    if "TRL" in envs:
        done = run_trl(job, work / "trl", trl_python, envs["TRL"], check=False)
        if not done["code"]:
            runs["TRL"] = (work / "trl" / "trainer", "checkpoint-*", done["seconds"])
    config = job.config()
    return {label: checkpoint_curve(*run, config, device, start) for label, run in runs.items()}


def train(
    args: list[str], out: Path, reward: str = "correct", metrics: tuple[str, ...] = ()
) -> dict[str, Any]:
    """`oncurve train` of the checkout into `out/run`: wall, RSS, final model, each step's
    seconds, phases, `reward` and `metrics`, the steady median s/step and each evaluation as
    [step, training seconds so far, accuracy] ("evals")."""
    from oncurve.run.metrics import read_jsonl

    done = train_oncurve(args, out / "run", out / "log.txt", env=checkout_env())
    elapsed, evals = 0.0, []
    for r in read_jsonl(out / "run" / "metrics.jsonl"):
        elapsed += r.get("time/step", 0.0)
        if "eval/accuracy" in r:
            evals.append([r["step"], round(elapsed, 1), r["eval/accuracy"]])
    seconds = [r["time/step"] for r in done["rows"]]
    return {
        "wall_s": round(done["wall"], 1),
        "rss_mb": round(done["rss"]),
        "final": str(out / "run" / "final"),
        "seconds": seconds,
        "s_per_step": statistics.median(seconds[1:] or seconds),
        "phases": step_phases(done["rows"]),
        "reward": [r[f"reward/{reward}"] for r in done["rows"]],
        "evals": evals,
        **{name: [r[name] for r in done["rows"]] for name in metrics},
    }


def last_samples(run_dir: Path, count: int) -> list[dict[str, Any]]:
    """The first `count` samples a run logged of its last step, with prompt, answer, reward."""
    from oncurve.run.metrics import SAMPLES_FILE, read_jsonl

    rows = list(read_jsonl(run_dir / SAMPLES_FILE))
    last = [r for r in rows if r["step"] == rows[-1]["step"]] if rows else []
    keys = ("step", "prompt", "answer", "reward", "completion")
    return [{k: r.get(k) for k in keys} for r in last[:count]]


def curve_figures(
    curve: list[tuple[int, float]], seconds: dict[int, float], targets: list[float]
) -> dict[str, Any]:
    """A curve [(step, accuracy)] as figures: accuracy before, after, best, mean after the
    start; per target [first step reaching it, seconds to it] or None; all training seconds."""

    def until(step: int) -> float:
        return sum(s for k, s in seconds.items() if k <= step)

    reach = [next((step for step, acc in curve if acc >= t), None) for t in targets]
    return {
        "before": curve[0][1],
        "after": curve[-1][1],
        "best": max(acc for _, acc in curve),
        "mean": statistics.fmean(acc for step, acc in curve if step > 0),
        "reach": [None if step is None else [step, until(step)] for step in reach],
        "train_s": until(max(seconds)),
    }


def over_seeds(runs: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    """An arm's figures over its seeds' runs: the mean of each of `keys`, and per target
    [runs reaching it, runs, their mean first step]."""
    firsts = [
        [r["reach"][i][0] for r in runs if r["reach"][i]] for i in range(len(runs[0]["reach"]))
    ]
    reach = [[len(f), len(runs), statistics.fmean(f) if f else None] for f in firsts]
    return {key: statistics.fmean(r[key] for r in runs) for key in keys} | {"reach": reach}


def plot(path: Path, panels: list[dict[str, Any]]) -> None:
    """The PNG `path`, panels side by side: {"x", "y", "lines": [(label, xs, ys, options)], and
    optional "title", "points": {label: (x, y)}, "base": a dotted y (the base model's)}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for axis, panel in zip(axes[0], panels, strict=True):
        for label, xs, ys, options in panel["lines"]:
            axis.plot(xs, ys, **{"marker": "o" if len(xs) < 20 else None, **options}, label=label)
        for label, (x, y) in panel.get("points", {}).items():
            axis.scatter([x], [y], marker="x", s=80, label=label)
        if panel.get("base") is not None:
            axis.axhline(panel["base"], color="grey", linestyle=":", label="base model")
        axis.set(xlabel=panel["x"], ylabel=panel["y"], title=panel.get("title", ""))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_arms(path: Path, arms: dict[str, list[dict]], title: str, metric: str) -> None:
    """The PNG `path` of a study's arms: each arm's held-out curves (seeds faint, their mean
    bold), and beside them the 10-step mean of `metric` over its runs."""
    curves, smoothed, window = [], [], 10
    for index, (arm, runs) in enumerate(arms.items()):
        color = {"color": f"C{index}"}
        faint = {**color, "alpha": 0.25, "marker": None}
        curves += [(None, *zip(*r["curve"], strict=True), faint) for r in runs]
        steps = [s for s, _ in runs[0]["curve"]]
        mean = [statistics.fmean(dict(r["curve"])[s] for r in runs) for s in steps]
        curves.append((f"{arm} (mean of {len(runs)})", steps, mean, color))
        values = [r[metric] for r in runs]
        smooth = [
            statistics.fmean(x for v in values for x in v[max(0, t + 1 - window) : t + 1])
            for t in range(len(values[0]))
        ]
        smoothed.append((arm, range(1, len(smooth) + 1), smooth, color))
    held = {"title": title, "x": "step", "y": "held-out greedy accuracy", "lines": curves}
    plot(path, [held, {"x": "step", "y": f"{metric} ({window}-step mean)", "lines": smoothed}])
