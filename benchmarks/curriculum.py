"""Curriculum against none (issue 29) on a task the bundled model starts below 10% on: held-out
accuracy over training, time to accuracy, and the rollouts each run spent on all-equal groups.

The job, the arms (`data.curriculum`) and the figures: benchmarks/README.md.

    .venv/bin/python benchmarks/curriculum.py --arms none pass_rate --steps 60 --seeds 1
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

from harness.checkout import CACHE, RESULTS
from harness.children import setting_args
from harness.learning import curve_figures, over_seeds, plot_arms, train
from harness.machine import cpu_name, load_note
from harness.tables import markdown_table, page_title, publish

WORK, CURVE = CACHE / "curriculum", RESULTS / "curriculum.png"
TITLE = page_title("Curriculum against none", "curriculum", "job setting")
PROMPTS, GROUP = 16, 8
REWARD = "exact_sum_reward"  # the task's reward without format
REWARD_PATH = f"oncurve.data.tasks.arith:{REWARD}"
ALL_EQUAL, LEVEL = "groups/all_equal_frac", "curriculum/level"


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One run in a fresh `oncurve train` process (`learning.train`): its held-out curve
    [(step, accuracy)] and each step's all-equal fraction; the curve's figures (`curve_figures`),
    its all-equal rollouts and the first step at each curriculum level."""
    settings = {"data.task": "arith", "data.task_options": "{min_digits: 4}",
                "data.num_train": args.train, "data.prompts_per_step": PROMPTS,
                "rollout.group_size": GROUP, "reward.functions": f"[{REWARD_PATH}]",
                "data.curriculum": arm, "run.steps": args.steps, "run.seed": seed,
                "eval.every": args.eval_every, "eval.num_prompts": args.eval_n, "run.threads": 1,
                "run.device": "cpu"}  # fmt: skip
    if arm == "difficulty":  # oncurve refuses another curriculum's setting
        settings["data.curriculum_threshold"] = args.threshold
    print(f"started {arm} seed {seed}", flush=True)
    metrics = (ALL_EQUAL, LEVEL) if arm == "difficulty" else (ALL_EQUAL,)
    done = train(setting_args(settings), WORK / f"{arm}-seed{seed}", REWARD, metrics)
    print(f"finished {arm} seed {seed}", flush=True)
    curve = [(step, accuracy) for step, _, accuracy in done["evals"]]
    levels: dict[int, int] = {}  # each level's first step
    for step, level in enumerate(done.get(LEVEL, []), start=1):
        levels.setdefault(int(level), step)
    figures = curve_figures(curve, dict(enumerate(done["seconds"], start=1)), args.targets)
    all_equal = sum(done[ALL_EQUAL]) * PROMPTS * GROUP
    return {"curve": curve, ALL_EQUAL: done[ALL_EQUAL], **figures, "all_equal": all_equal,
            "levels": sorted(levels.items())}  # fmt: skip


