"""oncurve's answer checker against peers' own test suites: math-verify's, TRL's and verl's.

The cases are data (none of the peers' code is copied), each suite's provenance and licence in
its "source" in `data/peer_suites.json`: math-verify's parametrized cases of tests/test_all.py,
repeated ones kept; TRL's `accuracy_reward` and verl's `test_prime_math` cases by hand (the
completion as prediction, the solution as gold). A case expects 1 when its suite requires gold
and prediction to verify, 0 when it requires them not to; oncurve's `correct`, strict and
lenient, judges the prediction against `reference(gold)` without a prompt, a timeout unpaid, the
options math-verify's tests pass (`precision`, ...) not applied. Each disagreement is listed with
its hand-made class and note (the suite's "why", keyed `test#index`), or "unclassified". No
network and no peer package (lenient matching is oncurve's `math` extra, math-verify).

    .venv/bin/python benchmarks/peer_suites.py                   # score, print, write results/
    .venv/bin/python benchmarks/peer_suites.py --extract MIRROR  # rebuild math-verify's cases first
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS
from harness.parametrized_cases import file_at_head, parametrized_cases
from harness.peer_child import oncurve_checks, tally
from harness.records import read_jsonl, write_jsonl
from harness.tables import code_cell, markdown_table, publish

NAME = "peer_suites"
TITLE = "Peer test suites"
SUITES = json.loads((BENCHMARKS / "data" / "peer_suites.json").read_text())
SHORT_GOLD_CHARS = 200  # a gold longer than this is a whole solution, not an answer
TEXT_CHARS = 80  # a disagreement's gold, reference, prediction and extraction are cut to this
MATH_VERIFY_TESTS = "tests/test_all.py"


def extract_cases(mirror: Path, suite: dict[str, Any]) -> None:
    """Write math-verify's `suite` file: the cases of its tests/test_all.py at the HEAD of its
    bare git `mirror`, in file order; prints how many and from which commit."""
    commit, source = file_at_head(mirror, MATH_VERIFY_TESTS)
    fields = {"gold": "gold", "pred": "prediction", "expected": "expected"}
    found = parametrized_cases(source, fields, "compare_strings")
    cases = [{"suite": suite["name"], **case} for case in found]
    write_jsonl(BENCHMARKS / suite["cases"], cases)
    print(f"{len(cases)} cases from {MATH_VERIFY_TESTS} at {commit} -> {suite['cases']}")


def reference(gold: str) -> str:
    """The gold as oncurve's reward would be given it: surrounding `$` stripped, and a whole
    solution (long, or with a box) reduced to its boxed (or else its extracted) answer."""
    from oncurve.rewards.extraction import extract_answer

    text = gold.strip()
    while len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    if len(text) > SHORT_GOLD_CHARS or "\\boxed" in text:
        text = extract_answer(text, "boxed") or extract_answer(text) or text
    return text


def score_suite(suite: dict[str, Any]) -> dict[str, Any]:
    """One suite's figures: cases, agreements of strict and lenient ([all, expected 1, expected
    0]), timeouts (no verdict on a usable gold), disagreements by class, every disagreement."""
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.matching import usable_gold

    checks = oncurve_checks()
    cases = read_jsonl(BENCHMARKS / suite["cases"])
    wrong = []
    for case in cases:
        row = {"prompt": None, "completion": case["prediction"], "gold": reference(case["gold"])}
        case["verdicts"] = {name: check(row) for name, check in checks.items()}
        case["reference"] = usable_gold(row["gold"])
        paid = {name: bool(verdict) for name, verdict in case["verdicts"].items()}
        if any(verdict != case["expected"] for verdict in paid.values()):
            key = f"{case['test']}#{case['index']}"
            why, note = suite["why"].get(key, ("unclassified", ""))
            row = {"test": key, **{k: case[k] for k in ("gold", "prediction", "expected")}}
            row |= {"reference": case["reference"], "extracted": extract_answer(case["prediction"])}
            wrong.append({**row, **paid, "why": why, "note": note})
    usable = [case for case in cases if case["reference"] is not None]
    agree, timeouts = {}, {}
    for name in checks:
        c = tally((case["verdicts"][name], case["expected"] == 1) for case in cases)
        agree[name] = [c["tp"] + c["tn"], c["tp"], c["tn"]]
        timeouts[name] = sum(case["verdicts"][name] is None for case in usable)
    by_class = Counter(row["why"] for row in wrong)
    classes = {k: by_class[k] for k in (*SUITES["classes"], "unclassified") if by_class[k]}
    figures = {"name": suite["name"], "source": suite["source"], "cases": len(cases)}
    figures |= {"must_verify": sum(case["expected"] for case in cases), "agree": agree}
    return figures | {"timeouts": timeouts, "classes": classes, "disagreements": wrong}


def suite_section(row: dict[str, Any], suite: dict[str, Any]) -> str:
    """One suite's section: agreements, classes, every disagreement."""
    n, must, wrong = suite["cases"], suite["must_verify"], suite["disagreements"]
    labels = ["all", "expected 1 (must verify)", "expected 0 (must not)"]
    columns = zip(labels, (n, must, n - must), *suite["agree"].values(), strict=True)
    text = f"## {suite['name']}\n\n{row['date']}, `{row['command']}`, "
    text += f"Python {row['versions']['python']}. Cases: {suite['source']}.\n\n"
    text += markdown_table(["", "cases", "agree strict", "agree lenient"], list(columns))
    text += f"\n\n{must} cases expect a match and {n - must} expect none. "
    if not wrong:
        return text + "No case disagrees under strict or lenient.\n"
    timeouts = ", ".join(f"{name} {count}" for name, count in suite["timeouts"].items())
    text += f"{len(wrong)} cases disagree under strict or lenient; by class (timeouts, counted "
    text += f"unpaid: {timeouts}):\n\n"
    text += markdown_table(["why", "cases"], list(suite["classes"].items()))
    text += "\n\nEvery disagreement (extracted: what `extract_answer` took from the prediction; "
    text += "reference: the gold given to `answers_match`):\n\n"
    texts = ("gold", "reference", "prediction", "extracted")
    verdicts = ("expected", *suite["agree"])
    cells = [
        [w["test"], *(code_cell(w[k], TEXT_CHARS) for k in texts)]
        + [int(w[k]) for k in verdicts]
        + [w["why"], w["note"].replace("|", "\\|")]
        for w in wrong
    ]
    return text + markdown_table(["test", *texts, *verdicts, "why", "note"], cells) + "\n"


def section(row: dict[str, Any]) -> str:
    """results/peer_suites.md from a row: a section per suite."""
    return f"# {TITLE}\n\n" + "\n".join(suite_section(row, suite) for suite in row["suites"])


def summary(row: dict[str, Any]) -> str:
    """The row in one line: each suite's cases oncurve's checker agrees with, strict."""
    agreed = [f"{s['name']} {s['agree']['strict'][0]}/{s['cases']}" for s in row["suites"]]
    return "oncurve's checker on peers' suites, strict: " + "; ".join(agreed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--extract", type=Path, metavar="MIRROR", help="rebuild math-verify's cases"
    )
    if mirror := parser.parse_args().extract:
        extract_cases(mirror, SUITES["suites"][0])
    suites = [score_suite(suite) for suite in SUITES["suites"]]
    print(publish(NAME, TITLE, "", {"renderer": NAME, "suites": suites}).read_text())


if __name__ == "__main__":
    main()
