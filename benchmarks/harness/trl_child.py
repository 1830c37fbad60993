"""TRL's side of a comparison, run as `python -m harness.trl_child OUT` in TRL's environment
(`trl_env`): reads `OUT/job.json`, trains with TRL's GRPOTrainer on the job's prompts and
rewards, and writes its per-step times and phases, rewards, lengths and peak GPU memory to
`OUT/result.json` (and the final model to `OUT/final` with `--save`)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.spec import Job, chat_text

GIB = 2**30


def trl_reward(name: str, fn: Callable, group: int, seen: list[list[str]]) -> Callable:
    """An oncurve reward fn as TRL calls it (keywords, extra columns absorbed); appends each
    group's prompt to `seen` (per group: a step may draw one prompt text twice)."""

    def reward(prompts: list[str], completions: list[str], **columns) -> list[float | None]:
        seen.append(prompts[::group])
        return fn(prompts, completions, **columns)

    reward.__name__ = name  # TRL logs rewards/<__name__>
    return reward


def timed(obj: object, method: str, into: list[float], now: Callable[[], float]) -> None:
    """Wrap `obj.method` so that each call's seconds by `now` are appended to `into`."""
    inner = getattr(obj, method)

    def wrapper(*args, **kwargs):
        start = now()
        try:
            return inner(*args, **kwargs)
        finally:
            into.append(now() - start)

    setattr(obj, method, wrapper)


def train(job: Job, out: Path, save: bool) -> dict[str, Any]:
    """Train `job` with GRPOTrainer timing steps and phases (generate, reward, prepare); the
    result's fields. Checks TRL's prompt ids and its steps' prompts equal oncurve's."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    config = job.config()
    cuda = config.run.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        if job.gpu_memory_gb:
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, job.gpu_memory_gb * GIB / total))
    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    rows = job.step_rows(tokenizer)
    texts = [r["prompt"] for r in rows]
    if config.data.chat_template:
        texts = [chat_text(tokenizer, text) for text in texts]
        for text, row in zip(texts, rows, strict=True):
            if tokenizer(text=text)["input_ids"] != row["prompt_ids"]:
                raise SystemExit(f"TRL would tokenize {text!r} to other ids than oncurve")
    dataset = Dataset.from_dict({"prompt": texts, "answer": [r["answer"] for r in rows]})
    settings = job.trl_config(out)
    settings["model_init_kwargs"]["dtype"] = getattr(torch, settings["model_init_kwargs"]["dtype"])
    rewards = job.rewards()
    seen: list[list[str]] = []  # the prompts each reward call scored, checked below
    trainer = GRPOTrainer(
        model=config.model.path,
        reward_funcs=[trl_reward(n, fn, config.rollout.group_size, seen) for n, fn, _ in rewards],
        args=GRPOConfig(**settings),
        train_dataset=dataset,
        processing_class=tokenizer,
    )

    def now() -> float:
        if cuda:  # queued GPU work counts in the span that queued it
            torch.cuda.synchronize()
        return time.perf_counter()

    phases: dict[str, list[float]] = {"generate": [], "reward": [], "prepare": []}
    timed(trainer, "_generate_single_turn", phases["generate"], now)
    timed(trainer, "_calculate_rewards", phases["reward"], now)
    timed(trainer, "_generate_and_score_completions", phases["prepare"], now)
    seconds: list[float] = []

    class StepTimes(TrainerCallback):
        """Each step's seconds, on_step_begin to on_step_end (generation to optimizer step);
        stops the training (and saves) at the first step that brings the sum to the budget."""

        start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = now()

        def on_step_end(self, args, state, control, **kwargs):
            seconds.append(now() - self.start)
            if job.seconds_budget is not None and sum(seconds) >= job.seconds_budget:
                control.should_training_stop = control.should_save = True

    trainer.add_callback(StepTimes())
    trainer.train()
    per_step = config.data.prompts_per_step
    drawn = [texts[i : i + per_step] for i in range(0, len(seconds) * per_step, per_step)]
    if seen[:: len(rewards)] != drawn:
        raise SystemExit("TRL's reward calls scored other prompts than oncurve's steps draw")
    # stopped by its budget, the steps it took
    steps = config.run.steps if job.seconds_budget is None else len(seconds)
    if len(seconds) != steps or len(phases["prepare"]) != steps:
        raise SystemExit(
            f"expected {steps} steps of one generation each, timed {len(seconds)} steps and "
            f"{len(phases['prepare'])} generations"
        )
    if save:
        trainer.save_model(str(out / "final"))
        tokenizer.save_pretrained(str(out / "final"))
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    return {
        "seconds": seconds,
        **phases,
        "mean_reward": [entry["reward"] for entry in logs],
        "rewards": {
            name: [entry.get(f"rewards/{name}/mean", float("nan")) for entry in logs]
            for name, _, _ in rewards
        },
        "length": [entry["completions/mean_length"] for entry in logs],
        "gpu_peak_gb": torch.cuda.max_memory_allocated() / GIB if cuda else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder holding job.json")
    parser.add_argument("--save", action="store_true", help="save the final model to OUT/final")
    args = parser.parse_args()
    job = Job(**json.loads((args.out / "job.json").read_text()))
    (args.out / "result.json").write_text(json.dumps(train(job, args.out, args.save)))


if __name__ == "__main__":
    main()
