"""The two-turn benchmark game pays 1 for a right first answer, 0.75 for a right second one and
0 after two wrong ones, with one `TRY_AGAIN` between."""

from __future__ import annotations

from environments.sums_second_chance import TRY_AGAIN, SecondChance

ROW = {"prompt": "What is 5 + 4? Put the final answer in \\boxed{}.", "answer": "9"}


def play(*turns: str) -> list[tuple[str | None, float, bool]]:
    game = SecondChance()
    assert game.reset(ROW) == ROW["prompt"]
    return [game.step(turn) for turn in turns]


def test_the_game_pays_the_first_try_more_than_the_second():
    assert play("5 + 4 = \\boxed{9}") == [(None, 1.0, True)]
    assert play("\\boxed{8}", "\\boxed{9}") == [(TRY_AGAIN, 0.0, False), (None, 0.75, True)]
    assert play("\\boxed{8}", "it is 7") == [(TRY_AGAIN, 0.0, False), (None, 0.0, True)]
