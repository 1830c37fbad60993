"""Sums with a second chance, a two-turn environment in the two shapes oncurve trains on, one
game behind both: a verifiers environment as the hub's are written (`load_environment`, for
`rollout.env=verifiers:environments.sums_second_chance`, `benchmarks/` on the path) and oncurve's
own protocol (`SecondChance`, `rollout.env=environments.sums_second_chance:SecondChance`).

The policy is asked oncurve's `sums` problem; a wrong first answer gets `TRY_AGAIN` and a second
turn, unless the first was cut at the length limit. The score is 1 for a right first answer,
0.75 for a right second one, else 0 (above 0.5 is a success); right or wrong is the strict
`correct` reward's verdict."""

from __future__ import annotations

from typing import Any

from oncurve.data.tasks import get_task
from oncurve.rewards.registry import answer_match_reward

TRY_AGAIN = "That is not right. Try once more."
SCORES = (1.0, 0.75)  # a right answer at the first, the second turn


def is_right(text: str, answer: str) -> bool:
    """Whether `text` states `answer` (the `correct` reward's verdict)."""
    return answer_match_reward([""], [text], answer=[answer])[0] == 1.0


class SecondChance:
    """The game in oncurve's environment protocol (`rollout.env`): the row's prompt, then up to
    two answers."""

    observation_role = "user"

    def reset(self, row: dict[str, Any]) -> str:
        self.answer, self.turn = row["answer"], 0
        return row["prompt"]

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        self.turn += 1
        if is_right(turn, self.answer):
            return None, SCORES[self.turn - 1], True
        return (TRY_AGAIN, 0.0, False) if self.turn == 1 else (None, 0.0, True)


def load_environment(num_train: int = 2000, num_eval: int = 50, seed: int = 0) -> Any:
    """The game as a verifiers `MultiTurnEnv` on the `sums` task's rows: `num_train` training
    problems, the first `num_eval` held-out ones; its rubric's score, with `solved` and
    `first_try` as unweighted parts."""
    import verifiers as vf
    from datasets import Dataset

    def rows(split: str, count: int) -> Any:
        sums = get_task("sums").examples(split, count, seed)
        return Dataset.from_list([{"question": p["prompt"], "answer": p["answer"]} for p in sums])

    def answers(completion: list) -> list[str]:
        return [m.content or "" for m in completion if m.role == "assistant"]

    def score(completion: list, answer: str, **_: Any) -> float:
        right = [is_right(text, answer) for text in answers(completion)]
        return next((SCORES[k] for k, ok in enumerate(right) if ok), 0.0)

    def solved(completion: list, answer: str, **_: Any) -> float:
        return float(score(completion, answer) > 0)

    def first_try(completion: list, answer: str, **_: Any) -> float:
        return float(score(completion, answer) == SCORES[0])

    class SumsSecondChance(vf.MultiTurnEnv):
        async def env_response(self, messages: list, state: Any, **_: Any) -> list:
            return [vf.UserMessage(content=TRY_AGAIN)]

        @vf.stop
        async def answered_right_or_cut(self, state: Any, **_: Any) -> bool:
            """After a right answer, or a turn cut at the length limit (oncurve's own episode
            loop ends there too)."""
            if not state["trajectory"]:
                return False
            last = state["trajectory"][-1]
            right = any(is_right(text, state["answer"]) for text in answers(last["completion"]))
            return right or bool(last.get("is_truncated"))

    rubric = vf.Rubric(funcs=[score, solved, first_try], weights=[1.0, 0.0, 0.0])
    return SumsSecondChance(
        dataset=rows("train", num_train), eval_dataset=rows("test", num_eval), rubric=rubric,
        max_turns=2,
    )  # fmt: skip
