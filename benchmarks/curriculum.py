"""Curriculum against none (issue 29) on a task the bundled model starts below 10% on: held-out
accuracy over training, time to accuracy, and the rollouts each run spent on all-equal groups.

The job: the bundled model on `arith` with both operands 4 digits (`data.task_options=
{min_digits: 4}`; about 3% held-out greedy before training, against 37% on the default mix of 1
to 4 digits), rewarded for correctness alone (the task's `exact_sum_reward`, without its 0.1
format term, so that an all-equal group is one whose answers are all right or all wrong), B=16
prompts x G=8, 64 new tokens, the default GRPO settings (lr 1e-4, beta 0.04), `--train`
training problems, so that a prompt comes back several times in a run and its pass rate can
matter (the same pool for every arm), `--steps` steps, held-out greedy accuracy on `--eval-n`
test problems every `--eval-every` steps. Arms (`data.curriculum`): `none` (the seeded order),
`pass_rate` (default floor, 0.1) and `difficulty` (operands of 1, then 2, 3 and 4 digits, up a
level at `--threshold`, lower than the default 0.8 so that the four levels fit in a short run),
each over `--seeds` seeds. Every run is a fresh `oncurve train` process; `--parallel` of them
run at once, each on one thread.

Time to accuracy: the first evaluation at which held-out accuracy reaches each `--targets`
value, as steps, sampled completions (steps x B x G) and training seconds (the sum of
`time/step` up to that step, which shared cores make noisy). Rollouts on all-equal groups: the
sum over steps of `groups/all_equal_frac` x B x G, completions whose group had no advantage.

    .venv/bin/python benchmarks/curriculum.py                  # 3 arms x 3 seeds
    .venv/bin/python benchmarks/curriculum.py --arms none pass_rate --steps 60 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.checkout import CACHE, RESULTS
from harness.machine import cpu_name, load_note
from harness.tables import markdown_table, publish

WORK = CACHE / "curriculum"
CURVE = RESULTS / "curriculum.png"
TITLE = (
    "Curriculum against none\n\nWritten by `benchmarks/curriculum.py`, one section per job setting."
)
PROMPTS, GROUP = 16, 8
# The task's own correctness reward alone: with the 0.1 format term a group of wrong answers
# differs in format half the time, so all-equal would not mean "all right or all wrong".
CORRECT_ONLY = "oncurve.data.tasks.arith:exact_sum_reward"


def job_args(arm: str, seed: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """`oncurve train` overrides of one run."""
    return [
        "data.task=arith",
        "data.task_options={min_digits: 4}",
        f"data.num_train={args.train}",
        f"data.prompts_per_step={PROMPTS}",
        f"rollout.group_size={GROUP}",
        f"data.curriculum={arm}",
        f"reward.functions=[{CORRECT_ONLY}]",
        f"data.curriculum_threshold={args.threshold}",
        f"run.steps={args.steps}",
        f"run.seed={seed}",
        f"eval.every={args.eval_every}",
        f"eval.num_prompts={args.eval_n}",
        "run.threads=1",
        "run.device=cpu",
        f"run.dir={run_dir}",
        "run.overwrite=true",
    ]


def run_all(args: argparse.Namespace) -> dict[tuple[str, int], Path]:
    """Every (arm, seed) run, `args.parallel` at a time, seeds outermost so that a slow patch
    of the shared machine falls on every arm alike; their run directories."""
    jobs = [(arm, seed) for seed in range(args.seeds) for arm in args.arms]
    dirs = {job: WORK / f"{job[0]}-seed{job[1]}" for job in jobs}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    waiting, running = list(jobs), {}
    while waiting or running:
        while waiting and len(running) < args.parallel:
            job = waiting.pop(0)
            command = [sys.executable, "-m", "oncurve", "train", "--quiet"]
            command += job_args(*job, args, dirs[job])
            log = open(WORK / f"{job[0]}-seed{job[1]}.log", "w")  # noqa: SIM115
            running[job] = (subprocess.Popen(command, stdout=log, stderr=log, env=env), log)
            print(f"started {job[0]} seed {job[1]}", flush=True)
        time.sleep(2)
        for job, (proc, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[job]
            if proc.returncode:
                raise SystemExit(f"{job} failed; see {log.name}")
            print(f"finished {job[0]} seed {job[1]}", flush=True)
    return dirs


def read_run(run_dir: Path) -> dict:
    """The curve (step, held-out accuracy) and, by step, the metrics the page reads: seconds,
    the all-equal fraction and the curriculum's level."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = ("time/step", "groups/all_equal_frac", "curriculum/level")
    steps = {r["step"]: {k: r[k] for k in kept if k in r} for r in rows if "time/step" in r}
    curve = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    return {"steps": steps, "curve": curve}


