"""`sums`: "What is 37 + 8? Put the final answer in \\boxed{}.", for instruct models.

The prompt is plain chat text (run it with `data.chat_template=true`): a pretrained instruct
model reads it as a question, answers in a sentence, and mostly leaves the box out. The sums
are small (a two-digit and a one-digit number), so a 135M-parameter model knows many of them;
what reward teaches is to answer every one the way it answers its best ones and to put the
number in the box. Problems are the 500 pairs (0-49, 0-9); about one in ten is held out by
`tasks.base.commuted_split`, never one whose operands swapped are a training problem.

Rewards: "correct" (weight 1.0): the extracted answer (the last `\\boxed{}`, else the last
number; `rewards.extraction.extract_answer`) states the sum (`25 + 4` does not); "boxed" (weight
0.2): the completion has a `\\boxed{...}` with something in it.
"""

from __future__ import annotations

from oncurve.data.tasks.base import all_drawn, commuted_split, draw_split
from oncurve.rewards.format import boxed_format_reward
from oncurve.rewards.registry import RewardFn, answer_match_reward

SPLITS = ("train", "test")
FIRST, SECOND = range(50), range(10)


def prompt(a: int, b: int) -> str:
    return f"What is {a} + {b}? Put the final answer in \\boxed{{}}."


class SumsTask:
    """Sums of a number below 50 and a digit, asked in plain words; satisfies `Task`."""

    name = "sums"
    reward_weights = {"correct": 1.0, "boxed": 0.2}

    def examples(self, split: str, n: int, seed: int) -> list[dict[str, str]]:
        """`n` rows {"prompt", "answer"} of `split`: train rows drawn with repetition (seeded),
        test rows distinct, in a seeded order; asking for more test rows than exist is an
        error."""
        if split not in SPLITS:
            raise ValueError(f"sums: split must be one of {', '.join(SPLITS)}, got {split!r}")
        pairs = [(a, b) for a in FIRST for b in SECOND if _split(a, b) == split]
        chosen = draw_split("sums", pairs, split, n, seed)
        return all_drawn(
            "sums", [{"prompt": prompt(a, b), "answer": str(a + b)} for a, b in chosen], n
        )

    def reward_fns(self) -> dict[str, RewardFn]:
        return {"correct": answer_match_reward, "boxed": boxed_format_reward}


def _split(a: int, b: int) -> str | None:
    """The split of the problem `a + b`, None for neither (`commuted_split`); `b + a` is one of
    the task's problems only when `a` is a digit too."""
    return commuted_split(prompt(a, b), prompt(b, a) if a in SECOND else None)
