"""SmolLM2-135M-Instruct RL-fine-tuned on the built-in `code` task on the CPU: does the reward
rise? (configs/code_smollm2.yaml)

The job: "Write a Python function `f(x)` that returns x plus 7. Reply with the code in a
```python block." in the model's chat template, 8 prompts x G=8 a step, 96 new tokens, lr 2e-5,
beta 0, 30 steps; the reward is `code_tests`, the fraction of a problem's three hidden asserts
that the completion's last ```python block passes, each run in the sandbox. Held out: all 25
test problems of the task, before training and after, with the final model: greedy (pass rate:
all three tests passed; mean reward: mean fraction) and K samples per prompt at temperature 1
(mean reward over all of them, which is what training maximises). Training: the per-step mean
reward of the sampled groups (`reward/correct` in metrics.jsonl), summarised in blocks of 5
steps, and the trainer's own held-out accuracy (a program passing 2 of 3 tests counts).

    make smollm2                                     # once: fetch and import the model
    .venv/bin/python benchmarks/code_task.py         # about 15-25 minutes on 2 cores
    .venv/bin/python benchmarks/code_task.py --steps 10 --set optim.lr=5e-5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from harness.checkout import CACHE, ROOT
from harness.children import run_child
from harness.machine import load_note
from harness.run_logs import step_phases
from harness.tables import markdown_table, publish

CONFIG = ROOT / "configs" / "code_smollm2.yaml"
WORK = CACHE / "code_task"
SHOWN = 4  # greedy completions shown before and after
BLOCK = 5  # steps per line of the reward curve summary


def held_out(model_dir: str, overrides: list[str], samples: int) -> dict:
    """The model's held-out scores on every test problem of the task, prompts formatted as the
    trainer formats them, `rollout.max_new_tokens` tokens: greedy pass rate and mean reward,
    the trainer's accuracy (evaluation's threshold), the mean reward of `samples` completions
    per prompt at temperature 1, and the first `SHOWN` greedy completions with their scores."""
    from oncurve.config import load_config
    from oncurve.data.prompts import PromptData
    from oncurve.data.tasks import get_task
    from oncurve.data.tasks.code import problems
    from oncurve.loop.evaluate import evaluate
    from oncurve.model.sources import load_model, load_tokenizer
    from oncurve.rewards.code import code_tests_reward
    from oncurve.rollout import build_sampler

    config = load_config(CONFIG, overrides)
    code_tests_reward.configure(config.reward)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, "float32", "cpu").eval()
    rows = get_task("code").examples("test", len(problems("test")), config.run.seed)
    data = PromptData(rows, tokenizer, config.data, seed=config.run.seed).rows
    records: list[dict] = []
    result = evaluate(
        build_sampler("auto", model, tokenizer),
        data,
        code_tests_reward,
        max_new_tokens=config.rollout.max_new_tokens,
        samples=samples,
        seed=config.run.seed,
        records=records,
    )
    prompts = [row["prompt"] for row in rows]
    tests = [row["tests"] for row in rows]
    greedy = code_tests_reward(prompts, [r["greedy"] for r in records], tests=tests)
    sampled = code_tests_reward(
        [p for p in prompts for _ in range(samples)],
        [text for r in records for text in r["samples"]],
        tests=[t for t in tests for _ in range(samples)],
    )
    return {
        "pass": statistics.mean(score == 1.0 for score in greedy),
        "greedy": statistics.mean(greedy),
        "accuracy": result["accuracy"],
        "sampled": statistics.mean(sampled),
        "shown": [
            {"prompt": p, "completion": r["greedy"], "score": s}
            for p, r, s in list(zip(prompts, records, greedy, strict=True))[:SHOWN]
        ],
    }


def train(steps: int | None, overrides: list[str], out: Path) -> dict:
    from oncurve.run.metrics import read_jsonl

    command = [sys.executable, "-m", "oncurve", "train", str(CONFIG), "--quiet"]
    command += [f"run.dir={out / 'run'}", "run.overwrite=true", "run.device=cpu", *overrides]
    command += [f"run.steps={steps}"] if steps else []
    wall, rss, _ = run_child(command, dict(os.environ), out / "log.txt")
    rows = read_jsonl(out / "run" / "metrics.jsonl")
    steps_rows = [r for r in rows if "time/step" in r]
    return {
        "wall": wall,
        "rss": rss,
        "final": str(out / "run" / "final"),
        "seconds": [r["time/step"] for r in steps_rows],
        "phases": step_phases(steps_rows),
        "reward": [r["reward/correct"] for r in steps_rows],
        "evals": [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    parser.add_argument("--samples", type=int, default=8, help="held-out samples per prompt")
    args = parser.parse_args()
    from oncurve.config import load_config
    from oncurve.data.tasks.code import problems

    config = load_config(CONFIG, args.set)
    model_dir = str(ROOT / config.model.path)
    if not (Path(model_dir) / "config.json").is_file():
        raise SystemExit(f"no model in {model_dir}: run `make smollm2` first")
    overrides = [f"model.path={model_dir}", *args.set]
    load_before = load_note()
    print("held-out, before ...", flush=True)
    before = held_out(model_dir, overrides, args.samples)
    print({k: v for k, v in before.items() if k != "shown"}, flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    print("training ...", flush=True)
    run = train(args.steps, overrides, WORK)
    print("held-out, after ...", flush=True)
    after = held_out(run["final"], overrides, args.samples)
    steps = len(run["reward"])

    def pct(value: float) -> str:
        return f"{100 * value:.1f}%"

    table = markdown_table(
        [
            "model",
            "greedy pass rate",
            "greedy mean reward",
            f"sampled mean reward (K={args.samples})",
            "trainer's accuracy",
        ],
        [
            [name, pct(r["pass"]), f"{r['greedy']:.3f}", f"{r['sampled']:.3f}", pct(r["accuracy"])]
            for name, r in (("before", before), (f"after {steps} steps", after))
        ],
    )
    rewards = run["reward"]
    blocks = [
        f"steps {i + 1}-{min(i + BLOCK, steps)}: {statistics.mean(rewards[i : i + BLOCK]):.3f}"
        for i in range(0, steps, BLOCK)
    ]
    phases = ", ".join(f"{k} {statistics.median(v[1:]):.1f} s" for k, v in run["phases"].items())
    settings = ", ".join(args.set) or "none"
    lines = [
        "# SmolLM2-135M-Instruct on the `code` task, 2 CPU cores\n",
        f"Written by `benchmarks/code_task.py` on {time.strftime('%Y-%m-%d')}: {steps} steps of "
        f"{config.data.prompts_per_step} prompts x G={config.rollout.group_size}, "
        f"{config.rollout.max_new_tokens} tokens, lr {config.optim.lr}, beta {config.algo.beta} "
        f"(`configs/code_smollm2.yaml`; overrides: {settings}). Held out: all "
        f"{len(problems('test'))} test problems. Load: {load_before}; after: "
        f"{load_note()}.\n",
        table,
        "\nTraining reward (mean fraction of tests passed by the step's 64 sampled completions), "
        f"per block of {BLOCK} steps: " + "; ".join(blocks) + ".\n",
        "Per step: " + ", ".join(f"{r:.2f}" for r in rewards) + ".\n",
        "The trainer's held-out accuracy (step, accuracy): "
        + ", ".join(f"{s} {pct(a)}" for s, a in run["evals"])
        + ".\n",
        f"Time: median {statistics.median(run['seconds'][1:]):.1f} s/step ({phases}); wall "
        f"{run['wall'] / 60:.1f} min; peak RSS {run['rss']:.0f} MB.\n",
        "\n## What the model writes (greedy)\n",
    ]
    for label, result in (("before", before), ("after", after)):
        lines.append(f"\n{label}:\n")
        for s in result["shown"]:
            lines.append(f"- {s['prompt']!r} -> {s['completion']!r} (score {s['score']:.2f})")
    print("\n".join(lines))
    publish("code_task", lines[0][2:].strip(), "", {"markdown": "\n".join(lines) + "\n"})
    (WORK / "summary.json").write_text(
        json.dumps({"before": before, "after": after, "run": run}, indent=1)
    )


if __name__ == "__main__":
    main()