def first_reach(run: dict, target: float) -> int | None:
    """The first evaluated step whose held-out accuracy reaches `target`."""
    return next((step for step, acc in run["curve"] if acc >= target), None)


def seconds_to(run: dict, step: int) -> float:
    return sum(r["time/step"] for s, r in run["steps"].items() if s <= step)


def all_equal_rollouts(run: dict) -> float:
    return sum(r["groups/all_equal_frac"] * PROMPTS * GROUP for r in run["steps"].values())


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def plot(runs: dict[tuple[str, int], dict], arms: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for index, arm in enumerate(arms):
        color = f"C{index}"
        mine = [run for (name, _), run in runs.items() if name == arm]
        for run in mine:
            left.plot(*zip(*run["curve"], strict=True), color=color, alpha=0.25)
        steps = [s for s, _ in mine[0]["curve"]]
        left.plot(
            steps,
            [mean([dict(r["curve"])[s] for r in mine]) for s in steps],
            color=color,
            marker="o",
            label=f"{arm} (mean of {len(mine)})",
        )
        window = 10
        last = max(mine[0]["steps"])
        smooth = [
            mean(
                [
                    r["steps"][s]["groups/all_equal_frac"]
                    for r in mine
                    for s in range(max(1, t - window + 1), t + 1)
                ]
            )
            for t in range(1, last + 1)
        ]
        right.plot(range(1, last + 1), smooth, color=color, label=arm)
    left.set(xlabel="step", ylabel="held-out greedy accuracy", title="4+4-digit arith, held out")
    right.set(
        xlabel="step",
        ylabel="groups/all_equal_frac (10-step mean)",
        title="groups without an advantage",
    )
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(CURVE, dpi=110)


def level_lines(runs: dict[tuple[str, int], dict], args: argparse.Namespace) -> list[str]:
    """For the difficulty arm, the first step of each level it reached, per seed."""
    if "difficulty" not in args.arms:
        return []
    lines = []
    for seed in range(args.seeds):
        steps = runs[("difficulty", seed)]["steps"]
        first: dict[int, int] = {}
        for step in sorted(steps):
            first.setdefault(int(steps[step]["curriculum/level"]), step)
        lines.append(
            f"seed {seed}: " + ", ".join(f"level {k} at step {s}" for k, s in first.items())
        )
    return [
        "\nDifficulty levels (0: 1-digit operands ... 3: the 4-digit target), first step at each: "
        + "; ".join(lines)
        + ".\n"
    ]


def mean_accuracy(run: dict) -> float:
    """Held-out accuracy averaged over the evaluations after the start: the area under the
    curve, less noisy than any one evaluation of a few hundred problems."""
    return mean([acc for step, acc in run["curve"] if step > 0])


def section(row: dict) -> str:
    """The markdown section of one row: each arm over its seeds, each run, the levels."""
    args = argparse.Namespace(**row["args"])
    runs = {
        (arm, seed): {"curve": run["curve"], "steps": {int(k): v for k, v in run["steps"].items()}}
        for key, run in row["runs"].items()
        for arm, seed in [(key.rsplit("/", 1)[0], int(key.rsplit("/", 1)[1]))]
    }
    per_run, summary = [], []
    for arm in args.arms:
        mine = {seed: runs[(arm, seed)] for seed in range(args.seeds)}
        for seed, run in mine.items():
            reach = [first_reach(run, t) for t in args.targets]
            per_run.append(
                [
                    arm,
                    str(seed),
                    f"{run['curve'][0][1]:.1%}",
                    f"{run['curve'][-1][1]:.1%}",
                    f"{max(a for _, a in run['curve']):.1%}",
                    f"{mean_accuracy(run):.1%}",
                    *("-" if s is None else f"{s} ({seconds_to(run, s):.0f} s)" for s in reach),
                    f"{mean([r['groups/all_equal_frac'] for r in run['steps'].values()]):.3f}",
                    f"{all_equal_rollouts(run):,.0f}",
                    f"{seconds_to(run, args.steps):.0f}",
                ]
            )
        cells = []
        for target in args.targets:
            reached = [first_reach(run, target) for run in mine.values()]
            hits = [s for s in reached if s is not None]
            cells.append(
                f"{len(hits)}/{len(reached)}"
                + (
                    f", mean {mean(hits):.0f} steps ({mean(hits) * PROMPTS * GROUP:,.0f} rollouts)"
                    if hits
                    else ""
                )
            )
        summary.append(
            [
                arm,
                f"{mean([r['curve'][-1][1] for r in mine.values()]):.1%}",
                f"{mean([mean_accuracy(r) for r in mine.values()]):.1%}",
                *cells,
                f"{mean([all_equal_rollouts(r) for r in mine.values()]):,.0f}"
                f" of {args.steps * PROMPTS * GROUP:,}",
                f"{mean([seconds_to(r, args.steps) for r in mine.values()]):.0f}",
            ]
        )
    targets = [f"reach {t:.0%}" for t in args.targets]
    lines = [
        f"## arith, 4+4 digits, {args.steps} steps, {args.train} training problems\n",
        f"{row['date']} at {row['commit']}, `{row['command']}`, {row['cpu']}, "
        f"{args.parallel} runs at once on one thread each; {row['load_note']}.\n",
        f"Bundled model, `data.task_options={{min_digits: 4}}`, correctness reward only, "
        f"B={PROMPTS} x G={GROUP}, 64 tokens, lr 1e-4, beta 0.04; pass_rate floor 0.1, "
        f"difficulty threshold {args.threshold}; held-out greedy accuracy on {args.eval_n} test problems "
        f"every {args.eval_every} steps; seeds 0-{args.seeds - 1}. Reach: runs that reached the "
        "held-out accuracy at an evaluation, and their mean first step. All-equal rollouts: "
        "completions in groups with no advantage, mean per run.\n",
        markdown_table(
            [
                "curriculum",
                "final accuracy (mean)",
                "mean accuracy, steps > 0",
                *targets,
                "all-equal rollouts",
                "train s",
            ],
            summary,
        ),
        "\nPer run (reach: first evaluated step, and training seconds to it):\n",
        markdown_table(
            [
                "curriculum",
                "seed",
                "before",
                "after",
                "best",
                "mean, steps > 0",
                *targets,
                "all_equal_frac (mean)",
                "all-equal rollouts",
                "train s",
            ],
            per_run,
        ),
        *level_lines(runs, args),
        f"\n![held-out accuracy and all-equal groups]({CURVE.name})\n",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arms", nargs="+", default=["none", "pass_rate", "difficulty"], help="curricula"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--train", type=int, default=128, help="training problems")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-n", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.2])
    parser.add_argument(
        "--threshold", type=float, default=0.6, help="data.curriculum_threshold (difficulty)"
    )
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    before = load_note()
    runs = {job: read_run(path) for job, path in run_all(args).items()}
    plot(runs, args.arms)
    kept = ("arms", "seeds", "steps", "train", "eval_every", "eval_n", "parallel", "targets",
            "threshold")  # fmt: skip
    row = {"renderer": "curriculum", "args": {k: getattr(args, k) for k in kept}}
    row |= {"cpu": cpu_name(), "load_note": f"{before} at start, {load_note()} at the end"}
    row["runs"] = {f"{arm}/{seed}": run for (arm, seed), run in runs.items()}
    publish("curriculum", TITLE, f"arith-4x4-{args.steps}-{args.train}", row)


if __name__ == "__main__":
    main()
