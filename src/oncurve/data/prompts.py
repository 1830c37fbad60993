"""What a run trains on: prompt rows (from a built-in task, a file or a Hub dataset), encoded
for the model, and their order per step."""

from __future__ import annotations

import copy
from typing import Any

import torch

from oncurve.config import Config, DataConfig
from oncurve.data.files import Row, chat_template_ending, load_rows
from oncurve.data.given import given_argument
from oncurve.data.tasks import get_task
from oncurve.data.tasks.base import Task, TooFewProblems, leveled_examples
from oncurve.envs.verifiers_envs import PREFIX as VERIFIERS_PREFIX
from oncurve.envs.verifiers_envs import environment_rows
from oncurve.errors import UserError
from oncurve.rewards.registry import (
    ANSWER_MATCH_REWARDS,
    RewardFn,
    episode_reward,
    resolve_reward,
    with_answer_match,
)
from oncurve.rollout.base import MAX_CHARS_PER_TOKEN

# A built-in task's test split may be endless (arith draws fresh problems); eval.num_prompts=null
# takes this many of it.
TASK_EVAL_PROMPTS = 500


def load_prompts(config: Config) -> tuple[list[dict], list[dict], Task | None]:
    """(train rows, held-out rows, task or None); rows hold "prompt", "answer" and any other
    columns, which reach the reward functions by name. With `data.curriculum=difficulty` the
    train rows are every level's, each with its "level"; the held-out rows are the task's own
    distribution. A `verifiers:NAME` environment gives its own rows."""
    data = config.data
    env = config.rollout.env or ""
    if env.startswith(VERIFIERS_PREFIX):
        if data.path is not None:
            raise UserError(f"data.path: rollout.env {env} trains on its own dataset; unset it")
        args = config.rollout.env_args
        return environment_rows(env, args, "train"), environment_rows(env, args, "eval"), None
    task = get_task(data.task, data.task_options) if data.task and data.path is None else None
    if task is not None:
        if data.curriculum == "difficulty":
            train = leveled_examples(task, data.num_train, config.run.seed)
        else:
            train = task.examples("train", data.num_train, config.run.seed)
        return train, held_out_examples(task, config), task
    scored = correctness_fn(config, None) in ANSWER_MATCH_REWARDS
    functions = config.reward.functions
    needed = any(s.name == "correct" for s in functions) or not (functions or config.rollout.env)
    episodes = config.rollout.env is not None
    train = read_rows(data.path, data, data.split, require_answer=needed, episodes=episodes)
    held_out = (
        read_rows(
            config.eval.path,
            data,
            config.eval.split,
            require_answer=scored,
            episodes=episodes,
            answer_use=_held_out_answer_use(config.eval.path),
        )
        if config.eval.path
        else []
    )
    return train, held_out, None


def _held_out_answer_use(path: str) -> str:
    """What held-out rows' answers are read for, said where one lacks its answer: TRL scores
    an `eval_dataset` with the reward functions, which needs none."""
    fix = "pass no eval_dataset" if given_argument(path) else "unset eval.path"
    return (
        "held-out evaluation scores each row's greedy completion against its reference answer "
        "('answer', 'solution' or data.answer_field) with the correctness reward, where TRL's "
        f"eval_dataset is scored by the reward functions: add the answers, or {fix}"
    )


def read_rows(
    path: str,
    data: DataConfig,
    split: str,
    *,
    require_answer: bool,
    episodes: bool = False,
    answer_use: str = "",
) -> list[dict]:
    """`oncurve.data.files.load_rows` of `path` (split `split` of a Hub dataset) as the data section
    says: columns, Hub config, prompt template and answer format; `episodes` for a run that
    plays multi-turn episodes on the rows (the columns they add are reserved); `answer_use`
    ends the error for a row without its answer."""
    return load_rows(
        path,
        data.prompt_field,
        data.answer_field,
        data.config,
        split,
        prompt_template=data.prompt_template,
        answer_format=data.answer_format,
        require_answer=require_answer,
        episodes=episodes,
        answer_use=answer_use,
    )


def held_out_examples(task: Task, config: Config) -> list[dict]:
    """The task's `eval_size` test problems, or its whole test split when that has fewer (the
    run's start-up report says so)."""
    try:
        return task.examples("test", eval_size(config), config.run.seed)
    except TooFewProblems as short:
        return short.rows


