"""A training session with its sampler and its prompts scripted (`scripted_session`), so that
what each group holds is known in advance."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from oncurve.config import Config
from oncurve.loop.trainer import Session, setup
from oncurve.rewards.runner import RewardRunner
from oncurve.types import RolloutBatch

Completion = Callable[[list[int], int], str]


def digits_then_a(prompt_ids: list[int], member: int) -> str:
    """Member k of a group: k + 1 copies of a digit fixed by the prompt, then "a" (lengths and
    digit fractions differ within a group, and nothing depends on the rank or the seed)."""
    return str(sum(prompt_ids) % 10) * (member + 1) + "a"


def scripted_rollout(
    tokenizer: Any, completion: Completion, prompt_ids: list[list[int]], group_size: int, *_: Any
) -> RolloutBatch:
    """A `RolloutBatch` of `completion(prompt, k)` + EOS for each prompt and member k, in place
    of `TorchSampler.generate_ids` (sampling logprobs 0: only a health metric reads them)."""
    prompts = [ids for ids in prompt_ids for _ in range(group_size)]
    texts = [completion(ids, k) for ids in prompt_ids for k in range(group_size)]
    completions = [
        tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for text in texts
    ]
    n, width_p, width_t = len(texts), max(map(len, prompts)), max(map(len, completions))
    prompt = torch.full((n, width_p), tokenizer.pad_token_id)
    prompt_mask = torch.zeros(n, width_p, dtype=torch.long)
    completion_ids = torch.full((n, width_t), tokenizer.pad_token_id)
    completion_mask = torch.zeros(n, width_t, dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        prompt[row, width_p - len(p) :], prompt_mask[row, width_p - len(p) :] = torch.tensor(p), 1
        completion_ids[row, : len(c)], completion_mask[row, : len(c)] = torch.tensor(c), 1
    return RolloutBatch(
        prompt_ids=prompt,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=torch.zeros(n, width_t),
        texts=texts,
        finish_reasons=["eos"] * n,
        group_size=group_size,
    )


def scripted_rows(tokenizer: Any, step: int, size: int, round_: int = 0, *_: Any) -> list[dict]:
    """In place of `PromptData.batch`: prompt i of a round reads "step.round.i"; its answer is
    "99999" for even i, "0" for odd i."""
    rows = []
    for i in range(size):
        prompt = f"{step}.{round_}.{i}"
        answer = "99999" if i % 2 == 0 else "0"
        rows.append(
            {"prompt": prompt, "answer": answer, "prompt_ids": tokenizer(prompt)["input_ids"]}
        )
    return rows


def scripted_session(
    config: Config,
    completion: Completion = digits_then_a,
    reward: Callable[..., list[float | None]] | None = None,
) -> Session:
    """`setup(config)` with the sampler and the prompts scripted, and with `reward` as the only
    reward function when given."""
    s = setup(config)
    s.sampler.generate_ids = functools.partial(scripted_rollout, s.tokenizer, completion)
    s.data.batch = functools.partial(scripted_rows, s.tokenizer)
    if reward is not None:
        s.rewards = RewardRunner([("scripted", reward, 1.0)], timeout_s=None)
    return s
