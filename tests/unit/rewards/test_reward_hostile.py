"""Hostile completions against every built-in reward: what a policy could learn to
exploit (a restated question, an empty structure), what could crash or hang a run (a number too
long to build, a tower of powers), and the correct answers a matcher must not refuse. Each row:
reward, prompt, completion, columns, expected score, time bound in seconds. The bounds are ten
times or more what a row takes on a loaded 2-core machine: they catch quadratic scans and
unbounded computations, not slowness.

`code_tests` is the sandbox's (tests/unit/rewards/test_code_reward.py)."""

from __future__ import annotations

import gc
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from oncurve.config import load_config
from oncurve.data.prompts import correctness_fn
from oncurve.data.tasks import get_task
from oncurve.loop.evaluate import evaluate
from oncurve.rewards import resolve_reward
from oncurve.rewards.math import has_math_verify
from oncurve.rewards.registry import ANSWER_MATCH_REWARDS, lenient_answer_match_reward
from oncurve.rewards.runner import RewardRunner
from oncurve.rollout import SamplingParams
from oncurve.run.rewards import build_rewards

KB128 = 128 * 1024
QUICK = 0.5  # seconds: a row that builds no big number and scans its text once
SYMBOLIC = 5.0  # a row math-verify compares (sympy: tens of milliseconds unloaded)
SUM = "What is 25 + 4? Put the final answer in \\boxed{}."
NUMBERS = {"numbers": "3, 7, 25", "target": "46"}


def row(
    reward: str,
    completion: str,
    expected: float,
    prompt: str = "p",
    bound: float = QUICK,
    ident: str | None = None,
    **columns: Any,
) -> Any:
    ident = ident or f"{reward}: {completion!r} ~ {columns.get('answer', '')!r}"
    columns = {key: [value] for key, value in columns.items()}
    return pytest.param(reward, prompt, completion, columns, expected, bound, id=ident)


