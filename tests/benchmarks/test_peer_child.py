"""`harness.peer_child.score_row`, which scores a row for the peers' child and for oncurve's own
checkers in `answer_checkers.py`: the checks of the row's set only, a verdict as a bool or
None, a raising check unpaid with its error kept, or raised when it is not to be caught."""

from __future__ import annotations

import pytest
from harness.peer_child import score_row


def refuse(row: dict) -> bool:
    raise ValueError(f"cannot read {row['completion']}")


CHECKS = {"paid": lambda row: 1, "unsure": lambda row: None, "raises": refuse}
CHECKS["gsm8k_only"] = lambda row: True
ONLY = {"paid": None, "unsure": None, "raises": None, "gsm8k_only": "gsm8k"}


def test_a_row_gets_the_verdicts_of_its_sets_checks_and_a_raising_check_none():
    scored = score_row(CHECKS, ONLY, {"set": "math", "completion": "x"})
    assert scored["verdicts"] == {"paid": True, "unsure": None, "raises": None}
    assert scored["errors"] == {"raises": "ValueError: cannot read x"}
    assert set(scored["seconds"]) == {"paid", "unsure", "raises"}
    assert score_row(CHECKS, ONLY, {"set": "gsm8k", "completion": "x"})["verdicts"]["gsm8k_only"]


def test_an_error_not_to_be_caught_is_raised():
    with pytest.raises(ValueError, match="cannot read x"):
        score_row(CHECKS, ONLY, {"set": "math", "completion": "x"}, catch=())
