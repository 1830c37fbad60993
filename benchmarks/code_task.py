"""SmolLM2-135M-Instruct RL-fine-tuned on the built-in `code` task on the CPU: does the reward
rise? (configs/code_smollm2.yaml; the job and what is measured: benchmarks/README.md)

    make smollm2                                     # once: fetch and import the model
    .venv/bin/python benchmarks/code_task.py --steps 10 --set optim.lr=5e-5
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness import learning
from harness.checkout import CACHE, ROOT
from harness.machine import load_note
from harness.tables import markdown_table, publish

NAME = "code_task"
CONFIG = ROOT / "configs" / "code_smollm2.yaml"
SHOWN = 4  # greedy completions shown before and after
BLOCK = 5  # steps per line of the reward curve summary


def held_out(model_dir: str, config: object, samples: int) -> dict:
    """The model's held-out scores (`learning.held_out`): greedy pass rate (all tests passed) and
    mean reward, the trainer's accuracy, the mean reward of `samples` completions per prompt at
    temperature 1, and the first `SHOWN` greedy completions with their scores."""
    from oncurve.rewards.code import code_tests_reward

    result, rows, records = learning.held_out(model_dir, config, samples)
    prompts, tests = [r["prompt"] for r in rows], [r["tests"] for r in rows]
    greedy = code_tests_reward(prompts, [r["greedy"] for r in records], tests=tests)
    sampled = code_tests_reward(
        [p for p in prompts for _ in range(samples)],
        [text for r in records for text in r["samples"]],
        tests=[t for t in tests for _ in range(samples)],
    )
    shown = list(zip(prompts, records, greedy, strict=True))[:SHOWN]
    return {
        "pass": statistics.mean(score == 1.0 for score in greedy),
        "greedy": statistics.mean(greedy),
        "accuracy": result["accuracy"],
        "sampled": statistics.mean(sampled),
        "shown": [{"prompt": p, "completion": r["greedy"], "score": s} for p, r, s in shown],
    }


def section(row: dict) -> str:
    """The page of one row: held-out scores before and after, the training reward and the
    trainer's evaluations, time, what the model writes."""
    header = ["model", "greedy pass rate", "greedy mean reward",
              f"sampled mean reward (K={row['samples']})", "trainer's accuracy"]  # fmt: skip
    run, steps = row["run"], len(row["run"]["reward"])
    table = markdown_table(header, [
        [name, f"{r['pass']:.1%}", f"{r['greedy']:.3f}", f"{r['sampled']:.3f}",
         f"{r['accuracy']:.1%}"]
        for name, r in (("before", row["before"]), (f"after {steps} steps", row["after"]))
    ])  # fmt: skip
    blocks = "; ".join(f"steps {a}-{b}: {mean:.3f}" for a, b, mean in run["blocks"])
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in run["phase_medians"].items())
    shown = "".join(
        f"\n{label}:\n\n"
        + "".join(f"- {x['prompt']!r} -> {x['completion']!r} (score {x['score']:.2f})\n"
                  for x in r["shown"])
        for label, r in (("before", row["before"]), ("after", row["after"]))
    )  # fmt: skip
    return (
        f"# {row['title']}\n\nWritten by `benchmarks/code_task.py` on {row['date']}: "
        f"{learning.describe(row['settings'])} (`configs/code_smollm2.yaml`; overrides: "
        f"{', '.join(row['overrides']) or 'none'}). Held out: all {row['problems']} test "
        f"problems. Load: {row['load_before']}; after: {row['load_after']}.\n\n{table}\n\n"
        "Training reward (mean fraction of tests passed by the step's 64 sampled completions), "
        f"per block of {BLOCK} steps: {blocks}.\n\nPer step: "
        + ", ".join(f"{r:.2f}" for r in run["reward"])
        + ".\n\nThe trainer's held-out accuracy (step, accuracy): "
        + ", ".join(f"{e[0]} {e[-1]:.1%}" for e in run["evals"])
        + f".\n\nTime: median {run['s_per_step']:.1f} s/step ({phases}); wall "
        f"{run['wall_s'] / 60:.1f} min; peak RSS {run['rss_mb']:.0f} MB.\n\n"
        f"## What the model writes (greedy)\n{shown}"
    )


def summary(row: dict) -> str:
    """The row in one line: greedy pass rate and sampled mean reward before and after, wall."""
    before, after, run = row["before"], row["after"], row["run"]
    return (
        f"SmolLM2-135M-Instruct on `code`, {len(run['reward'])} steps "
        f"({run['wall_s'] / 60:.1f} min): held-out greedy pass rate {before['pass']:.0%} -> "
        f"{after['pass']:.0%}, sampled mean reward {before['sampled']:.2f} -> "
        f"{after['sampled']:.2f} ({row['problems']} problems)"
    )


def headline(row: dict) -> dict[str, str]:
    """The README's code row: the greedy pass rate before and after training."""
    figure = (
        f"greedy pass rate {row['before']['pass']:.0%} -> {row['after']['pass']:.0%} on held-out "
        f"problems in {len(row['run']['reward'])} steps"
    )
    return {
        "area": "RL on code, 2 CPU cores",
        "figure": figure,
        "command": "benchmarks/code_task.py",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    parser.add_argument("--samples", type=int, default=8, help="held-out samples per prompt (2+)")
    args = parser.parse_args()
    if args.samples < 2:  # one completion per prompt is the greedy one; none is sampled
        parser.error("--samples: at least 2 completions per prompt at temperature 1")
    from oncurve.config import load_config

    model_dir = str(ROOT / load_config(CONFIG, args.set).model.path)
    learning.require(Path(model_dir) / "config.json")
    overrides = [f"model.path={model_dir}", "run.device=cpu", *args.set]
    overrides += [f"run.steps={args.steps}"] if args.steps else []
    config = load_config(CONFIG, overrides)
    load_before = load_note()
    print("held-out, before ...", flush=True)
    before = held_out(model_dir, config, args.samples)
    print({k: v for k, v in before.items() if k != "shown"}, flush=True)
    print("training ...", flush=True)
    run = learning.train([str(CONFIG), *overrides], CACHE / NAME)
    print("held-out, after ...", flush=True)
    after = held_out(run.pop("final"), config, args.samples)
    rewards = run["reward"]
    run["blocks"] = [
        [i + 1, min(i + BLOCK, len(rewards)), statistics.mean(rewards[i : i + BLOCK])]
        for i in range(0, len(rewards), BLOCK)
    ]
    run["phase_medians"] = {k: statistics.median(v[1:]) for k, v in run["phases"].items()}
    row = {"renderer": NAME, "settings": learning.settings(config), "overrides": args.set,
           "problems": config.eval.num_prompts, "samples": args.samples,
           "load_before": load_before, "load_after": load_note(),
           "before": before, "after": after, "run": run}  # fmt: skip
    publish(NAME, "SmolLM2-135M-Instruct on the `code` task, 2 CPU cores", "", row)


if __name__ == "__main__":
    main()