# fmt: off
CASES = [
    # -- correct: a numeric reference is matched by a stated number, not by an expression
    row("correct", "\\boxed{25+4}", 0.0, SUM, answer="29"),
    row("correct", "\\boxed{48 + 48/2}", 0.0, answer="72"),
    row("correct", "\\boxed{\\dbinom{8}{4}}", 0.0, answer="70"),
    row("correct", "\\boxed{17^2-13^2}", 0.0, answer="120"),
    row("correct", "\\boxed{\\log_2 64}", 0.0, answer="6"),
    row("correct", "\\boxed{\\frac{144}{2}}", 0.0, answer="72"),
    row("correct", "\\boxed{2 \\times 36}", 0.0, answer="72"),
    row("correct", "\\boxed{6 \\cdot 12}", 0.0, answer="72"),
    row("correct", "\\boxed{3!}", 0.0, answer="6"),
    row("correct", "\\boxed{\\sqrt{5184}}", 0.0, answer="72"),
    row("correct", "<answer>70 + 2</answer>", 0.0, answer="72"),
    row("correct", "#### 8*9", 0.0, answer="72"),
    row("correct", "\\boxed{2^{10}}", 0.0, answer="1024"),
    row("correct", "\\boxed{72 or 73}", 0.0, answer="72"),
    row("correct", "<answer>72 apples and 5 pears</answer>", 0.0, answer="72"),
    row("correct", "\\boxed{}", 0.0, answer="0"),
    # ... and its neighbours, the stated numbers, still score 1
    row("correct", "\\boxed{29}", 1.0, SUM, answer="29"),
    row("correct", "\\boxed{\\frac{3}{4}}", 1.0, answer="0.75"),
    row("correct", "\\boxed{-\\frac{3}{4}}", 1.0, answer="-0.75"),
    row("correct", "\\boxed{0.75}", 1.0, answer="\\frac{3}{4}"),
    row("correct", "\\boxed{3/4}", 1.0, answer="0.75"),
    row("correct", "#### 1,000", 1.0, answer="1000"),
    row("correct", "\\boxed{1e3}", 1.0, answer="1000"),
    # -- correct: numbers too long to build, or that take minutes to build, score 0 at once
    row("correct", "1" * 4301, 0.0, answer="1", ident="4301-digit last number"),
    row("correct", "\\boxed{" + "1" * 4301 + "}", 0.0, answer="1", ident="4301-digit box"),
    row("correct", "#### " + "2" * 4301, 0.0, answer="2", ident="4301-digit gsm8k"),
    row("correct", "<answer>" + "3" * 5000 + "</answer>", 0.0, answer="3", ident="5000-digit tag"),
    row("correct", "\\boxed{1e999999999}", 0.0, answer="1"),
    row("correct", "\\boxed{1e-999999999}", 0.0, answer="0"),
    row("correct", "\\boxed{9^{9^{9^{9}}}}", 0.0, answer="5"),
    row("correct", "\\boxed{9!!!}", 0.0, answer="5"),
    # -- correct: a symbolic reference, compared by math-verify, but not to the prompt restated
    row("correct", "\\boxed{\\sqrt{12}}", 0.0, "Simplify $\\sqrt{12}$.", answer="2\\sqrt{3}"),
    row("correct", "\\boxed{(x+1)^2}", 0.0, "Expand $(x + 1)^2$.", answer="x^2+2x+1"),
    row("correct", "\\boxed{\\sqrt{12}}", 0.0, "Simplify $\\sqrt{12}$, as in \\boxed{5}.",
        answer="2\\sqrt{3}"),
    row("correct", "\\boxed{\\frac{6}{\\sqrt{3}}}", 0.0, "Simplify $\\dfrac{6}{\\sqrt 3}$.",
        answer="2\\sqrt{3}"),
    row("correct", "\\boxed{\\sqrt{12}\\cdot 1}", 0.0, "Simplify $\\sqrt{12}$.", answer="2\\sqrt{3}"),
    row("correct", "\\boxed{(\\sqrt{12})}", 0.0, "Simplify $\\sqrt{12}$.", answer="2\\sqrt{3}"),
    row("correct", "\\boxed{\\sqrt{2}+2}", 1.0, "Let $a = \\sqrt{2}$. Compute $a^2 + a$.",
        bound=SYMBOLIC, answer="2+\\sqrt{2}"),
    row("correct", "\\boxed{2\\sqrt{3}}", 1.0, "Simplify $\\sqrt{12}$.", answer="2\\sqrt{3}"),
    row("correct", "\\boxed{2\\sqrt3}", 1.0, "Is $\\sqrt{12}$ equal to $2\\sqrt3$ or $3\\sqrt2$?",
        bound=SYMBOLIC, answer="2\\sqrt{3}"),
    row("correct", "\\boxed{\\sqrt{3}\\cdot 2}", 1.0, "Simplify $\\sqrt{12}$.", bound=SYMBOLIC,
        answer="2\\sqrt{3}"),
    row("correct", "\\boxed{9^{9^{9^{9}}}}", 0.0, answer="\\frac{\\sqrt{2}}{2}"),
    row("correct", "\\boxed{9!!!}", 0.0, answer="\\frac{\\sqrt{2}}{2}"),
    row("correct", "\\boxed{\\binom{10^{9}}{10^{8}}}", 0.0, answer="\\frac{\\sqrt{2}}{2}"),
    # -- correct: common correct forms
    row("correct", "\\boxed{72 \\text{ apples}}", 1.0, answer="72"),
    row("correct", "<answer>72 apples</answer>", 1.0, answer="72"),
    row("correct", "#### 72 apples", 1.0, answer="72"),
    row("correct", "\\boxed{5 \\text{ hours}}", 1.0, answer="5"),
    row("correct", "\\boxed{72\\text{ cm}}", 1.0, answer="72"),
    row("correct", "\\boxed{12}", 1.0, answer="12\\text{ inches}"),
    row("correct", "\\boxed{12 \\text{ inches}}", 1.0, answer="12\\text{ inches}"),
    row("correct", "#### Step 1: add\n25 + 47 = 72\n#### Step 2: check\nSo 72.", 1.0, answer="72"),
    row("correct", "#### 72\n\n#### Step 2", 1.0, answer="72"),
    row("correct", "#### **72**", 1.0, answer="72"),
    row("correct", "<answer>**72**</answer>", 1.0, answer="72"),
    row("correct", "**Answer:** \\boxed{72}", 1.0, answer="72"),
    row("correct", "\\boxed{\\approx 72}", 1.0, answer="72"),
    row("correct", "<answer>≈ 72</answer>", 1.0, answer="72"),
    row("correct", "\\boxed{\\dfrac{3}{4}}", 1.0, answer="0.75"),
    row("correct", "\\boxed{0.75}", 1.0, answer="\\dfrac{3}{4}"),
    row("correct", "\\boxed{1{,}000}", 1.0, answer="1000"),
    row("correct", "\\boxed{1\\,000}", 1.0, answer="1000"),
    row("correct", "\\boxed{\\$18.90}", 1.0, answer="18.9"),
    row("correct", "\\boxed{-\\$5}", 1.0, answer="-5"),
    row("correct", "<answer>-5 degrees</answer>", 1.0, answer="-5"),
    row("correct", "\\boxed{50\\%}", 1.0, "What percent are red?", answer="50"),
    row("correct", "\\boxed{50\\%}", 0.0, answer="50"),  # 50% is 0.5 where no percent is asked
    row("correct", "\\boxed{x = -3}", 1.0, answer="-3"),
    row("correct", "\\boxed{60 km/h}", 1.0, answer="60"),
    # -- the arith task's own correctness check: integers only, bounded
    row("arith.correct", "<answer>" + "1" * 4301 + "</answer>", 0.0, answer="1",
        ident="arith 4301 digits"),
    row("arith.correct", "<answer>0485+0037</answer>", 0.0, answer="522"),
    row("arith.correct", "<answer>522</answer>", 1.0, answer="522"),
    # -- format rewards pay for content, not for empty structure
    row("format", "<think></think><answer></answer>", 0.0),
    row("format", "<think>work</think><answer> </answer>", 0.0),
    row("format", "<think> </think><answer>4</answer>", 0.0),
    row("format", "<think>a</think><answer>1</answer><answer>2</answer>", 0.0),
    row("format", "<think>a</think>b</think><answer>1</answer>", 0.0),
    row("format", "<think>work</think>\n<answer>4</answer>\n", 1.0),
    row("tags_format", "<answer></answer>", 0.0),
    row("tags_format", "<answer> \n </answer>", 0.0),
    row("tags_format", "<answer>4</answer>", 1.0),
    # ... in the answer region `correct` reads: after the reasoning, outside fenced programs
    row("tags_format", "<think>Let me check <answer>4</answer> hmm</think>The answer is 5.", 0.0),
    row("tags_format", "<think>a</think>```python\nprint('<answer>4</answer>')\n```\nSo 4.", 0.0),
    row("tags_format", "<think>hmm</think><answer>4</answer>", 1.0),
    row("tags_format", "<think>so <answer>4</answer></think>", 1.0),  # nothing after it
    row("boxed_format", "\\boxed{ }", 0.0),
    row("boxed_format", "\\boxed{}", 0.0),
    row("boxed_format", "\\boxed{\\boxed{}}", 0.0),
    row("boxed_format", "\\boxed{unbalanced", 0.0),
    row("boxed_format", "\\boxed{\\frac{1}{2}}", 1.0),
    row("boxed_format", "\\boxed{x^{2}}", 1.0),
    row("boxed_format", "so \\boxed{72}.", 1.0),
    row("boxed_format", "<think>\\boxed{4}</think>The answer is 5.", 0.0),
    row("boxed_format", "<think>so \\boxed{4}</think>", 1.0),
    # -- countdown (held before: guards)
    row("countdown", "<answer>25 + 7*3</answer>", 1.0, **NUMBERS),
    # the notations an answer is written in: a box inside the tags, math delimiters, a period
    row("countdown", "<answer>\\boxed{25 + 7*3}</answer>", 1.0, **NUMBERS),
    row("countdown", "<answer>$25 + 7 \\times 3$</answer>", 1.0, **NUMBERS),
    row("countdown", "<answer>\\(25 + 7 \\times 3\\)</answer>", 1.0, **NUMBERS),
    row("countdown", "<answer>25 + 7*3 = 46.</answer>", 1.0, **NUMBERS),
    row("countdown", "<answer>25 + 7*3 = 47.</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>\\boxed{25 + 21}</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>25 + 21</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>25 + 7*3 + 3 - 3</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>__import__('os').system('true')</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>(lambda: 46)()</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>25**7**3</answer>", 0.0, **NUMBERS),
    row("countdown", "<answer>25/(7-7)+3</answer>", 0.0, **NUMBERS),
    # the answer after the reasoning, as `correct` reads it; the reasoning's only when nothing
    # follows it
    row("countdown", "<think>Try <answer>3*7+25</answer>.</think>So \\boxed{25+7-3}.", 0.0,
        **NUMBERS),
    row("countdown", "<think>Try <answer>25+7-3</answer>.</think>So \\boxed{3*7+25}.", 1.0,
        **NUMBERS),
    row("countdown", "<think><answer>3*7+25</answer></think>I am not sure.", 0.0, **NUMBERS),
    row("countdown", "<think>So <answer>3*7+25</answer></think>", 1.0, **NUMBERS),
    row("countdown", "<think>So \\boxed{3*7+25}</think>\n", 1.0, **NUMBERS),
    # -- length shaping: a huge completion is clipped, not an error
    row("overlong", "x" * KB128, -1.0, ident="overlong 128 KB"),
    row("length", "x" * KB128, -1.0, ident="length 128 KB"),
    row("env", "x" * KB128, 1.0, episode_reward=1.0, ident="env 128 KB"),
]
# fmt: on