def eval_size(config: Config) -> int:
    """Held-out problems a built-in task draws: eval.num_prompts, or 500 when that is null."""
    return TASK_EVAL_PROMPTS if config.eval.num_prompts is None else config.eval.num_prompts


class PromptData:
    """Rows with their prompts formatted and tokenized once, served in a seeded order.

    The order is a permutation per epoch drawn from a generator seeded by (seed, epoch), so the
    prompts of step k are a pure function of k: resuming needs no sampler state.
    """

    def __init__(self, rows: list[dict], tokenizer: Any, data: DataConfig, seed: int) -> None:
        if not rows:
            raise UserError("the dataset has no rows")
        self.rows: list[Row] = []
        for index, row in enumerate(rows):
            where = getattr(row, "where", "") or f"row {index}"
            messages = row.get("prompt_messages")
            tools = row.get("prompt_tools")
            ids = encode_prompt(
                tokenizer, row["prompt"], data, where, messages=messages, tools=tools
            )
            kept = Row(row, prompt_ids=ids)
            # a conversational prompt as the policy was given it, for the rewards to read: a
            # row's messages, or a prompt_template through the chat template (TRL's recipes
            # map columns to a `prompt` of messages); a text prompt stays text (TRL's
            # standard format)
            if messages is not None or (data.prompt_template is not None and data.chat_template):
                kept["prompt_messages"] = chat_messages(row["prompt"], data, messages)
            kept.where = where  # for the checks that read rows later (`reward_signal`)
            kept.answer_field = getattr(row, "answer_field", "")
            self.rows.append(kept)
        self.seed = seed
        self._orders: dict[tuple[int, int], list[int]] = {}

    def batch(self, step: int, size: int, round_: int = 0, rounds_per_step: int = 1) -> list[dict]:
        """The `size` rows of training step `step` (1-based) in sampling round `round_` of at
        most `rounds_per_step`. The first rounds of the steps walk the epochs' orders, each row
        once an epoch; dynamic sampling's later rounds walk orders of their own (seeded apart),
        so that a step that needs none of them skips no row, passing over the rows the step's
        earlier rounds hold while others are left."""
        return [self.rows[i] for i in self._picks(step, size, round_, rounds_per_step)]

    def _picks(self, step: int, size: int, round_: int, rounds_per_step: int) -> list[int]:
        count = len(self.rows)
        position = (step - 1) * size
        picks = [
            self._order(0, epoch)[index]
            for epoch, index in (divmod(o, count) for o in range(position, position + size))
        ]
        taken = set(picks)
        for later in range(1, round_ + 1):  # each earlier round once, for the rows it holds
            offset = ((step - 1) * (rounds_per_step - 1) + later - 1) * size
            picks = []
            while len(picks) < size:
                epoch, index = divmod(offset, count)
                row = self._order(1, epoch)[index]
                # once the step holds every row, its rounds outnumber the rows: repeat
                if row not in taken or len(taken) >= count:
                    picks.append(row)
                    taken.add(row)
                offset += 1
        return picks

    def _order(self, stream: int, epoch: int) -> list[int]:
        key = (stream, epoch)
        if key not in self._orders:
            # the later rounds' orders: seeds no epoch of the first rounds reaches
            seed = self.seed * 7919 + epoch + stream * 104_729 * 2**32
            generator = torch.Generator().manual_seed(seed % 2**64)
            if len(self._orders) >= 4:  # the epochs a step's rounds straddle, of both streams
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = torch.randperm(len(self.rows), generator=generator).tolist()
        return self._orders[key]


