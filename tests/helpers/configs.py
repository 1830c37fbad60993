"""Trainer configs of a tiny job that tests across the suite train with."""

from __future__ import annotations

from pathlib import Path

from oncurve.config import load_config


def make_config(model_dir: Path, data_file: Path, run_dir: Path, *extra: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.path={data_file}",
            "data.prompts_per_step=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "run.steps=3",
            f"run.dir={run_dir}",
            "reward.timeout=null",
            "optim.lr=1e-3",
            # the numbers below are the CPU's (an extra run.device=cuda overrides it)
            "run.device=cpu",
            *extra,
        ],
    )


GROUP = 4


def raw_gradient_config(model_dir: Path, data_file: Path, run_dir: Path, *extra: str):
    """`make_config`'s shape (4 prompts x 4 completions of 8 tokens, count_digits
    rewards), the raw gradient (no clipping) and no weight decay."""
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"data.path={data_file}",
            "data.prompts_per_step=4",
            f"rollout.group_size={GROUP}",
            "rollout.max_new_tokens=8",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "run.steps=3",
            f"run.dir={run_dir}",
            "reward.timeout=null",
            "run.device=cpu",
            "optim.grad_clip=0",
            "optim.weight_decay=0.0",
            *extra,
        ],
    )
