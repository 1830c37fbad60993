"""Time to accuracy against TRL on one GPU (`gpu_check.py`'s `curve` stage): a 30M-parameter model
warm-started inside the command (`oncurve.warmstart` on 6-digit sums, stopped at the first check
that finds it `STOP_AT` accurate, leaving headroom whatever its learning speed), then GRPO on the
same sums with oncurve and with TRL's GRPOTrainer, the default job's settings, each for the
size's budget of seconds of training steps with a checkpoint every `save_every` steps and where
the budget ends it (`learning.budget_curves`). The warm start and every checkpoint are scored
alike: held-out accuracy against training seconds, one figure (`results/gpu_curve.png`) and one
table. Target: oncurve reaches TRL's final accuracy in at most `TARGET` x TRL's training seconds.

`SIZES` fit the stage's 500 s on an H100: a warm start of a minute at most, each trainer's 120 s
(oncurve's compiling in its first step) and about 40 s of start and saving, about 40 checkpoints
scored at 1 s each, and 60 s to spare.

    python3 benchmarks/gpu_curve.py                       # GPU machine
    .venv/bin/python benchmarks/gpu_curve.py --smoke      # here: a tiny model on the CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections import namedtuple
from pathlib import Path
from typing import Any

from harness import learning
from harness.checkout import CACHE, RESULTS
from harness.gpu_comparison import environments
from harness.gpu_stages import time_to_final
from harness.machine import gpu_name, require_cuda
from harness.spec import Job
from harness.tables import markdown_table, publish

NAME = "gpu_curve"
WORK = CACHE / NAME
FIGURE = RESULTS / f"{NAME}.png"
TARGET = 0.5
DIGITS = 6
STOP_AT = 0.2  # the warm start's accuracy on its check problems that ends it


# a model's shape, its warm start (at most `warm_steps`, checked every `check_every`), the
# training budget in seconds, the checkpoint interval and the held-out problems
Size = namedtuple(
    "Size", "hidden layers intermediate warm_steps check_every budget save_every held"
)
SIZES = {"30m": Size(512, 8, 1536, 1500, 25, 120, 20, 200),
         "smoke": Size(32, 2, 64, 20, 10, 30, 10, 16)}  # fmt: skip


def warm_job(size: str, device: str) -> Job:
    """The job from `size`'s model, warm-started afresh: the default job's settings
    (configs/default.yaml) on 6-digit sums, with `size`'s checkpoints and budget (its steps a
    bound the budget ends first), and gradient checkpointing off in both trainers (TRL's own
    default turns it on on CUDA, oncurve's memory plan leaves a model of this size without it)."""
    from oncurve.warmstart import warmstart

    shape, model = SIZES[size], WORK / f"model-{size}"
    shutil.rmtree(model, ignore_errors=True)  # warmstart writes into an empty folder only
    warmstart(model, shape.warm_steps, hidden_size=shape.hidden, num_layers=shape.layers,
              intermediate_size=shape.intermediate, max_digits=DIGITS, eval_prompts=shape.held,
              device=device, stop_at=STOP_AT, check_every=shape.check_every)  # fmt: skip
    settings = {"model.path": str(model), "run.device": device, "run.steps": 4000,
                "run.save_every": shape.save_every, "run.keep_last": 4000,
                "model.gradient_checkpointing": False, "data.task": "arith",
                "data.prompts_per_step": 16, "rollout.group_size": 8, "rollout.max_new_tokens": 64,
                "optim.lr": 1e-4, "optim.warmup_steps": 10,
                "data.task_options": json.dumps({"max_digits": DIGITS}),
                "eval.at_start_end": False, "eval.num_prompts": shape.held, "log.samples_per_step": 0}  # fmt: skip
    return Job(settings, seconds_budget=shape.budget)


def figures(curves: dict[str, list[list[float]]]) -> dict[str, Any]:
    """TRL's final accuracy and seconds, oncurve's seconds to reach that accuracy and the ratio
    (None where TRL did not run, did not improve on the start, or oncurve never reached it)."""
    if "TRL" not in curves:
        return {"trl_final": None, "trl_seconds": None, "reach_s": None, "ratio": None}
    trl_seconds, trl_final = curves["TRL"][-1]
    improved = trl_final > curves["TRL"][0][1]  # else there is nothing to reach
    # the first checkpoint at TRL's final accuracy or above, the start left out
    reached = [s for s, accuracy in curves["oncurve"][1:] if improved and accuracy >= trl_final]
    reach = reached[0] if reached else None
    ratio = None if reach is None or not trl_seconds else reach / trl_seconds
    return {"trl_final": trl_final, "trl_seconds": trl_seconds, "reach_s": reach, "ratio": ratio}


def summary(row: dict) -> str:
    """The row in one line: accuracy before and after each trainer, the time to TRL's final."""
    curves = "; ".join(f"{label} {points[0][1]:.1%} -> {points[-1][1]:.1%} in {points[-1][0]:.0f} s"
                       for label, points in row["curves"].items())  # fmt: skip
    reach = "" if row["ratio"] is None else f"; TRL's final reached in {row['ratio']:.2f}x its time"
    return f"held-out accuracy {curves}{reach}"


def section(row: dict) -> str:
    """The page of one row: the curves' table and the target."""
    table = [[label, f"{points[-1][0]:.0f}", f"{points[0][1]:.1%}", f"{points[-1][1]:.1%}",
              ", ".join(f"{s:.0f} s {a:.0%}" for s, a in points[1:])]
             for label, points in row["curves"].items()]  # fmt: skip
    return (
        f"### {row['key']}\n\nMeasured {row['date']} at {row['commit']} on {row['gpu']}; "
        f"`{row['command']}`; warm start {row['warm_accuracy']:.1%} held-out, budget "
        f"{row['budget']:.0f} s of training steps each, checkpoints every {row['save_every']} "
        "steps.\n\n"
        + markdown_table(["trainer", "training s", "before", "after", "checkpoints"], table)
        + f"\n\nTarget: oncurve reaches TRL's final accuracy in at most {TARGET}x its time: "
        f"{time_to_final(row, TARGET)}. Figure: `{FIGURE.name}`.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU")
    parser.add_argument("--trl-python", default=sys.executable, help="runs the TRL child")
    parser.add_argument("--json", help="also write the row to this file")
    args = parser.parse_args()
    size, device = ("smoke", "cpu") if args.smoke else ("30m", "cuda")
    if not args.smoke:
        require_cuda("gpu_curve.py")
    job = warm_job(size, device)
    warm = learning.checkpoint_accuracy(job.settings["model.path"], job.config(), device)
    envs = environments(args.trl_python, trl_required=not args.smoke)
    curves = learning.budget_curves(job, WORK, envs, args.trl_python, device, warm)
    row = {"warm_accuracy": warm, "budget": job.seconds_budget, "curves": curves,
           "save_every": job.settings["run.save_every"], "target": TARGET, **figures(curves),
           "gpu": "CPU" if args.smoke else gpu_name()}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(row))
    if args.smoke:
        print(json.dumps(row, indent=1) + "\n(--smoke: not written to results)")
    else:
        publish(NAME, "Time to accuracy against TRL on one GPU", size, {"renderer": NAME, **row})
    if importlib.util.find_spec("matplotlib") is None:  # a GPU image may lack it
        print("note: matplotlib is not installed: no figure (the table has every point)")
        return
    lines = [(label, *zip(*points, strict=True), {}) for label, points in curves.items()]
    panel = {"x": "training seconds", "y": "held-out greedy accuracy", "lines": lines, "base": warm}
    learning.plot(WORK / FIGURE.name if args.smoke else FIGURE, [panel])


if __name__ == "__main__":
    main()
