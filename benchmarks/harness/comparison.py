"""One trainer against another on the `arith` GRPO job in one command (`vs_trl.py`,
`grpo_vs_ppo.py`): shared flags and job, alternating runs, each trainer's figures, the row and
its section."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections.abc import Callable, Iterable
from itertools import zip_longest
from pathlib import Path
from typing import Any

from harness.children import export_task, train_oncurve
from harness.machine import load_note
from harness.run_logs import planned_peak_gb, step_phases
from harness.spec import Job
from harness.tables import cell, markdown_table


def parser(doc: str, models: str, runs: int, microbatch: int | None) -> argparse.ArgumentParser:
    """The command line both comparisons take; `models` lists the model names for --help."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", default="default", help=f"{models} | PATH")
    for flag, meaning in (("--steps", "steps per run"), ("--prompts", "prompts per step"),
                          ("--group", "G"), ("--tokens", "completion tokens")):  # fmt: skip
        p.add_argument(flag, type=int, help=f"{meaning} (default: per model)")
    p.add_argument("--runs", type=int, default=runs, help="runs per trainer, alternating")
    p.add_argument("--lr", type=float, default=1e-4, help="both trainers (and PPO's critic)")
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--epsilon", type=float, default=0.2)
    p.add_argument("--mu", type=int, default=1)
    p.add_argument("--eval-n", type=int, default=200, help="held-out prompts scored (0: none)")
    p.add_argument("--microbatch", type=int, default=microbatch, help="rows per forward/backward")
    p.add_argument("--gradient-checkpointing", action="store_true", help="on in both")
    return p


def arith_job(
    args: argparse.Namespace,
    path: str | Path,
    scenario: tuple[int, int, int, bool, int],
    more: dict[str, Any],
) -> Job:
    """GRPO on `arith` with the model at `path`: the scenario's (prompts, G, tokens, forced,
    steps) where the command line sets none, its GRPO settings, `more` (dotted keys) on top."""
    prompts, group, tokens, force, steps = scenario
    tokens = args.tokens or tokens
    return Job({
        "model.path": str(path),
        "model.gradient_checkpointing": args.gradient_checkpointing,
        "data.task": "arith",
        "data.prompts_per_step": args.prompts or prompts,
        "rollout.group_size": args.group or group,
        "rollout.max_new_tokens": tokens,
        "rollout.min_new_tokens": tokens if force else 0,
        "algo.preset": "grpo",
        "algo.beta": args.beta,
        "algo.epsilon": args.epsilon,
        "algo.mu": args.mu,
        "optim.lr": args.lr,
        "eval.at_start_end": False,
        "log.samples_per_step": 0,
        "run.steps": args.steps or steps,
        **more,
    })  # fmt: skip


def fresh(work: Path, eval_n: int) -> tuple[Path, Path | None]:
    """`work` emptied, and `eval_n` held-out `arith` prompts exported into it (None for 0)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work, export_task("arith", "test", eval_n, work / "test.jsonl") if eval_n else None


def oncurve_run(job: Job, out: Path) -> dict[str, Any]:
    """`job` in a fresh `oncurve train` into `out/run`: wall, RSS, per-step figures, peak CUDA
    MB and the memory plan's GiB (None on the CPU), the final model's directory."""
    done = train_oncurve(job.oncurve_args(), out / "run", out / "log.txt")
    steps = done.pop("rows")
    cuda = [r["memory/gpu_peak_gb"] * 1024 for r in steps if "memory/gpu_peak_gb" in r]
    return done | {
        "seconds": [r["time/step"] for r in steps],
        "phases": step_phases(steps),
        "mean_reward": [r["reward/mean"] for r in steps],
        "length": [r["length/mean"] for r in steps],
        "cuda": max(cuda, default=None),
        "plan_gb": planned_peak_gb((out / "log.txt").read_text()),
        "final": str(out / "run" / "final"),
    }


def alternate(
    labels: Iterable[str],
    runs: int,
    run: Callable[[str, int], dict],
    after: Callable[[dict[str, list[dict]]], None] | None = None,
) -> dict[str, list[dict]]:
    """`run(label, index)` for the labels in turn (A, B, A, B: a slow patch of the machine falls
    on both), `runs` times; the figures by label. `after` sees them after every run."""
    done: dict[str, list[dict]] = {label: [] for label in labels}
    for index in range(runs):
        for label in done:
            print(f"run {index + 1}/{runs}: {label} ...", flush=True)
            done[label].append(run(label, index))
            if after:
                after(done)
    return done


def pairs_writer(path: str | None) -> Callable[[dict[str, list[dict]]], None]:
    """An `after` for `alternate` writing {"pairs": [{label: run, ...}, ...]} to `path` (if any)."""

    def write(runs: dict[str, list[dict]]) -> None:
        if path:
            pairs = [zip(runs, pair, strict=True) for pair in zip_longest(*runs.values())]
            Path(path).write_text(json.dumps({"pairs": [{t: r for t, r in p if r} for p in pairs]}))

    return write


def printed(figures: dict[str, Any]) -> dict[str, Any]:
    """A run's `figures`, once printed: median s/step, peak RSS (and CUDA), accuracy."""
    cuda = f", peak CUDA {figures['cuda']:,.0f} MB" if figures.get("cuda") else ""
    print(f"  {statistics.median(figures['seconds']):.2f} s/step (median), peak RSS "
          f"{figures['rss']:,.0f} MB{cuda}, accuracy {cell(figures['accuracy'], '.1%')}",
          flush=True)  # fmt: skip
    return figures


