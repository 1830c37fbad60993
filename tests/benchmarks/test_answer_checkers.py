"""The hand-labelled corpus of `answer_checkers.py` is well formed (every field, a known set, a
bool label, ids once each), and oncurve's strict `correct` gives each of its rows the verdict the
recorded `results/answer_checkers.jsonl` holds: a change to the answer checker that turns a row
fails here until the benchmark is run again."""

from __future__ import annotations

from answer_checkers import CORPUS, SETS
from harness.checkout import RESULTS
from harness.peer_child import oncurve_checks
from harness.records import read_jsonl

FIELDS = {"id", "set", "gold", "prompt", "completion", "label", "note"}


def test_every_corpus_row_has_its_fields_a_known_set_a_bool_label_and_its_own_id():
    rows = read_jsonl(CORPUS)
    assert len(rows) > 200
    for row in rows:
        assert set(row) >= FIELDS, row["id"]
        assert row["set"] in SETS and isinstance(row["label"], bool), row["id"]
    assert len({row["id"] for row in rows}) == len(rows)


def test_strict_verdict_on_every_corpus_row_is_the_recorded_one():
    recorded = {
        row["id"]: row["verdicts"]["oncurve_strict"]
        for row in read_jsonl(RESULTS / "answer_checkers.jsonl")
    }
    strict = oncurve_checks()["strict"]
    rows = read_jsonl(CORPUS)
    assert set(recorded) == {row["id"] for row in rows}
    turned = [row["id"] for row in rows if strict(row) != recorded[row["id"]]]
    assert turned == []
