"""Does the reward carry a signal? Checked before step 1 and watched during training.

A dataset whose answer column holds more than the answer (GSM8K's worked solutions ending in
`#### 72`), or a prompt that asks for a form the reward does not read, makes every completion
score alike: every group is all-equal, the gradient is zero, and the run learns nothing without
a word. `check_gold_answers` writes, for a few rows, the completion a person would (the row's
final answer, read off the answer column, in the form the prompt asks for) and stops the run
when the correctness reward does not give it full marks. `DeadStepWatch` warns once when every
group has been all-equal for `run.dead_steps` steps in a row.
"""

from __future__ import annotations

import sys
from typing import Any

from oncurve.data.files import final_answer
from oncurve.data.prompts import group_columns
from oncurve.errors import UserError
from oncurve.rewards.registry import RewardFn


def stated_answer(value: str) -> str:
    """The final answer as a person reads it off an answer column's value: the `x` of a last
    `#### x` line, else the last `\\boxed{x}`, else the whole value."""
    return (final_answer(value, "auto") or value).strip()


def gold_completion(prompt: str, answer: str) -> str:
    """A completion that states `answer` the way `prompt` asks: in `\\boxed{}`, in
    `<answer>` tags, or as a closing sentence."""
    if "\\boxed" in prompt:
        return f"The final answer is \\boxed{{{answer}}}."
    if "<answer>" in prompt:
        return f"<answer>{answer}</answer>"
    return f"The answer is {answer}."


def check_gold_answers(
    rows: list[dict[str, Any]], correct: RewardFn, answer_field: str, count: int = 4
) -> str:
    """Score the gold completion of the first `count` rows that have an answer with `correct`;
    a UserError naming the field, the settings and the first row that scores below 1, else a
    line saying how many passed."""
    checked = [row for row in rows if row.get("answer") is not None][:count]
    if not checked:
        return "gold answers: no row has an answer to check"
    golds = [
        gold_completion(row["prompt"], stated_answer(str(row.get("answer_raw") or row["answer"])))
        for row in checked
    ]
    prompts, columns = group_columns(checked, 1)
    scores = correct(prompts, golds, **columns)
    for row, gold, score in zip(checked, golds, scores, strict=True):
        if score is None or score < 1:
            where = getattr(row, "where", "") or "row"
            value = str(row.get("answer_raw") or row["answer"])
            raise UserError(
                f"{where}: the correctness reward scores {score} for {gold!r}, the answer of "
                f"field {answer_field!r} ({value[-40:]!r}); set data.answer_format (gsm8k, "
                "boxed, last_number) or data.answer_field so that the reference is the final "
                "answer, or the prompt (data.prompt_template) so that it asks for a form the "
                "reward reads"
            )
    return f"gold answers: {len(checked)} rows' answers, stated as their prompts ask, score 1"


class DeadStepWatch:
    """Counts steps in a row whose groups were all all-equal; warns once per such streak when
    it reaches `steps` (0: never)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.streak = 0

    def update(self, metrics: dict[str, float]) -> str | None:
        """The warning line for this step's metrics, or None; also printed to stderr."""
        if metrics.get("groups/all_equal_frac", 0.0) < 1.0:
            self.streak = 0
            return None
        self.streak += 1
        if not self.steps or self.streak != self.steps:
            return None
        line = (
            f"warning: every group has been all-equal (no gradient) for {self.streak} steps in "
            f"a row (reward/mean {metrics.get('reward/mean', float('nan')):.3g}, "
            f"length/truncated_frac {metrics.get('length/truncated_frac', float('nan')):.2f}): "
            "the reference answer may not be the final answer (data.answer_format), the prompt "
            "may not ask for the form the reward reads, completions may be cut "
            "(rollout.max_new_tokens), or the task is too hard or too easy for the model"
        )
        print(line, file=sys.stderr)
        return line
