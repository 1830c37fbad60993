"""Curriculum against none (issue 29) on a task the bundled model starts below 10% on: held-out
accuracy over training, time to accuracy, and the rollouts each run spent on all-equal groups.

The job, the arms (`data.curriculum`) and the figures: benchmarks/README.md.

    .venv/bin/python benchmarks/curriculum.py --arms none pass_rate --steps 60 --seeds 1
"""

from __future__ import annotations

import argparse
import os
import statistics
from concurrent.futures import ThreadPoolExecutor

from harness.checkout import CACHE, RESULTS
from harness.children import setting_args, train_oncurve
from harness.learning import curve_figures, over_seeds, plot
from harness.machine import cpu_name, load_note
from harness.tables import markdown_table, page_title, publish

WORK, CURVE = CACHE / "curriculum", RESULTS / "curriculum.png"
TITLE = page_title("Curriculum against none", "curriculum", "job setting")
PROMPTS, GROUP = 16, 8
CORRECT_ONLY = "oncurve.data.tasks.arith:exact_sum_reward"  # the task's reward without format
ALL_EQUAL, LEVEL = "groups/all_equal_frac", "curriculum/level"


def train(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One run in a fresh `oncurve train` process: its held-out curve [(step, accuracy)]; by
    step, its seconds, all-equal fraction and curriculum level; the curve's figures
    (`curve_figures`), its all-equal rollouts and the first step at each curriculum level."""
    from oncurve.run.metrics import read_jsonl

    run_dir = WORK / f"{arm}-seed{seed}"
    settings = {"data.task": "arith", "data.task_options": "{min_digits: 4}",
                "data.num_train": args.train, "data.prompts_per_step": PROMPTS,
                "rollout.group_size": GROUP, "reward.functions": f"[{CORRECT_ONLY}]",
                "data.curriculum": arm, "run.steps": args.steps, "run.seed": seed,
                "eval.every": args.eval_every, "eval.num_prompts": args.eval_n, "run.threads": 1,
                "run.device": "cpu"}  # fmt: skip
    if arm == "difficulty":  # oncurve refuses another curriculum's setting
        settings["data.curriculum_threshold"] = args.threshold
    print(f"started {arm} seed {seed}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = train_oncurve(setting_args(settings), run_dir, run_dir.with_suffix(".log"), env)
    print(f"finished {arm} seed {seed}", flush=True)
    kept = ("time/step", ALL_EQUAL, LEVEL)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    curve = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    steps = {r["step"]: {k: r[k] for k in kept if k in r} for r in done["rows"]}
    # each level's first step (going down the steps, the earliest is written last)
    levels = {int(r[LEVEL]): step for step, r in sorted(steps.items(), reverse=True) if LEVEL in r}
    all_equal = sum(r[ALL_EQUAL] for r in steps.values()) * PROMPTS * GROUP
    seconds = {step: r["time/step"] for step, r in steps.items()}
    run = {"curve": curve, "steps": steps} | curve_figures(curve, seconds, args.targets)
    return run | {"all_equal": all_equal, "levels": sorted(levels.items())}


def plot_arms(arms: dict[str, list[dict]], window: int = 10) -> None:
    """`CURVE`: on the left each arm's held-out curves, every seed faint and their mean bold; on
    the right the `window`-step mean of `groups/all_equal_frac` over the arm's runs."""
    curves, smoothed = [], []
    for index, (arm, runs) in enumerate(arms.items()):
        color = {"color": f"C{index}"}
        faint = {**color, "alpha": 0.25, "marker": None}
        curves += [(None, *zip(*r["curve"], strict=True), faint) for r in runs]
        steps = [s for s, _ in runs[0]["curve"]]
        mean = [statistics.fmean(dict(r["curve"])[s] for r in runs) for s in steps]
        curves.append((f"{arm} (mean of {len(runs)})", steps, mean, color))
        values = [[r["steps"][s][ALL_EQUAL] for s in sorted(r["steps"])] for r in runs]
        smooth = [
            statistics.fmean(x for v in values for x in v[max(0, t + 1 - window) : t + 1])
            for t in range(len(values[0]))
        ]
        smoothed.append((arm, range(1, len(smooth) + 1), smooth, color))
    held = {"title": "4+4-digit arith, held out", "x": "step", "lines": curves}
    held["y"] = "held-out greedy accuracy"
    plot(CURVE, [held, {"x": "step", "y": f"{ALL_EQUAL} ({window}-step mean)", "lines": smoothed}])


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
    WORK.mkdir(parents=True, exist_ok=True)
    before = load_note()
    jobs = [(arm, seed) for seed in range(args.seeds) for arm in args.arms]
    with ThreadPoolExecutor(args.parallel) as pool:  # in order, `--parallel` at a time
        runs = dict(zip(jobs, pool.map(lambda job: train(*job, args), jobs), strict=True))
    arms = {arm: [runs[(arm, seed)] for seed in range(args.seeds)] for arm in args.arms}
    plot_arms(arms)
    row = {"renderer": "curriculum", "args": vars(args), "cpu": cpu_name()}
    row["load_note"] = f"{before} at start, {load_note()} at the end"
    row["runs"] = {f"{arm}/{seed}": run for (arm, seed), run in runs.items()}
    keys = ("after", "mean", "all_equal", "train_s")
    row["arms"] = {arm: over_seeds(runs, keys) for arm, runs in arms.items()}
    publish("curriculum", TITLE, f"arith-4x4-{args.steps}-{args.train}", row)


if __name__ == "__main__":
    main()