def chat_messages(
    prompt: str, data: DataConfig, messages: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The messages the chat template renders for a prompt: a conversational row's own
    (`messages`) or, under `data.chat_template`, the text prompt as one user message; after
    `data.system_prompt` when they have no system message. None for a plain text prompt."""
    if not data.chat_template and messages is None:
        return None
    messages = list(messages or [{"role": "user", "content": prompt}])
    if data.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": data.system_prompt})
    return messages


def prompt_source(data: DataConfig) -> str:
    """Where a row's prompt comes from, as an error names it: the template, else the column."""
    if data.prompt_template is not None:
        return "the prompt (data.prompt_template)"
    return f"field {data.prompt_field!r}"


def encode_prompt(
    tokenizer: Any,
    prompt: str,
    data: DataConfig,
    where: str,
    messages: list[dict[str, Any]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of a prompt after the optional system prompt and chat template; a
    conversational prompt (`messages`, which `prompt` then only names) always takes the chat
    template, which shows `tools` (OpenAI's function definitions) where given, and ends in the
    generation prompt, or in the assistant's last message continued (`chat_template_ending`);
    the template is rendered with `data.chat_template_kwargs`.
    `where` locates the row in the error for a prompt over `data.max_prompt_tokens`."""
    if messages is not None and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"{where}: {prompt_source(data)} is a list of messages, and the tokenizer has "
            "no chat template to render them; give the prompt as text"
        )
    if data.chat_template and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"{where}: data.chat_template=true, but the model's tokenizer has no chat template "
            "(model.path names a base model); set data.chat_template=false, or give model.path "
            "an instruct model"
        )
    chars = len(data.system_prompt or "") + (
        sum(len(str(m.get("content", ""))) for m in messages) if messages else len(prompt)
    )
    if chars > data.max_prompt_tokens * MAX_CHARS_PER_TOKEN:  # refused before it costs
        raise UserError(
            f"{where}: {prompt_source(data)} has {chars} characters, more than "
            f"data.max_prompt_tokens={data.max_prompt_tokens} tokens hold (at most "
            f"{MAX_CHARS_PER_TOKEN} characters each)"
        )
    messages = chat_messages(prompt, data, messages)
    if messages is not None:
        # transformers 5 returns a BatchEncoding (a Mapping, not a dict) unless told otherwise
        shown = {"tools": tools} if tools else {}
        ending = chat_template_ending(messages, f"{where}: {prompt_source(data)}")
        try:
            ids = tokenizer.apply_chat_template(
                messages,
                tokenize=True,
                return_dict=False,
                **ending,
                **shown,
                **data.chat_template_kwargs,
            )
        except Exception as error:  # the template's own refusal (jinja's or its raise_exception)
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise UserError(
                f"{where}: the chat template cannot render the prompt's messages ({message})"
            ) from None
        ids = list(ids)
    else:
        text = f"{data.system_prompt}\n\n{prompt}" if data.system_prompt else prompt
        ids = tokenizer(text)["input_ids"]
    if not ids:  # the forwards need a token before the first completion token
        raise UserError(f"{where}: {prompt_source(data)} encodes to no tokens")
    if len(ids) > data.max_prompt_tokens:
        raise UserError(
            f"{where}: {prompt_source(data)} has {len(ids)} tokens, more than "
            f"data.max_prompt_tokens={data.max_prompt_tokens}"
        )
    return ids


def group_columns(rows: list[dict], group_size: int) -> tuple[list[str], dict[str, list]]:
    """The prompts and the dataset's other columns (all but `prompt_ids`) of `rows`, each
    repeated `group_size` times: one value per completion, as reward functions take them. A
    list or dict value is copied for each completion: a reward that edits one in place edits
    neither another completion's nor the dataset's."""
    prompts = [row["prompt"] for row in rows for _ in range(group_size)]
    columns = {
        key: [
            copy.deepcopy(row[key]) if isinstance(row[key], (list, dict)) else row[key]
            for row in rows
            for _ in range(group_size)
        ]
        for key in rows[0]
        if key not in ("prompt", "prompt_ids")
    }
    return prompts, columns


def correctness_fn(config: Config, task: Task | None) -> RewardFn:
    """The reward that decides whether an answer is right, for held-out accuracy: with
    `rollout.env`, the environment's episode reward; with `code_tests` among
    `reward.functions`, that one."""
    if config.rollout.env is not None:
        return episode_reward
    if task is not None and "correct" in task.reward_fns():
        return with_answer_match(task.reward_fns()["correct"], config.reward.answer_match)
    # programs are judged by their tests: there is no answer to compare
    if any(spec.name == "code_tests" for spec in config.reward.functions):
        return resolve_reward("code_tests")[1]
    return with_answer_match(resolve_reward("correct")[1], config.reward.answer_match)


def correctness_name(config: Config, task: Task | None) -> str:
    """How an evaluation's warnings name `correctness_fn(config, task)`: the episode's reward
    of `rollout.env`, the task's `correct`, `code_tests` or `correct`."""
    if config.rollout.env is not None:
        return f"rollout.env {config.rollout.env}: the episode's reward"
    if task is not None and "correct" in task.reward_fns():
        return f"{config.data.task} task's correct"
    if any(spec.name == "code_tests" for spec in config.reward.functions):
        return "code_tests"
    return "correct"