def steady_median(series: Iterable[list[float]]) -> float:
    """The median of every series' values after its first (its warm-up), or of a lone value."""
    return statistics.median(x for values in series for x in values[1:] or values)


def summary(runs: list[dict]) -> dict[str, Any]:
    """One trainer's figures over its runs: steady median s/step ("s") and per phase, the
    highest peaks, mean reward over all steps and at the last, mean accuracy (None unscored)."""

    def highest(key: str) -> float | None:
        return max((r[key] for r in runs if r.get(key) is not None), default=None)

    scored = all(r["accuracy"] is not None for r in runs)
    return {
        "s": steady_median(r["seconds"] for r in runs),
        "rss": highest("rss"),
        "cuda": highest("cuda"),
        "plan_gb": highest("plan_gb"),
        "reward": statistics.mean(x for r in runs for x in r["mean_reward"]),
        "last": statistics.mean(r["mean_reward"][-1] for r in runs),
        "acc": statistics.mean(r["accuracy"] for r in runs) if scored else None,
        "phases": {p: steady_median(r["phases"][p] for r in runs) for p in runs[0]["phases"]},
    }


def floor_figures(runs: list[dict], settings: dict, params: int, gflops: float) -> dict[str, Any]:
    """`summary` with the mean length, the step's FLOP floor in seconds at `gflops` ("floor": 2N
    per generated and reference token, 6N per trained token and epoch) and each phase's multiple
    of its own floor ("x_floor")."""
    rows = settings["data.prompts_per_step"] * settings["rollout.group_size"]
    seconds: dict[str, list[float]] = {}
    for run in runs:
        generated = rows * statistics.mean(run["length"])
        tokens = run["prompt_tokens"] + generated
        flops = {"generate": 2 * params * generated, "rollout": 2 * params * generated}
        flops["reference"] = 2 * params * tokens * (settings["algo.beta"] > 0)
        flops["train"] = 6 * params * tokens * settings["algo.mu"]
        for phase, f in flops.items():
            seconds.setdefault(phase, []).append(f / (gflops * 1e9))
    floor = {phase: statistics.mean(values) for phase, values in seconds.items()}
    figures = summary(runs)
    return figures | {
        "length": statistics.mean(x for r in runs for x in r["length"]),
        "floor": floor["rollout"] + floor["reference"] + floor["train"],
        "x_floor": {p: s / floor[p] for p, s in figures["phases"].items() if floor.get(p)},
    }


def two_errors(p: float, n: int) -> float:
    """Two binomial standard errors of an accuracy `p` over `n` prompts."""
    p = min(max(p, 0.0), 1.0)
    return 2 * (p * (1 - p) / n) ** 0.5


def met(value: float, limit: float) -> str:
    """A target's verdict: "met" when `value` is at most `limit`, else "missed"."""
    return "met" if value <= limit else "missed"


def grpo_settings(settings: dict[str, Any], notes: dict[str, str] | None = None) -> str:
    """ "lr 0.0001, beta 0.04, epsilon 0.2, mu 1", each with its note from `notes` in brackets."""
    named = {"lr": "optim.lr", "beta": "algo.beta", "epsilon": "algo.epsilon", "mu": "algo.mu"}
    notes = notes or {}
    return ", ".join(
        f"{name} {settings[key]}" + (f" ({notes[name]})" if name in notes else "")
        for name, key in named.items()
    )


