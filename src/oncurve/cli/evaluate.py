"""`oncurve eval`: accuracy, mean@K and pass@K of a model on a dataset, a run's eval set or a task."""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable

from oncurve.cli.common import (
    fitted_new_tokens,
    load_sampler,
    print_out,
    prompt_format,
    run_config,
    sampling,
    seed_of,
)
from oncurve.errors import UserError


def eval_command(args: argparse.Namespace) -> int:
    from oncurve.config import Config
    from oncurve.data.prompts import PromptData
    from oncurve.loop.evaluate import evaluate
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.registry import episode_reward
    from oncurve.rewards.runner import runner_settings
    from oncurve.run.metrics import json_value
    from oncurve.run.setup import episode_settings

    config, config_file = run_config(args)
    unread = _unread_flags(args, config)
    if unread:
        raise UserError(f"{unread}; drop it")
    chosen = sampling(args, config, config_file)
    sampler, model = load_sampler(args, config, config_file)
    data = prompt_format(args, config, sampler.tokenizer)
    scorer, correct, reads_answer = _eval_scorer(args, config)
    rows = _eval_rows(args, config, data, needs_answer=reads_answer)
    # a run trained on episodes is scored on the episodes it plays, as its trainer scored it
    played = config is not None and config.rollout.env is not None and correct is episode_reward
    episodes = episode_settings(config, sampler.tokenizer) if played else None
    rows = PromptData(rows, sampler.tokenizer, data, seed=0).rows
    longest = max(len(row["prompt_ids"]) for row in rows)
    max_new_tokens = fitted_new_tokens(chosen, longest, model.config)
    records: list[dict] = []
    result = evaluate(
        sampler,
        rows,
        correct,
        chosen.params(max_new_tokens, seed_of(args, config)),
        samples=args.samples or (config.eval.samples if config is not None else 1),
        batch_size=config.eval.batch_rows if config is not None else 256,
        records=records,
        episodes=episodes,
        **runner_settings((config or Config()).reward),
        name=scorer,
    )
    if args.out:
        with open(args.out, "w") as out:
            for row, record in zip(rows, records, strict=True):
                line = {
                    "prompt": sampler.tokenizer.decode(row["prompt_ids"]),
                    "answer": row.get("answer"),
                    "extracted": extract_answer(record["greedy"]),
                    **record,
                }
                out.write(json.dumps(line) + "\n")
    prompts = {
        "chat_template": data.chat_template,
        "chat_template_kwargs": data.chat_template_kwargs,
        "system_prompt": data.system_prompt,
        "prompt_template": data.prompt_template,
        "answer_format": data.answer_format,
    }
    summary = {"n": len(rows), **result, "scorer": scorer, "prompt_format": prompts}
    print_out(json.dumps(json_value(summary)))  # no rows scored: accuracy null, not NaN
    return 0


def _eval_scorer(args: argparse.Namespace, config) -> tuple[str, Callable, bool]:
    """(name, function, whether it reads a reference answer) of the reward that decides
    correctness: `--reward`, else `--task`'s, else the run's (`--run`: with `rollout.env`, the
    episode's reward), else the built-in `correct` (answers read as data.answer_format says)."""
    from oncurve.data.prompts import correctness_fn, correctness_name
    from oncurve.data.tasks import get_task
    from oncurve.rewards.registry import (
        ANSWER_MATCH_REWARDS,
        episode_reward,
        resolve_reward,
    )

    if args.reward:
        name, fn = resolve_reward(args.reward)
        return name, fn, fn in ANSWER_MATCH_REWARDS
    if args.task:
        task = get_task(args.task, given="--task")
        fn = task.reward_fns()["correct"]
        return f"{args.task} task's correct", fn, _reads_answer(fn)
    if config is None:
        return *resolve_reward("correct"), True
    on_task = config.data.task and not config.data.path
    task = get_task(config.data.task, config.data.task_options) if on_task else None
    fn, name = correctness_fn(config, task), correctness_name(config, task)
    if fn is episode_reward:
        return name, fn, False
    if task is not None and "correct" in task.reward_fns():
        return name, fn, _reads_answer(task.reward_fns()["correct"])
    return name, fn, fn in ANSWER_MATCH_REWARDS


def _reads_answer(fn: Callable) -> bool:
    """Whether a task's reward takes the `answer` column (countdown's reads its numbers and
    target, the code task's its tests)."""
    return "answer" in inspect.signature(fn).parameters


def _unread_flags(args: argparse.Namespace, config) -> str:
    """Why a `--config` or `--split` given would be ignored by the rows `_eval_rows` reads:
    local data has no configs (and a file no splits), and a run's task or environment rows
    come from no dataset; else ""."""
    from oncurve.data.files import unread_options
    from oncurve.envs.verifiers_envs import PREFIX as VERIFIERS_PREFIX

    if args.data is not None:
        return unread_options(args.data, args.config, args.split)
    if config is None:
        return ""  # no rows to read: _eval_rows asks for --data
    env = config.rollout.env or ""
    if config.eval.path and not env.startswith(VERIFIERS_PREFIX):
        return unread_options(config.eval.path, args.config, args.split)
    flag = next(
        (f for f, v in (("--config", args.config), ("--split", args.split)) if v is not None), ""
    )
    return f"{flag}: the run's held-out rows are its task's or environment's" if flag else ""


def _eval_rows(args: argparse.Namespace, config, data, needs_answer: bool) -> list[dict]:
    """The prompts to score: `--data` (a file or a Hub id at `--config` and `--split`), else
    the run's eval.path, else the run's task's held-out problems."""
    from oncurve.data.given import given_argument
    from oncurve.data.prompts import held_out_examples, read_rows
    from oncurve.data.tasks import get_task
    from oncurve.envs.verifiers_envs import PREFIX as VERIFIERS_PREFIX
    from oncurve.envs.verifiers_envs import environment_rows

    env = config.rollout.env if config is not None else None
    episodes = env is not None
    if args.data is not None:
        split = args.split or "test"
        return read_rows(args.data, data, split, require_answer=needs_answer, episodes=episodes)
    if config is not None and config.eval.num_prompts == 0:
        raise UserError("the run evaluated no held-out prompts (eval.num_prompts=0): give --data")
    if env is not None and env.startswith(VERIFIERS_PREFIX):  # the environment's own rows
        rows = environment_rows(env, config.rollout.env_args, "eval")
        if not rows:
            raise UserError(
                f"rollout.env {env} has no eval dataset (the run evaluated nothing): give --data"
            )
        return rows[: config.eval.num_prompts]
    if config is not None and given_argument(config.eval.path):
        raise UserError(
            f"the run's eval.path is the {given_argument(config.eval.path)} passed to "
            "oncurve.train, which only that process held: give the rows with --data"
        )
    if config is not None and config.eval.path:
        split = args.split or config.eval.split
        rows = read_rows(
            config.eval.path, data, split, require_answer=needs_answer, episodes=episodes
        )
        return rows[: config.eval.num_prompts]  # the rows the trainer evaluated
    if config is not None and config.data.task and config.data.path is None:
        return held_out_examples(get_task(config.data.task, config.data.task_options), config)
    raise UserError(
        "--data is required (with --run, unless the run has an eval.path or trained on a task)"
    )
