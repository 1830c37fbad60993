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
    """An oncurve reward fn as TRL calls it: keyword arguments, the dataset's columns included
    (TRL also passes `completion_ids`, `trainer_state`, ...: the fn's **columns absorbs them).
    Appends the prompt of each group of `group` rows of a call to `seen` (one per group, not
    the distinct ones: a step may draw one prompt text twice)."""

    def reward(prompts: list[str], completions: list[str], **columns) -> list[float | None]:
        seen.append(prompts[::group])
        return fn(prompts, completions, **columns)

    reward.__name__ = name  # TRL logs rewards/<__name__>
    return reward


def timed(
    obj: object, method: str, into: list[float], sync: Callable[[], None] | None = None
) -> None:
    """Wrap `obj.method` so each call's wall time is appended to `into`; `sync` (for example
    `torch.cuda.synchronize`) is called before reading the clock at both ends, so that queued
    GPU work counts in the call that queued it."""
    inner = getattr(obj, method)

    def wrapper(*args, **kwargs):
        if sync:
            sync()
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if sync:
                sync()
            into.append(time.perf_counter() - start)

    setattr(obj, method, wrapper)


def step_callback(base: type, seconds: list[float], sync: Callable[[], None] | None) -> Any:
    """An instance of a `base` (transformers' `TrainerCallback`) subclass appending to
    `seconds` the wall time from each on_step_begin to on_step_end: generation, rewards, the
    reference forward and every microbatch's forward/backward up to the optimizer step."""

    def now() -> float:
        if sync:
            sync()
        return time.perf_counter()

    class StepTimes(base):
        start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = now()

        def on_step_end(self, args, state, control, **kwargs):
            seconds.append(now() - self.start)

    return StepTimes()


def train_trl_timed(
    args: Any,
    model_dir: str,
    reward_funcs: list[Callable],
    dataset: Any,
    tokenizer: Any,
    sync: Callable[[], None] | None = None,
) -> tuple[Any, dict[str, list[float]], list[float]]:
    """Build TRL's GRPOTrainer with the `GRPOConfig` `args`, time its phases (`generate`: each
    generation call, `reward`: each reward call, `prepare`: generation + rewards + reference
    forward) and its steps, and train. Returns (trainer, phase seconds, step seconds); `sync`
    as in `timed`."""
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    phases: dict[str, list[float]] = {"generate": [], "reward": [], "prepare": []}
    timed(trainer, "_generate_single_turn", phases["generate"], sync)
    timed(trainer, "_calculate_rewards", phases["reward"], sync)
    timed(trainer, "_generate_and_score_completions", phases["prepare"], sync)
    seconds: list[float] = []
    trainer.add_callback(step_callback(TrainerCallback, seconds, sync))
    trainer.train()
    return trainer, phases, seconds


def train(job: Job, out: Path, save: bool) -> dict[str, Any]:
    """Train `job` with TRL's GRPOTrainer, its phases and steps timed; the result's fields."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    config = job.config()
    cuda = config.run.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else None
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
    columns = [{**r, "prompt": t} for r, t in zip(rows, texts, strict=True)]
    dataset = Dataset.from_list([{"prompt": c["prompt"], "answer": c["answer"]} for c in columns])
    settings = job.trl_config(out)
    dtype = settings["model_init_kwargs"]["dtype"]
    settings["model_init_kwargs"] = {"dtype": getattr(torch, dtype)}
    rewards = job.rewards()
    group = config.rollout.group_size
    seen: list[list[str]] = []  # the prompts each reward call scored, checked below
    funcs = [trl_reward(name, fn, group, seen) for name, fn, _ in rewards]
    trainer, phases, seconds = train_trl_timed(
        GRPOConfig(**settings), config.model.path, funcs, dataset, tokenizer, sync
    )
    per_step = config.data.prompts_per_step
    expected = [texts[i : i + per_step] for i in range(0, len(texts), per_step)]
    if seen[:: len(rewards)] != expected:
        raise SystemExit("TRL's reward calls scored other prompts than oncurve's steps draw")
    if len(seconds) != config.run.steps or len(phases["prepare"]) != config.run.steps:
        raise SystemExit(
            f"expected {config.run.steps} steps of one generation each, timed {len(seconds)} "
            f"steps and {len(phases['prepare'])} generations"
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
    job = Job.from_json((args.out / "job.json").read_text())
    result = train(job, args.out, args.save)
    (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