def section(row: dict) -> str:
    """The markdown section of one row: each arm over its seeds, each run, the levels."""
    a, total = row["args"], row["args"]["steps"] * PROMPTS * GROUP

    def reached(hits: int, n: int, step: float | None) -> str:
        return f"{hits}/{n}" + (
            f", mean {step:.0f} steps ({step * total / a['steps']:,.0f} rollouts)" if hits else ""
        )

    arms = [
        [arm, f"{f['after']:.1%}", f"{f['mean']:.1%}", *(reached(*x) for x in f["reach"])]
        + [f"{f['all_equal']:,.0f} of {total:,}", f"{f['train_s']:.0f}"]
        for arm, f in row["arms"].items()
    ]
    runs = [
        (arm, seed, row["runs"][f"{arm}/{seed}"]) for arm in a["arms"] for seed in range(a["seeds"])
    ]
    per_run = [
        [arm, str(seed), *(f"{r[k]:.1%}" for k in ("before", "after", "best", "mean"))]
        + ["-" if x is None else f"{x[0]} ({x[1]:.0f} s)" for x in r["reach"]]
        + [f"{r['all_equal'] / total:.3f}", f"{r['all_equal']:,.0f}", f"{r['train_s']:.0f}"]
        for arm, seed, r in runs
    ]
    levels = "; ".join(
        f"seed {seed}: " + ", ".join(f"level {k} at step {s}" for k, s in r["levels"])
        for arm, seed, r in runs
        if arm == "difficulty"
    )
    targets = [f"reach {t:.0%}" for t in a["targets"]]
    return "\n\n".join([
        f"## arith, 4+4 digits, {a['steps']} steps, {a['train']} training problems",
        f"{row['date']} at {row['commit']}, `{row['command']}`, {row['cpu']}, {a['parallel']} "
        f"runs at once on one thread each; {row['load_note']}.",
        f"Bundled model, `data.task_options={{min_digits: 4}}`, correctness reward only, "
        f"B={PROMPTS} x G={GROUP}, 64 tokens, lr 1e-4, beta 0.04; pass_rate floor 0.1, difficulty "
        f"threshold {a['threshold']}; held-out greedy accuracy on {a['eval_n']} test problems "
        f"every {a['eval_every']} steps; seeds 0-{a['seeds'] - 1}. Reach: runs that reached the "
        "held-out accuracy at an evaluation, and their mean first step. All-equal rollouts: "
        "completions in groups with no advantage, mean per run.",
        markdown_table(["curriculum", "final accuracy (mean)", "mean accuracy, steps > 0",
                        *targets, "all-equal rollouts", "train s"], arms),
        "Per run (reach: first evaluated step, and training seconds to it):",
        markdown_table(["curriculum", "seed", "before", "after", "best", "mean, steps > 0",
                        *targets, "all_equal_frac (mean)", "all-equal rollouts", "train s"],
                       per_run),
        *([f"Difficulty levels (0: 1-digit operands ... 3: the 4-digit target), first step at "
           f"each: {levels}."] if levels else []),
        f"![held-out accuracy and all-equal groups]({CURVE.name})",
    ]) + "\n"  # fmt: skip


def summary(row: dict) -> str:
    """The row in one line: each arm's final and mean held-out accuracy, all-equal rollouts and
    the runs that reached the first target."""
    a = row["args"]
    arms = "; ".join(
        f"{arm} {f['after']:.1%} / {f['mean']:.1%}, {f['all_equal']:,.0f} all-equal, reached "
        f"{a['targets'][0]:.0%} {f['reach'][0][0]}/{f['reach'][0][1]}"
        for arm, f in row["arms"].items()
    )
    return (
        f"4+4-digit arith, {a['steps']} steps x {a['seeds']} seeds, final / mean held-out "
        f"accuracy: {arms} (of {a['steps'] * PROMPTS * GROUP:,} rollouts)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=["none", "pass_rate", "difficulty"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--train", type=int, default=128, help="training problems")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-n", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.1, 0.2])
    parser.add_argument("--threshold", type=float, default=0.6, help="data.curriculum_threshold")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # the runs' children: one thread each (`run.threads`)
    before = load_note()
    jobs = [(arm, seed) for seed in range(args.seeds) for arm in args.arms]
    with ThreadPoolExecutor(args.parallel) as pool:  # in order, `--parallel` at a time
        runs = dict(zip(jobs, pool.map(lambda job: run_arm(*job, args), jobs), strict=True))
    arms = {arm: [runs[(arm, seed)] for seed in range(args.seeds)] for arm in args.arms}
    plot_arms(CURVE, arms, "4+4-digit arith, held out", ALL_EQUAL)
    row = {"renderer": "curriculum", "args": vars(args), "cpu": cpu_name()}
    row["load_note"] = f"{before} at start, {load_note()} at the end"
    row["runs"] = {f"{arm}/{seed}": run for (arm, seed), run in runs.items()}
    keys = ("after", "mean", "all_equal", "train_s")
    row["arms"] = {arm: over_seeds(runs, keys) for arm, runs in arms.items()}
    publish("curriculum", TITLE, f"arith-4x4-{args.steps}-{args.train}", row)


if __name__ == "__main__":
    main()
