"""One GRPO job for both trainers as oncurve settings: `Job` yields `oncurve train`'s arguments,
TRL's `GRPOConfig` fields, every step's prompt rows in oncurve's order, and the rewards."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.children import setting_args


@dataclasses.dataclass(frozen=True)
class Job:
    """One GRPO job both trainers are given."""

    settings: dict[str, Any]  # oncurve settings by dotted key, e.g. {"optim.lr": 1e-4}
    config_file: str | None = None  # an oncurve YAML the settings apply on top of
    reward_task: str = "arith"  # the task whose reward functions and weights both trainers use
    trl_microbatch: int | None = None  # TRL's rows per forward/backward; None: oncurve's
    gpu_memory_gb: float | None = None  # GiB both trainers are capped at; None: the whole card
    # seconds of training steps after which a trainer stops (before run.steps); None: no limit
    seconds_budget: float | None = None

    def with_settings(self, **settings: Any) -> Job:
        """This job with some settings replaced (keys as `run__seed` for `run.seed`)."""
        changed = {key.replace("__", "."): value for key, value in settings.items()}
        return dataclasses.replace(self, settings={**self.settings, **changed})

    def config(self) -> Any:
        """oncurve's `Config` of the job (the file, then the settings)."""
        from oncurve.config import load_config

        return load_config(self.config_file, setting_args(self.settings))

    def oncurve_args(self) -> list[str]:
        """The arguments of `oncurve train` for this job (without `run.dir`)."""
        args = [self.config_file] if self.config_file else []
        args += setting_args(self.settings)
        if self.gpu_memory_gb:
            args.append(f"run.gpu_memory_gb={self.gpu_memory_gb}")
        return args

    def rewards(self) -> list[tuple[str, Callable, float]]:
        """(name, function, weight) of `reward_task`'s rewards, the same functions in both."""
        from oncurve.data.tasks import get_task

        task = get_task(self.reward_task)
        return [(name, fn, task.reward_weights[name]) for name, fn in task.reward_fns().items()]

    def step_rows(self, tokenizer: Any) -> list[dict]:
        """The rows oncurve's trainer draws for steps 1..run.steps, in order, each with its
        "prompt_ids" (its loading of the task or `data.path` and its seeded order)."""
        from oncurve.data.prompts import PromptData, load_prompts

        config = self.config()
        rows, _, _ = load_prompts(config)
        ordered = PromptData(rows, tokenizer, config.data, seed=config.run.seed)
        per_step = config.data.prompts_per_step
        return [row for s in range(1, config.run.steps + 1) for row in ordered.batch(s, per_step)]

    def trl_config(self, out_dir: Path) -> dict[str, Any]:
        """The fields of TRL's `GRPOConfig` for this job, writing under `out_dir`. TRL runs the
        DeepSeekMath-style GRPO that oncurve's default preset is (`loss_type` and the rest)."""
        c = self.config()
        cuda = c.run.device.startswith("cuda")
        dtype = "bfloat16" if cuda and c.model.dtype != "float32" else "float32"
        rows = c.data.prompts_per_step * c.rollout.group_size
        micro = self.trl_microbatch or min(c.optim.microbatch_size or rows, rows)
        if rows % micro:
            raise SystemExit(f"prompts x G = {rows} must be a multiple of {micro}")
        schedule = "constant_with_warmup" if c.optim.warmup_steps else "constant"
        min_tokens = c.rollout.min_new_tokens
        checkpointing = c.model.gradient_checkpointing
        # oncurve's checkpoints every run.save_every steps, as TRL's (the model alone)
        save = {"save_strategy": "steps", "save_steps": c.run.save_every, "save_only_model": True}
        return {
            "output_dir": str(out_dir / "trainer"),
            "use_cpu": not cuda,
            "bf16": dtype == "bfloat16",
            "model_init_kwargs": {"dtype": dtype},
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": rows // micro,
            # unset, oncurve's memory plan decides on CUDA; TRL's own default there is on
            "gradient_checkpointing": cuda if checkpointing is None else checkpointing,
            "num_generations": c.rollout.group_size,
            "max_completion_length": c.rollout.max_new_tokens,
            "generation_kwargs": {"min_new_tokens": min_tokens} if min_tokens else None,
            "use_vllm": False,
            "temperature": c.rollout.temperature,
            "top_p": c.rollout.top_p,
            "top_k": c.rollout.top_k,
            "learning_rate": c.optim.lr,
            "lr_scheduler_type": "cosine" if c.optim.schedule == "cosine" else schedule,
            "warmup_steps": c.optim.warmup_steps,
            "weight_decay": c.optim.weight_decay,
            "adam_beta1": c.optim.beta1,
            "adam_beta2": c.optim.beta2,
            "max_grad_norm": c.optim.grad_clip,
            "beta": c.algo.beta,
            "epsilon": c.algo.epsilon,
            "num_iterations": c.algo.mu,
            "loss_type": "grpo",
            "scale_rewards": "group",
            "mask_truncated_completions": False,
            "reward_weights": [weight for _, _, weight in self.rewards()],
            "shuffle_dataset": False,
            "max_steps": c.run.steps,
            "logging_steps": 1,
            **(save if c.run.save_every else {"save_strategy": "no"}),
            "report_to": "none",
            "disable_tqdm": True,
            "seed": c.run.seed,
            "dataloader_num_workers": 0,
        }


def chat_text(tokenizer: Any, prompt: str) -> str:
    """A prompt as its chat-template text, the string TRL is given when oncurve formats prompts
    with `data.chat_template` (TRL tokenizes plain-text prompts as they are, to the same ids)."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