def measured_row(
    args: argparse.Namespace,
    job: Job,
    params: int,
    load: str,
    runs: dict[str, list[dict]],
    figures: Callable[[list[dict]], dict[str, Any]],
    **more: Any,
) -> dict[str, Any]:
    """A comparison's row, what `section` reads: the job's settings, `load` before and after,
    the `more` figures, the `runs` by trainer and each trainer's `figures` over them."""
    return {
        "model": args.model,
        "settings": job.settings | {"run.seed": "0..runs-1"},
        "runs_per_trainer": args.runs,
        "eval_n": args.eval_n,
        "params": params,
        "load_note": f"{load} before, {load_note()} after",
        **more,
        "runs": runs,
        "trainers": {label: figures(done) for label, done in runs.items()},
    }


def section(
    row: dict[str, Any],
    details: str,
    columns: list[tuple[str, str | Callable, str]],
    notes: list[str],
    phases: str = "",
    most: int | None = None,
    more: dict[str, Callable[[dict], str]] | None = None,
) -> str:
    """A comparison's markdown section: heading, where measured with `details`, the trainers'
    table of `columns`, the `notes`, the phase table (`phases` adds to its title), the runs."""
    s, trainers = row["settings"], row["trainers"]
    forced = ", forced to full length" if s["rollout.min_new_tokens"] else ""
    checkpointing = "on" if s["model.gradient_checkpointing"] else "off"
    return "\n\n".join([
        f"### {row['key']}: {row['params'] / 1e6:.2f}M params, {s['data.prompts_per_step']} "
        f"prompts x G={s['rollout.group_size']}, {s['rollout.max_new_tokens']} tokens{forced}, "
        f"{s['run.steps']} steps x {row['runs_per_trainer']} runs per trainer",
        f"Measured {row['date']} at {row['commit']} on {row['cpu']}; `{row['command']}`; "
        f"{details}, gradient checkpointing {checkpointing}; {row['load_note']}.",
        trainer_table(trainers, list(trainers)[-1], columns),
        *notes,
        f"Median seconds per phase (steps after the first{phases}):",
        phase_table(trainers),
        "Per run (steps in order; wall includes start-up, saving and logging):",
        run_table(row["runs"], most, more),
    ]) + "\n"  # fmt: skip


def trainer_table(
    trainers: dict[str, dict], base: str, columns: list[tuple[str, str | Callable, str]]
) -> str:
    """A line per trainer, a cell per column (header, key or function of the figures, format
    spec); spec "x": a multiple of the `base` trainer's figure ("0.75x")."""

    def value(figures: dict, figure: str | Callable) -> Any:
        return figure(figures) if callable(figure) else figures[figure]

    def shown(figures: dict, figure: str | Callable, spec: str) -> str:
        if spec == "x":
            return f"{value(figures, figure) / value(trainers[base], figure):.2f}x"
        return cell(value(figures, figure), spec)

    rows = [
        [label, *(shown(t, f, spec) for _, f, spec in columns)] for label, t in trainers.items()
    ]
    return markdown_table(["trainer", *(header for header, _, _ in columns)], rows)


def phase_table(trainers: dict[str, dict]) -> str:
    """Each trainer's median seconds per phase, its share of the step and its multiple of the
    phase's FLOP floor where the figures have one."""
    floors = any(t.get("x_floor") for t in trainers.values())
    rows = []
    for label, t in trainers.items():
        for phase, s in t["phases"].items():
            x = t.get("x_floor", {}).get(phase)
            rows.append([label, phase, f"{s:.3f}", f"{s / t['s']:.0%}"])
            rows[-1] += [f"{x:.1f}x" if x else ""] if floors else []
    header = ["trainer", "phase", "median s", "share of step"] + (["x floor"] if floors else [])
    return markdown_table(header, rows)


def run_table(
    runs: dict[str, list[dict]],
    most: int | None = None,
    more: dict[str, Callable[[dict], str]] | None = None,
) -> str:
    """A line per run in the order they ran: each step's seconds ("..." beyond `most` steps or
    none kept), peak RSS, wall seconds, accuracy and the `more` columns."""

    def steps(run: dict) -> str:
        seconds = run.get("seconds") or []
        if not seconds or (most is not None and len(seconds) > most):
            return "..."
        return " ".join(f"{x:.2f}" for x in seconds)

    columns = {
        "s per step": steps,
        "peak RSS MB": lambda r: f"{r['rss']:,.0f}",
        "wall s": lambda r: f"{r['wall']:.0f}",
        "acc.": lambda r: cell(r["accuracy"], ".1%"),
        **(more or {}),
    }
    rows = [
        [label, str(i + 1), *(show(run) for show in columns.values())]
        for i, pair in enumerate(zip_longest(*runs.values()))
        for label, run in zip(runs, pair, strict=True)
        if run
    ]
    return markdown_table(["trainer", "run", *columns], rows)
