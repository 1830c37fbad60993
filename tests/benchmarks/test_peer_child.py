"""`harness.peer_child`, shared by the peers' child, `answer_checkers.py` and `peer_suites.py`:
`score_row` runs the checks of the row's set only, a verdict as a bool or None, a raising check
unpaid with its error kept, or raised when it is not to be caught; `tally` counts verdicts
against labels; `oncurve_checks` judges a row as the trainer's `correct` reward does;
`score_in_peers` runs the child on rows and adds its verdicts to theirs, every peer failed when
the peers' environment is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from harness.peer_child import oncurve_checks, score_in_peers, score_row, tally


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


def test_tally_counts_verdicts_against_labels_no_verdict_unpaid():
    pairs = [(True, True), (True, False), (False, True), (None, True), (None, False)]
    assert tally(pairs) == {"tp": 1, "fp": 1, "fn": 2, "tn": 1, "skipped": 2}


def test_oncurve_checks_pay_a_stated_answer_and_leave_an_unusable_gold_unscored():
    row = {"prompt": "How many?", "completion": "So 9 * 2 = 18.\n\nThe answer is 18.", "gold": "18"}
    for check in oncurve_checks().values():
        assert check(row) is True
        assert check(row | {"gold": "19"}) is False
        assert check(row | {"gold": ""}) is None


ROWS = [
    {"id": "a", "set": "gsm8k", "gold": "18", "prompt": "How many?", "completion": "18"},
    {"id": "b", "set": "math", "gold": "x", "prompt": "Solve.", "completion": "x"},
]


def test_the_child_scores_every_row_and_reports_a_peer_it_cannot_make(tmp_path):
    rows = [row | {"note": "not sent"} for row in ROWS]
    header = score_in_peers(rows, {"no_such_peer": None}, tmp_path, Path(sys.executable))
    assert header["failed"] == {"no_such_peer": "KeyError: 'no_such_peer'"}
    assert set(header["versions"]) >= {"math-verify", "trl", "verl", "lm_eval"}
    assert rows == [
        row | {"note": "not sent", "verdicts": {}, "errors": {}, "seconds": {}} for row in ROWS
    ]


def test_without_the_peers_environment_every_peer_fails_and_no_row_is_scored(tmp_path):
    wanted = {"math_verify": None, "verl_gsm8k": "gsm8k"}
    rows = [dict(row) for row in ROWS]
    header = score_in_peers(rows, wanted, tmp_path, tmp_path / "venv" / "bin" / "python")
    reason = f"no peers' environment at {tmp_path / 'venv'} (--prepare)"
    assert header == {"failed": dict.fromkeys(wanted, reason), "versions": {}}
    assert rows == ROWS
