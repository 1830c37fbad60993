"""TRL's own reward functions, imported from an installed TRL, train through oncurve unchanged.

`oncurve train` in the TRL venv with TRL's `think_format_reward` and `accuracy_reward` on a
dataset as TRL's `GRPOTrainer` takes it: is every completion scored? (benchmarks/README.md)

    .venv/bin/python benchmarks/trl_rewards.py [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

from harness.checkout import CACHE
from harness.children import setting_args, train_oncurve
from harness.models import build_model, tokenizer_dir
from harness.tables import markdown_table, publish
from harness.trl_env import ensure_trl_venv, trl_env, trl_versions

NAME = "trl_rewards"
TITLE = "TRL's reward functions through oncurve"
REWARDS = ("think_format_reward", "accuracy_reward")


def trl_dataset(path: Path, rows: int = 16) -> Path:
    """Write `rows` sums to `path` as TRL's conversational datasets hold them; returns `path`."""
    lines = []
    for i in range(rows):
        a, b = 3 * i + 1, 7 * i + 2
        prompt = f"What is {a} + {b}? Think in <think></think>, then put the answer in \\boxed{{}}."
        row = {"prompt": [{"role": "user", "content": prompt}], "solution": f"${a + b}$"}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    python = ensure_trl_venv()
    env = trl_env(python)
    if env is None:
        raise SystemExit(f"{python} does not import trl")
    probe = [python, "-c", "import math_verify"]
    if subprocess.run(probe, env=env, capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "math-verify"], check=True)
    work = CACHE / NAME
    work.mkdir(parents=True, exist_ok=True)
    functions = ", ".join(f"trl.rewards:{name}" for name in REWARDS)
    settings = {"data.path": trl_dataset(work / "trl_sums.jsonl"),
                "reward.functions": f"[{functions}]",
                "model.path": build_model("smoke", tokenizer_dir()), "run.device": "cpu",
                "run.steps": args.steps, "data.prompts_per_step": 2, "rollout.group_size": 4,
                "rollout.max_new_tokens": 32, "eval.at_start_end": False}  # fmt: skip
    done = train_oncurve(setting_args(settings), work / "run", work / "train.log", env, python)
    means = {name: [row[f"reward/{name}"] for row in done["rows"]] for name in REWARDS}
    scored = all(math.isfinite(v) for values in means.values() for v in values)
    row = {"renderer": NAME, "trl": trl_versions(python, env), "steps": len(done["rows"])}
    row |= {"wall_s": round(done["wall"], 1), "every_completion_scored": scored}
    publish(NAME, TITLE, "smoke", row | {"reward_means": means})
    if not scored:
        raise SystemExit("a TRL reward left completions unscored")


def summary(row: dict) -> str:
    """The row in one line: whether TRL's reward functions scored every completion."""
    scored = "every completion scored" if row["every_completion_scored"] else "some unscored"
    return f"TRL's own reward functions through oncurve, {row['steps']} steps: {scored}"


def section(row: dict) -> str:
    """One run's section of results/trl_rewards.md: its command, then a table of its date,
    commit, TRL's versions, steps, whether every completion was scored, the last step's means."""
    means = ", ".join(f"`{k}` {v[-1]:.2f}" for k, v in row["reward_means"].items())
    scored = "yes" if row["every_completion_scored"] else "no"
    cells = [row["date"], row["commit"], row["trl"], str(row["steps"]), scored, means]
    header = ["date", "commit", "TRL", "steps", "every completion scored", "last step's means"]
    return f"`{row['command']}`\n\n" + markdown_table(header, [cells])


if __name__ == "__main__":
    main()
