"""Two trainers' held-out accuracy after the same training time (`grpo_vs_ppo.py`): both runs save
a checkpoint every `run.save_every` steps; the budget is the faster trainer's training time for
all its steps (the sum of its `time/step`: rollout, reward, reference forward and update,
without start-up, saving or logging), and the slower trainer is scored at its newest checkpoint
whose cumulative `time/step` fits in that budget (at most one save interval short of the exact
point, so the comparison never favours the slower trainer)."""

from __future__ import annotations

import statistics
from pathlib import Path

from harness.children import greedy_accuracy
from harness.spec import Job


def budget_step(fast: list[float], slow: list[float], save_every: int) -> tuple[float, int]:
    """(the budget: the sum of `fast`'s seconds per step, the newest step the run of `slow`
    seconds per step saved within it; 0 if none)."""
    budget = sum(fast)
    elapsed, best = 0.0, 0
    for step, seconds in enumerate(slow, start=1):
        elapsed += seconds
        if elapsed > budget:
            break
        if step % save_every == 0 or step == len(slow):
            best = step
    return budget, best


def checkpoint_model(base_dir: str, checkpoint: Path, out: Path) -> Path:
    """A loadable model directory holding a checkpoint's policy weights (the checkpoint keeps
    only weights; config and tokenizer come from the starting model)."""
    from safetensors.torch import load_model as load_weights

    from oncurve.model.saving import save_final
    from oncurve.model.sources import load_model, load_tokenizer

    model = load_model(Path(base_dir))
    load_weights(model, checkpoint / "model.safetensors")
    save_final(model, load_tokenizer(Path(base_dir)), out, model.generation_config)
    return out


def score(job: Job, runs: dict[str, list[dict]], test_file: Path, work: Path, start: float) -> None:
    """Add "equal_time" ({"step", "accuracy", "budget"}) to the runs of both trainers of `runs`
    (each with its "seconds", "accuracy" and "final" model directory), pair by pair: the faster
    one at its last step, the slower one at its step within the budget (step 0: the starting
    model, whose accuracy is `start`), its checkpoint made a model directory under `work`."""
    save_every, tokens = job.settings["run.save_every"], job.settings["rollout.max_new_tokens"]
    for pair in zip(*runs.values(), strict=True):
        fast, slow = sorted(pair, key=lambda run: sum(run["seconds"]))
        budget, step = budget_step(fast["seconds"], slow["seconds"], save_every)
        accuracy = slow["accuracy"] if step == len(slow["seconds"]) else start
        if 0 < step < len(slow["seconds"]):
            checkpoint = Path(slow["final"]).parent / "checkpoints" / f"step-{step:06d}"
            out = work / f"{Path(slow['final']).parent.parent.name}-step{step}"
            model = checkpoint_model(job.settings["model.path"], checkpoint, out)
            accuracy = greedy_accuracy(model, test_file, tokens)
        last = len(fast["seconds"])
        fast["equal_time"] = {"step": last, "accuracy": fast["accuracy"], "budget": budget}
        slow["equal_time"] = {"step": step, "accuracy": accuracy, "budget": budget}


def means(runs: list[dict]) -> dict[str, float | None]:
    """One trainer's mean step and accuracy at equal time over its runs (None unscored)."""
    if not all("equal_time" in r for r in runs):
        return {"equal_step": None, "equal_acc": None}
    return {
        "equal_step": statistics.mean(r["equal_time"]["step"] for r in runs),
        "equal_acc": statistics.mean(r["equal_time"]["accuracy"] for r in runs),
    }


def note(runs: list[dict], steps: int, save_every: int) -> str:
    """What the equal-time columns mean, with the mean budget of `runs` (either trainer's)."""
    budget = statistics.mean(r["equal_time"]["budget"] for r in runs)
    return (
        "Equal wall-clock time: the budget is the faster trainer's training time for "
        f"{steps} steps (sum of `time/step`, mean {budget:.0f} s); the slower trainer is scored "
        f"at its newest checkpoint (saved every {save_every} steps) whose cumulative "
        "`time/step` fits in it (step 0 = the starting model)."
    )


def run_cell(run: dict) -> str:
    """A run's step and accuracy at equal time, "n/a" unscored."""
    if "equal_time" not in run:
        return "n/a"
    return f"{run['equal_time']['step']} / {run['equal_time']['accuracy']:.1%}"


# the columns of a trainer's figures (`comparison.trainer_table`) and of each run's
# (`comparison.run_table`): its training seconds, the sum of its `time/step`
COLUMNS = [
    ("step at equal time", "equal_step", "g"),
    ("greedy acc. at equal time", "equal_acc", ".1%"),
]
RUN_COLUMNS = {"train s": lambda run: f"{run['train_s']:.0f}", "equal time: step / acc.": run_cell}