# 128 KB shapes that made the extractors rescan the rest of the text from each candidate
# (quadratic: seconds at 32 KB), scored by every reward that reads an answer or a structure.
SHAPES: dict[str, Callable[[], str]] = {
    "unclosed <answer>": lambda: "<answer>" * (KB128 // 8),
    "nested \\boxed{": lambda: "\\boxed{" * (KB128 // 7),
    "closed nest": lambda: "\\boxed{" * (KB128 // 16) + "}" * (KB128 // 16),
    "boxes without argument": lambda: "\\boxed $" * (KB128 // 8),
    "#### headings": lambda: "#### Step 2\n" * (KB128 // 12),
    "digits then a letter": lambda: "1" * KB128 + "a",
    "thousands groups": lambda: "1,000" * (KB128 // 5),
    "open braces": lambda: "{" * KB128,
    "tags repeated": lambda: "<think></think><answer>" * (KB128 // 23),
}
# Between two boxes, after a stated or a last number: where `correct` looks for a hedge or a
# denial (its answer, 72, is in none of them).
ANSWER_SHAPES: dict[str, Callable[[], str]] = {
    "spaces after a box": lambda: "\\boxed{7}" + " " * KB128 + "x",
    "boxes side by side": lambda: "\\boxed{7}$ $" * (KB128 // 12),
    "spaces after a number": lambda: "7 " + " " * KB128 + "x",
    "a stated number, then dollars": lambda: "The answer is 7" + " $" * (KB128 // 2),
    "negations": lambda: "It is not " * (KB128 // 10) + "7",
    # a run of whitespace where a statement's patterns allow space at several places in a row
    # (`answer\s*(?:is|:)\s*(?:\*\*)?\s*`): each split of the run was tried
    "spaces after 'answer:'": lambda: "answer:" + " \n" * (KB128 // 2) + "x",
    "spaces after 'The answer is'": lambda: "The answer is" + "\t" * KB128 + "$",
    "spaces after a stated number": lambda: "The answer is 7" + " " * KB128 + "8 apples",
    "spaces after stated math": lambda: "The answer is $\\frac{1}{2}$" + " " * KB128 + "x",
    "spaces after tags": lambda: "<answer>7</answer>The answer is" + " " * KB128 + "x",
}
COLUMNS = {"correct": {"answer": ["72"]}, "countdown": {k: [v] for k, v in NUMBERS.items()}}
CASES += [
    pytest.param(
        name, SUM, shape, COLUMNS.get(name, {}), 0.0, QUICK, id=f"{name}: {label} (128 KB)"
    )
    for name in ("correct", "format", "tags_format", "boxed_format", "countdown")
    for label, shape in SHAPES.items()
]
CASES += [
    pytest.param("correct", SUM, shape, COLUMNS["correct"], 0.0, QUICK, id=f"correct: {label}")
    for label, shape in ANSWER_SHAPES.items()
]


def reward_fn(name: str) -> Callable[..., list[float | None]]:
    if name.startswith("arith."):
        return get_task("arith").reward_fns()[name.partition(".")[2]]
    return resolve_reward(name)[1]


@pytest.fixture(scope="module", autouse=True)
def _math_verify_imported() -> None:
    # sympy's import (~0.6 s) is paid once per worker process, not by the first row
    if has_math_verify():
        reward_fn("correct")(["p"], ["\\boxed{\\sqrt{2}}"], answer=["\\sqrt{2}"])


@pytest.mark.parametrize(("name", "prompt", "completion", "columns", "expected", "bound"), CASES)
def test_hostile_completion(
    name: str, prompt: Any, completion: Any, columns: dict, expected: float, bound: float
) -> None:
    """The reward scores the completion as the trainer calls it, within the bound (timed after
    a first call on a short completion: a process's first call compiles patterns and imports,
    once a run, which is no scan of the completion)."""
    if callable(completion):
        completion = completion()
    reward_fn(name)([prompt], ["0"], **columns)
    start = time.perf_counter()
    scores = reward_fn(name)([prompt], [completion], **columns)
    elapsed = time.perf_counter() - start
    assert scores == [expected]
    assert elapsed < bound


@pytest.mark.skipif(not has_math_verify(), reason="math-verify (extra `math`) not installed")
def test_lenient_matching_pays_for_expressions_as_before() -> None:
    assert lenient_answer_match_reward([SUM], ["\\boxed{25+4}"], answer=["29"]) == [1.0]
    assert lenient_answer_match_reward(["p"], ["\\boxed{\\frac{144}{2}}"], answer=["72"]) == [1.0]
    # an exact zero math-verify leaves unevaluated (`\sin(\pi)`) is still zero
    assert lenient_answer_match_reward(["p"], ["\\boxed{\\sin(\\pi)}"], answer=["0"]) == [1.0]
    # the bounds hold in both modes
    assert lenient_answer_match_reward(["p"], ["\\boxed{9^{9^{9^{9}}}}"], answer=["5"]) == [0.0]
    assert lenient_answer_match_reward(["p"], ["\\boxed{1e999999999}"], answer=["1"]) == [0.0]
    # a list of numbers is not the one number asked for, however its digits read together
    assert lenient_answer_match_reward(["p"], ["\\boxed{32, 349}"], answer=["32349"]) == [0.0]
    assert lenient_answer_match_reward(["p"], ["\\boxed{1, 000}"], answer=["1000"]) == [0.0]
    assert lenient_answer_match_reward(["p"], ["\\boxed{32,349}"], answer=["32349"]) == [1.0]


def test_reward_answer_match_picks_the_correct_reward_for_training_and_evaluation() -> None:
    base = ["data.path=d.jsonl", "reward.functions=[correct]"]
    for mode, expected in (("strict", 0.0), ("lenient", 1.0)):
        config = load_config(None, [*base, f"reward.answer_match={mode}"])
        runner = build_rewards(config, task=None)
        result = runner.score([SUM], ["\\boxed{25+4}"], {"answer": ["29"]})
        assert result.per_fn[0, 0].item() == expected
        assert correctness_fn(config, None) is runner.fns[0][1]
        assert runner.fns[0][1] in ANSWER_MATCH_REWARDS  # read as `correct` by the data checks
        assert runner.verifier == "correct"
        runner.close()


def called_rowwise(log: Path) -> Callable[..., list[float]]:
    """A row-wise reward that appends each text it scores to `log` and hangs on "hang"."""

    def fn(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        with log.open("a") as out:
            out.write("".join(f"{c}\n" for c in completions))
        if "hang" in completions:
            time.sleep(60)
        if "slow" in completions:
            time.sleep(0.3)
        if "gave up" in completions:
            raise TimeoutError("verifier past its bound")
        return [1.0] * len(completions)

    fn.rowwise = True  # type: ignore[attr-defined]
    return fn


def test_a_hung_row_costs_its_own_timeout_once(tmp_path: Path) -> None:
    """A row-wise reward is called one row at a time: a hung row is stopped after its own
    timeout, once, instead of the whole batch's call timing out and the row hanging again."""
    log = tmp_path / "calls"
    fn = called_rowwise(log)
    with RewardRunner([("rows", fn, 1.0)], timeout_s=0.5, timeout_score=-1.0) as runner:
        result = runner.score(["p"] * 4, ["a", "hang", "slow", "gave up"], {})
    assert log.read_text().splitlines() == ["a", "hang", "slow", "gave up"]
    assert result.per_fn[:, 0].tolist() == [1.0, -1.0, 1.0, -1.0]
    # the hung row (stopped by the runner) and the row that gave up (TimeoutError) count
    assert result.metrics["reward/timeouts"] == 2.0
    assert result.metrics["reward/errors"] == 0.0
    assert 0.5 <= result.metrics["reward/slowest_row_s"] < 5.0


def test_slowest_row_is_logged_in_process() -> None:
    fn = called_rowwise(Path(os.devnull))
    result = RewardRunner([("rows", fn, 1.0)], timeout_s=None).score(["p"] * 2, ["a", "slow"], {})
    assert 0.3 <= result.metrics["reward/slowest_row_s"] < 5.0
    assert result.metrics["reward/timeouts"] == 0.0


def test_correct_in_the_runner_scores_the_hostile_batch_quickly() -> None:
    """The issue's batch as the trainer scores it: every row scored, none timed out."""
    completions = ["\\boxed{1e999999999}", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{9!!!}", "1" * 4301]
    completions += ["\\boxed{72}", "\\boxed{25+4}"]
    answers = ["1", "5", "5", "1", "72", "29"]
    fn = reward_fn("correct")
    with RewardRunner([("correct", fn, 1.0)], timeout_s=10.0) as runner:
        start = time.perf_counter()
        result = runner.score([SUM] * 6, completions, {"answer": answers})
        elapsed = time.perf_counter() - start
    assert result.per_fn[:, 0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert result.metrics["reward/timeouts"] == 0.0
    assert elapsed < 8.0  # a fork and sympy's import; the rows themselves take milliseconds


def test_evaluation_scores_under_the_training_timeout_and_error_policy(tmp_path, monkeypatch):
    """`evaluate` stops a hung row after `timeout_s` and scores it `timeout_score`; a row that
    raises is wrong under on_error="none" instead of ending the evaluation."""
    texts = ["a", "hang", "boom"]
    monkeypatch.setattr(
        "oncurve.loop.evaluate.draw",
        lambda *args: (
            SimpleNamespace(
                texts=texts,
                completion_token_lists=lambda: [[1]] * len(texts),
                completion_lengths=torch.ones(len(texts), dtype=torch.long),
            ),
            {},
        ),
    )
    hanging = called_rowwise(tmp_path / "calls")

    def correct(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        if completions == ["boom"]:
            raise ValueError("bad row")
        return hanging(prompts, completions)

    correct.rowwise = True  # type: ignore[attr-defined]
    rows = [{"prompt": "p", "prompt_ids": [1], "answer": "1"} for _ in texts]
    records: list[dict] = []
    kwargs = {"records": records, "timeout_s": 0.5, "on_error": "none"}
    result = evaluate(None, rows, correct, SamplingParams(4), timeout_score=1.0, **kwargs)
    assert [r["greedy_correct"] for r in records] == [1.0, 1.0, 0.0]
    assert result == {"accuracy": pytest.approx(2 / 3)}


def test_a_text_of_many_boxes_or_tags_sets_off_no_garbage_collection() -> None:
    """Scoring a text of thousands of boxes or tags keeps offsets, not an object per box the
    collector tracks: such objects set off collections of every generation, a full one costing
    as long as the process's heap is large (a trainer's: seconds under load)."""
    names = ("correct", "format", "tags_format", "boxed_format", "countdown")
    for name in names:
        reward_fn(name)([SUM], ["0"], **COLUMNS.get(name, {}))
    generations: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.collect()  # once: what the calls below allocate and keep is too little to set it off
    gc.callbacks.append(count)
    try:
        for name, (label, shape) in itertools.product(names, SHAPES.items()):
            generations.clear()
            reward_fn(name)([SUM], [shape()], **COLUMNS.get(name, {}))
            assert 2 not in generations and generations.count(0) <= 2, (name, label, generations)
    finally:
        gc.callbacks.remove(count)
