"""Format rewards and length penalties.

Lengths: every length-based function reads the `completion_lengths` column (tokens, as the
trainer passes it from the rollout) when present, else falls back to the character length of
the completion; `max_len` and `buffer` are in the same unit as the lengths used.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from oncurve.rewards.answers import extract_answer

_TAG_RE = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)
_WELL_FORMED_TAGS = ["<think>", "</think>", "<answer>", "</answer>"]


def think_answer_format_reward(
    prompts: list[str], completions: list[str], **columns: Any
) -> list[float]:
    """1.0 when the completion is exactly `<think>...</think><answer>...</answer>`: each tag once,
    in that order, only whitespace outside them, and something other than whitespace inside
    both (an empty block is structure without content), else 0.0. A prompt that ends with
    `<think>` (the R1-Zero template) has opened the tag for the completion, so the completion
    then starts inside it."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if prompt.rstrip().endswith("<think>"):
            completion = "<think>" + completion
        scores.append(1.0 if _think_then_answer(completion) else 0.0)
    return scores


def boxed_format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when the completion has a box with something in it: the box `correct` reads
    (`extract_answer(style="boxed")`, any balanced `\\boxed{...}`, `\\boxed{\\frac{1}{2}}`
    included), not empty, else 0.0."""
    return [1.0 if extract_answer(c, "boxed") else 0.0 for c in completions]


def tags_format_reward(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """1.0 when the completion's last `<answer>...</answer>` pair (the one `correct` reads) holds
    something other than whitespace, else 0.0."""
    return [1.0 if extract_answer(c, "tags") else 0.0 for c in completions]


def _think_then_answer(completion: str) -> bool:
    tags = list(itertools.islice(_TAG_RE.finditer(completion), len(_WELL_FORMED_TAGS) + 1))
    if [tag.group().lower() for tag in tags] != _WELL_FORMED_TAGS:
        return False
    think_open, think_close, answer_open, answer_close = tags
    outside = (
        completion[: think_open.start()]
        + completion[think_close.end() : answer_open.start()]
        + completion[answer_close.end() :]
    )
    return (
        not outside.strip()
        and bool(completion[think_open.end() : think_close.start()].strip())
        and bool(completion[answer_open.end() : answer_close.start()].strip())
    )


def length_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    max_len: int = 1024,
    completion_lengths: Sequence[int] | None = None,
    **columns: Any,
) -> list[float]:
    """`-min(length, max_len) / max_len`, in [-1, 0]: a linear push toward short completions;
    scale it with the reward's weight."""
    _check_positive(max_len=max_len)
    return [-min(n, max_len) / max_len for n in _lengths(completions, completion_lengths)]


def overlong_penalty(
    prompts: list[str],
    completions: list[str],
    *,
    max_len: int = 1024,
    buffer: int = 256,
    factor: float = 1.0,
    completion_lengths: Sequence[int] | None = None,
    **columns: Any,
) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to `max_len - buffer`,
    then falling linearly to `-factor` at `max_len`, and `-factor` beyond."""
    _check_positive(max_len=max_len, buffer=buffer)
    if buffer > max_len:
        raise ValueError(f"overlong_penalty: buffer ({buffer}) must not exceed max_len ({max_len})")
    free = max_len - buffer
    scores = []
    for n in _lengths(completions, completion_lengths):
        if n <= free:
            scores.append(0.0)
        elif n <= max_len:
            scores.append(factor * (free - n) / buffer)
        else:
            scores.append(-factor)
    return scores


def _lengths(completions: list[str], completion_lengths: Sequence[int] | None) -> list[int]:
    if completion_lengths is None:
        return [len(c) for c in completions]
    if len(completion_lengths) != len(completions):
        raise ValueError(
            f"completion_lengths has {len(completion_lengths)} entries for "
            f"{len(completions)} completions"
        )
    return [int(n) for n in completion_lengths]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
