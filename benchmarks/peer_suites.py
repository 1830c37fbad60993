"""oncurve's answer checker against peers' own test suites: math-verify's, TRL's and verl's.

Attribution: the cases in `data/math_verify_cases.jsonl` are the parametrized cases of
tests/test_all.py of huggingface/Math-Verify (https://github.com/huggingface/Math-Verify),
commit 5d148cfaaf99214c2e4ffb4bc497ab042c592a7a (version 0.8.0); that file carries the MIT
licence, Copyright (c) 2024 The HuggingFace Team (the repository as a whole is under the
Apache License 2.0, its LICENCE file). The data file holds the cases' strings and expectations
only, as data; none of math-verify's code is copied here. The file's one unparametrized
compare (in `test_precision`) and its commented-out cases are left out; its repeated cases are
kept, as its suite runs them.

The cases in `data/trl_cases.jsonl` are those of the `accuracy_reward` tests (class
TestAccuracyReward) of tests/test_rewards.py of huggingface/trl (https://github.com/huggingface/trl),
commit f2cd57710ae345ea6428ae95363267fcf38a3dc8 (the file last changed in 30558f512cfe), under the
Apache License 2.0 (its LICENSE file), Copyright The HuggingFace Team; hand-extracted, each
completion's content as the prediction and its solution as the gold, exactly as the tests write
them. Left out: `test_accuracy_reward_unparsable_gold`, whose expectation is `None` (no reward,
the gold unparsable), not 0 or 1, and the `reasoning_accuracy_reward` tests (another function,
which strips a reasoning block first).

The cases in `data/verl_cases.jsonl` are those of `test_prime_math` in
tests/utils/reward_score/test_sandbox_on_cpu.py of volcengine/verl
(https://github.com/volcengine/verl), commit b178a3cd56f58b2d502255daba591e92833930a7 (the file
last changed in 77814f1d8368), under the Apache License 2.0 (its LICENSE file; the file's header:
Copyright 2024 PRIME team and/or its affiliates): `prime_math_answers` against `prime_math_gts`,
each scored 1.0 by `default_compute_score("numina_aops_forum", ...)`, i.e. prime_math. verl's
tests hold no other string cases of its math scorers (math_verify, math_dapo, math_reward): its
tests/experimental/reward_loop/test_math_verify.py scores a model's rollouts, and its gsm8k
interaction tests mock `compute_score`. Hand-extracted, exactly as the test writes them.

What it measures: for each case (a gold, a prediction and math-verify's expectation, 1 when its
tests require the pair to verify, 0 when they require it not to), whether oncurve's `correct`
reward pays the prediction, strict and lenient (`reward.answer_match`), called as
`oncurve.rewards.registry._answer_scores` calls it: `answers_match(extract_answer(prediction),
usable_gold(gold), prompt=None, strict=...)`. The gold is given as math-verify's tests give it:
surrounding `$` stripped, and a whole solution (over SHORT_GOLD_CHARS, or with a `\\boxed{}`)
reduced to its answer by `extract_answer(gold, "boxed") or extract_answer(gold)`. A
TimeoutError from the symbolic comparison counts as unpaid. math-verify's tests pass it
options (`match_types`, `precision`, `allow_set_relation_comp`), kept in each case's
`options`; oncurve has no such knobs, so they are recorded, not applied.

It counts the cases, the agreements of strict and lenient with math-verify's expectation, and
lists every disagreement with a hand-made classification (WHY, keyed by `test#index`, the
case's position in its parametrize list, or in the
test's own lists): oncurve's conventions that differ by design, the
notations oncurve does not read, and "to fix" (a right answer oncurve should pay and does not,
or a wrong one it pays). A disagreement without a classification is listed as "unclassified".

    .venv/bin/python benchmarks/peer_suites.py            # score, print, write results/
    .venv/bin/python benchmarks/peer_suites.py --extract  # rebuild math-verify's data file first

It needs no network and no peer package to score: the expectations are in the data file
(oncurve's lenient matching and its symbolic comparisons use math-verify, oncurve's `math`
extra, as the trainer does). `--extract` parses tests/test_all.py out of a local git mirror of
math-verify (`--mirror`, a bare git directory) with `ast`, never importing or running it.
Writes `results/peer_suites.md`.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import math
import platform
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS, ROOT
from harness.tables import publish

DATA = BENCHMARKS / "data" / "math_verify_cases.jsonl"
TRL_DATA = BENCHMARKS / "data" / "trl_cases.jsonl"
VERL_DATA = BENCHMARKS / "data" / "verl_cases.jsonl"
SUITE = "math-verify tests/test_all.py"
TRL_SUITE = "TRL tests/test_rewards.py"
VERL_SUITE = "verl tests/utils/reward_score/test_sandbox_on_cpu.py"
MIRROR = Path("/work/.mirror/huggingface+Math-Verify/repo")
TEST_FILE = "tests/test_all.py"
SHORT_GOLD_CHARS = 200  # a gold longer than this is a whole solution, not an answer
PRED_CHARS = 80  # a prediction is shortened to this in the table

# compare_strings' defaults in math-verify's tests: an option equal to its default is not kept.
_DEFAULT_OPTIONS: dict[str, Any] = {
    "match_types": ["latex", "expr"],
    "precision": 6,
    "strict": True,
    "allow_set_relation_comp": False,
}

STRICT_FORM = "by design: strict refuses an unsimplified/restated/approximate answer"
RELATION = "by design: a relation or inequality is not its value"
LAST_ANSWER = "by design: the last number/statement is the answer"
EUROPEAN = "European decimal comma / space thousands"
NOTATION = "matrix/set/interval notation"
TO_FIX = "to fix"
CLASSES = (STRICT_FORM, RELATION, LAST_ANSWER, EUROPEAN, NOTATION, TO_FIX)

# Each disagreement, classified by hand from its gold, prediction and extraction: (class, note).
_ASCII_RELATION = "extraction cuts ASCII `<=`/`>=`/`!=` at its `=`; strict pays the whole relation"
_EQUATION = "extraction keeps the equation's right side only; strict pays the whole equation"
_SENTENCE = (
    "`_LAST_SENTENCE_RE` matches from the tail's start when it has no line break, so the "
    "'last sentence' is the whole tail and an earlier `$...$` wins over the stated number"
)
_SENTENCE_MATH = "the last sentence states the number after a `$name$`; extraction takes the name"
WHY: dict[str, tuple[str, str]] = {
    "test_number_extraction#2": (EUROPEAN, "`1 000`: extraction takes `000`"),
    "test_number_extraction#5": (EUROPEAN, "`1000,99`: extraction takes `99`"),
    "test_number_extraction#6": (EUROPEAN, "gold `1,22` is a decimal comma"),
    "test_number_extraction#7": (EUROPEAN, "`2,74`: extraction takes `74`"),
    "test_number_extraction#17": (EUROPEAN, "gold `0,111` is a decimal comma"),
    "test_latex_notation#4": (
        STRICT_FORM,
        "`9+1` is no answer for 10; also `\\( \\)` is read as text, so `1` is extracted",
    ),
    "test_latex_notation#5": (
        LAST_ANSWER,
        "math-verify's own rule (inline math must not span lines); the answer stated is 9",
    ),
    "test_latex_notation#6": (
        LAST_ANSWER,
        "math-verify's own rule (inline math must not span lines); the answer stated is 9",
    ),
    "test_latex_notation#11": (STRICT_FORM, "`\\frac3{3}` is unreduced; lenient pays"),
    "test_latex_notation_math#25": (
        TO_FIX,
        "a gold `$125$ miles` (inline math, then a unit) matches nothing; `125 miles` matches",
    ),
    "test_relations_math#2": (TO_FIX, _ASCII_RELATION),
    "test_relations_math#7": (TO_FIX, _ASCII_RELATION),
    "test_relations_math#15": (
        TO_FIX,
        "`x\\approx11`: extraction keeps the side before `\\approx`, the name `x`; and strict "
        "refuses `x \\approx 11` whole, though it pays `x = 11` and `\\approx 11`",
    ),
    "test_relations_math#19": (TO_FIX, _ASCII_RELATION),
    "test_relations_math#26": (
        LAST_ANSWER,
        "math-verify reads the gold chain `z = 1 + 1 = 2` as its last side; the prediction's "
        "own step 3+3 = 2 is false",
    ),
    "test_relations_math#27": (
        LAST_ANSWER,
        "math-verify reads the gold chain `z = 1 + 1 = 2` as its last side; the prediction's "
        "own step 3+3 = 2 is false",
    ),
    "test_relations_math#28": (
        STRICT_FORM,
        "the line restated, solved for y; lenient's symbolic check does not pay it either",
    ),
    "test_relations_math#29": (TO_FIX, _EQUATION),
    "test_complex_math_expressions#0": (STRICT_FORM, "a 16-digit decimal for 1/12"),
    "test_complex_math_expressions#1": (
        TO_FIX,
        "4.5 is exactly 9/2 and strict pays `4.5` for `\\frac{9}{2}` alone, not in a tuple",
    ),
    "test_complex_math_expressions#5": (STRICT_FORM, "a root written as a power; lenient pays"),
    "test_complex_math_expressions#6": (TO_FIX, _EQUATION),
    "test_complex_math_expressions#7": (STRICT_FORM, "0.33 for 1/3 (the test's precision 2)"),
    "test_complex_math_expressions#13": (STRICT_FORM, "2.6667 for 8/3 (the test's precision 2)"),
    "test_math_extraction_edge_cases#1": (TO_FIX, _SENTENCE),
    "test_math_extraction_edge_cases#11": (
        STRICT_FORM,
        "`10\\sqrt{10.5}` is 5√42 unsimplified; lenient pays",
    ),
    "test_math_extraction_additional_cases#1": (TO_FIX, _SENTENCE),
    "test_math_extraction_additional_cases#2": (
        TO_FIX,
        _SENTENCE + "; the last sentence itself names `$f(x)$` before 'is 19'",
    ),
    "test_math_extraction_additional_cases#4": (TO_FIX, _SENTENCE_MATH),
    "test_math_extraction_additional_cases#8": (
        TO_FIX,
        "the display math before the last sentence is taken, not the 100% that sentence "
        "states: the tail has no line break (see `_LAST_SENTENCE_RE` above), and `.$$ ` ends "
        "no sentence either",
    ),
    "test_math_extraction_additional_cases#17": (
        TO_FIX,
        "an intermediate `\\boxed{255}`, then 'The final answer is $10,455$': the box wins "
        "(oncurve's order: boxed before a stated answer); a later stated answer should",
    ),
    "test_math_extraction_additional_cases#19": (
        TO_FIX,
        "'The final answer is \\((-6, 10)\\)': a stated answer in `\\( \\)` is not read; "
        "the last number `10` is taken",
    ),
    "test_math_extraction_additional_cases#24": (
        TO_FIX,
        "lenient reads the list `32, 349` as 32,349 (strict does not)",
    ),
    "test_math_extraction_additional_cases#27": (
        LAST_ANSWER,
        "the gold boxes 1 and 2 apart; oncurve's reference is its last box, 2",
    ),
    "test_math_extraction_additional_cases#28": (
        LAST_ANSWER,
        "the roots boxed apart, `\\boxed{-2} and \\boxed{1}`: oncurve takes the last box",
    ),
    "test_set_rel_assymetry#2": (
        NOTATION,
        "an interval gold, an inequality answer (written with `\\\\le`, as the test has it)",
    ),
    "test_float_precision#0": (
        STRICT_FORM,
        "the gold is √17 rounded to 15 places: equal only under math-verify's rounding",
    ),
}


# verl's prime_math cases: each prediction is a bare expression, the whole completion, with no
# box and no "answer is"; prime_math then takes the whole string as the answer.
_BARE = (
    "the completion is one bare expression; `extract_answer` takes its last number, not the "
    "expression"
)
WHY_VERL: dict[str, tuple[str, str]] = {
    "test_prime_math#0": (
        TO_FIX,
        _BARE + "; given whole, strict and lenient pay the bmatrix for the pmatrix",
    ),
    "test_prime_math#1": (TO_FIX, _BARE + "; given whole, strict and lenient pay it"),
    "test_prime_math#2": (
        TO_FIX,
        _BARE + "; given whole, lenient pays the expanded form and strict refuses it (by "
        "design: an unsimplified/restated answer)",
    ),
}
WHY_TRL: dict[str, tuple[str, str]] = {}

# Each suite: (name, data file, source line for the results, classifications).
SUITES: tuple[tuple[str, Path, str, dict[str, tuple[str, str]]], ...] = (
    (
        SUITE,
        DATA,
        "huggingface/Math-Verify tests/test_all.py (MIT, Copyright (c) 2024 The HuggingFace "
        "Team), commit 5d148cfaaf99, `data/math_verify_cases.jsonl`",
        WHY,
    ),
    (
        TRL_SUITE,
        TRL_DATA,
        "huggingface/trl tests/test_rewards.py, the `accuracy_reward` tests (Apache-2.0, "
        "Copyright The HuggingFace Team), commit f2cd57710ae3, `data/trl_cases.jsonl`; "
        "`test_accuracy_reward_unparsable_gold` (expects `None`) and the "
        "`reasoning_accuracy_reward` tests left out",
        WHY_TRL,
    ),
    (
        VERL_SUITE,
        VERL_DATA,
        "volcengine/verl tests/utils/reward_score/test_sandbox_on_cpu.py, `test_prime_math` "
        "(Apache-2.0, Copyright 2024 PRIME team and/or its affiliates), commit b178a3cd56f5, "
        "`data/verl_cases.jsonl`",
        WHY_VERL,
    ),
)


# --- extraction of the cases (--extract) -----------------------------------------------------


def _git(mirror: Path, *args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", *args], check=True, capture_output=True, text=True
    ).stdout


def _value(node: ast.expr) -> Any:
    """A parametrize entry's value: a literal, or an f-string of literals and `math.f(const)`
    calls (the one test that builds its gold as `f"{math.sqrt(17):.15f}"`)."""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
                continue
            assert isinstance(part, ast.FormattedValue)
            call = part.value
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == "math"
                and not call.keywords
            ):
                raise ValueError(f"line {node.lineno}: unsupported f-string value")
            value = getattr(math, call.func.attr)(*(ast.literal_eval(a) for a in call.args))
            spec = "".join(str(s.value) for s in getattr(part.format_spec, "values", []))
            parts.append(format(value, spec))
        return "".join(parts)
    return ast.literal_eval(node)


def _compare_options(func: ast.FunctionDef, row: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the test passes to its compare helper that are not the helper's
    defaults, a test parameter resolved to its value in `row`."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_strings":
            options = {}
            for keyword in node.keywords:
                if isinstance(keyword.value, ast.Name):
                    value = row[keyword.value.id]
                else:
                    value = ast.literal_eval(keyword.value)
                if keyword.arg and _DEFAULT_OPTIONS.get(keyword.arg) != value:
                    options[keyword.arg] = value
            return options
    return {}


def extract_cases(source: str) -> list[dict[str, Any]]:
    """Every case of every `pytest.mark.parametrize` test in `source` whose parameters include
    gold, pred and expected, in file order."""
    cases = []
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for decorator in func.decorator_list:
            if not (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "parametrize"
            ):
                continue
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            if not {"gold", "pred", "expected"} <= set(names):
                continue
            entries = decorator.args[1]
            assert isinstance(entries, ast.List)
            for index, entry in enumerate(entries.elts):
                assert isinstance(entry, ast.Tuple)
                row = dict(zip(names, (_value(e) for e in entry.elts), strict=True))
                case = {
                    "suite": SUITE,
                    "test": func.name,
                    "index": index,
                    "gold": row["gold"],
                    "prediction": row["pred"],
                    "expected": int(row["expected"]),
                }
                options = _compare_options(func, row)
                if options:
                    case["options"] = options
                cases.append(case)
    return cases


def write_cases(mirror: Path) -> None:
    commit = _git(mirror, "rev-parse", "HEAD").strip()
    cases = extract_cases(_git(mirror, "show", f"{commit}:{TEST_FILE}"))
    DATA.parent.mkdir(parents=True, exist_ok=True)
    with DATA.open("w") as out:
        for case in cases:
            out.write(json.dumps(case, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases from {TEST_FILE} at {commit} -> {DATA.relative_to(ROOT)}")


# --- scoring ---------------------------------------------------------------------------------


def reference(gold: str) -> str:
    """The gold as oncurve's reward would be given it: `$` stripped, and a whole solution
    reduced to its boxed (or else its extracted) answer."""
    text = gold.strip()
    while len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    if len(text) > SHORT_GOLD_CHARS or "\\boxed" in text:
        from oncurve.rewards.extraction import extract_answer

        text = extract_answer(text, "boxed") or extract_answer(text) or text
    return text


TIMEOUTS: Counter[str] = Counter()  # comparisons that raised TimeoutError, by matching


def _paid(extracted: str | None, gold: str | None, strict: bool) -> bool:
    from oncurve.rewards.matching import answers_match

    if gold is None:
        return False
    try:
        return answers_match(extracted, gold, prompt=None, strict=strict)
    except TimeoutError:
        TIMEOUTS["strict" if strict else "lenient"] += 1
        return False


def score(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.matching import usable_gold

    rows = []
    for case in cases:
        gold = usable_gold(reference(case["gold"]))
        extracted = extract_answer(case["prediction"])
        strict = _paid(extracted, gold, strict=True)
        lenient = _paid(extracted, gold, strict=False)
        rows.append(
            {
                **case,
                "key": f"{case['test']}#{case['index']}",
                "reference": gold,
                "extracted": extracted,
                "strict": int(strict),
                "lenient": int(lenient),
            }
        )
    return rows


# --- report ----------------------------------------------------------------------------------


def _cell(text: object, limit: int | None = None) -> str:
    text = "" if text is None else str(text)
    text = re.sub(r"\s*\n\s*", "\\\\n", text.strip())  # a line break shown as `\n`
    text = " ".join(text.split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`" if text else ""


def _why(row: dict[str, Any], why: dict[str, tuple[str, str]]) -> tuple[str, str]:
    return why.get(row["key"], ("unclassified", ""))


def report(
    rows: list[dict[str, Any]],
    suite: str = SUITE,
    source: str = SUITES[0][2],
    why: dict[str, tuple[str, str]] = WHY,
) -> tuple[str, Counter[str]]:
    n = len(rows)
    agree_strict = sum(r["strict"] == r["expected"] for r in rows)
    agree_lenient = sum(r["lenient"] == r["expected"] for r in rows)
    wrong = [r for r in rows if r["strict"] != r["expected"] or r["lenient"] != r["expected"]]
    classes = Counter(_why(r, why)[0] for r in wrong)
    expected_1 = sum(r["expected"] for r in rows)
    lines = [
        f"## {suite}",
        "",
        f"{datetime.date.today().isoformat()}, `.venv/bin/python benchmarks/peer_suites.py`, "
        f"Python {platform.python_version()}. Cases: {source}.",
        "",
        "| | cases | agree strict | agree lenient |",
        "|---|---|---|---|",
        f"| all | {n} | {agree_strict} | {agree_lenient} |",
    ]
    for expected, label in ((1, "expected 1 (must verify)"), (0, "expected 0 (must not)")):
        part = [r for r in rows if r["expected"] == expected]
        lines.append(
            f"| {label} | {len(part)} | {sum(r['strict'] == expected for r in part)} | "
            f"{sum(r['lenient'] == expected for r in part)} |"
        )
    if not wrong:
        lines += [
            "",
            f"{expected_1} cases expect a match and {n - expected_1} expect none. "
            "No case disagrees under strict or lenient.",
        ]
        return "\n".join(lines) + "\n", classes
    lines += [
        "",
        f"{expected_1} cases expect a match and {n - expected_1} expect none. "
        f"{len(wrong)} cases disagree under strict or lenient; by class "
        f"(timeouts, counted unpaid: strict {TIMEOUTS['strict']}, "
        f"lenient {TIMEOUTS['lenient']}):",
        "",
        "| why | cases |",
        "|---|---|",
    ]
    for name in (*CLASSES, "unclassified"):
        if classes[name]:
            lines.append(f"| {name} | {classes[name]} |")
    lines += [
        "",
        "Every disagreement (extracted: what `extract_answer` took from the prediction; "
        "reference: the gold given to `answers_match`):",
        "",
        "| test | gold | reference | prediction | extracted | expected | strict | lenient "
        "| why | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in wrong:
        name, note = _why(r, why)
        note = note.replace("|", "\\|")
        lines.append(
            f"| {r['key']} | {_cell(r['gold'], PRED_CHARS)} | {_cell(r['reference'])} | "
            f"{_cell(r['prediction'], PRED_CHARS)} | {_cell(r['extracted'], PRED_CHARS)} | "
            f"{r['expected']} | {r['strict']} | {r['lenient']} | {name} | {note} |"
        )
    return "\n".join(lines) + "\n", classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extract", action="store_true", help="rebuild math-verify's data file")
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="math-verify's git dir")
    args = parser.parse_args()
    if args.extract:
        write_cases(args.mirror)
    sections = []
    for suite, data, source, why in SUITES:
        TIMEOUTS.clear()
        cases = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
        rows = score(cases)
        text, classes = report(rows, suite, source, why)
        sections.append(text)
        n = len(rows)
        print(f"## {suite}")
        print(f"cases {n}")
        print(f"agree strict {sum(r['strict'] == r['expected'] for r in rows)}/{n}")
        print(f"agree lenient {sum(r['lenient'] == r['expected'] for r in rows)}/{n}")
        print(f"timeouts (unpaid): strict {TIMEOUTS['strict']}, lenient {TIMEOUTS['lenient']}")
        for name in (*CLASSES, "unclassified"):
            if classes[name]:
                print(f"{classes[name]:4d}  {name}")
    page = "# Peer test suites\n\n" + "\n".join(sections)
    publish("peer_suites", "Peer test suites", "", {"markdown": page})


if __name__ == "__main__":
    main()
