"""oncurve's answer checker against peers' own test suites: math-verify's, TRL's and verl's.

The cases are data only (none of the peers' code is copied), each suite's provenance and licence
in its "source" in `data/peer_suites.json`: math-verify's parametrized cases of tests/test_all.py,
repeated ones kept, written by `--extract` from a local bare git mirror (`--mirror`; the file is
read with `ast`, never imported or run); TRL's `accuracy_reward` and verl's `test_prime_math`
cases by hand, each completion as the prediction and its solution as the gold. A case expects 1
when its suite requires gold and prediction to verify, 0 when it requires them not to. oncurve's
`correct`, strict and lenient (`oncurve_checks`), judges the prediction against
`reference(gold)` without a prompt, a timeout unpaid; the options math-verify's tests pass
(`precision`, ...) are kept in each case, not applied. Each disagreement is listed with its
hand-made class and note from `data/peer_suites.json` (keyed `test#index`), or "unclassified".

    .venv/bin/python benchmarks/peer_suites.py            # score, print, write results/
    .venv/bin/python benchmarks/peer_suites.py --extract  # rebuild math-verify's data file first

No network and no peer package (lenient matching uses math-verify, oncurve's `math` extra).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS
from harness.peer_child import oncurve_checks, tally
from harness.tables import code_cell, markdown_table, publish

NAME = "peer_suites"
TITLE = "Peer test suites"
SUITES = json.loads((BENCHMARKS / "data" / "peer_suites.json").read_text())
SHORT_GOLD_CHARS = 200  # a gold longer than this is a whole solution, not an answer
PRED_CHARS = 80  # a gold, prediction or extraction is shortened to this in the table
MATH_VERIFY_MIRROR = Path("/work/.mirror/huggingface+Math-Verify/repo")
MATH_VERIFY_TESTS = "tests/test_all.py"
# compare_strings' defaults in math-verify's tests: an option equal to its default is not kept
COMPARE_DEFAULTS = {
    "match_types": ["latex", "expr"],
    "precision": 6,
    "strict": True,
    "allow_set_relation_comp": False,
}


def literal(node: ast.expr) -> Any:
    """A parametrize entry's value: a literal, or an f-string of literals and `math.f(const)`
    calls (math-verify's test that builds its gold as `f"{math.sqrt(17):.15f}"`)."""
    if not isinstance(node, ast.JoinedStr):
        return ast.literal_eval(node)
    parts = []
    for part in node.values:
        if isinstance(part, ast.FormattedValue):
            call = part.value
            name = ast.unparse(call.func) if isinstance(call, ast.Call) else ""
            if not re.fullmatch(r"math\.\w+", name) or call.keywords:
                raise ValueError(f"line {node.lineno}: unsupported f-string value")
            value = getattr(math, name[5:])(*map(ast.literal_eval, call.args))
            parts.append(format(value, literal(part.format_spec) if part.format_spec else ""))
        else:
            parts.append(str(part.value))
    return "".join(parts)


def compare_options(func: ast.FunctionDef, row: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the test `func` passes to `compare_strings` that differ from
    `COMPARE_DEFAULTS`, a test parameter resolved to its value in `row`."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_strings":
            values = {
                k.arg: row[k.value.id]
                if isinstance(k.value, ast.Name)
                else ast.literal_eval(k.value)
                for k in node.keywords
                if k.arg
            }
            return {k: v for k, v in values.items() if COMPARE_DEFAULTS.get(k) != v}
    return {}


def extract_cases(mirror: Path, path: Path, suite: str) -> None:
    """Write to `path`, one JSON line each, every case of every `pytest.mark.parametrize` test
    in math-verify's tests/test_all.py at the HEAD of its bare git `mirror` whose parameters
    include gold, pred and expected, in file order: {"suite", "test", "index" (its position in
    the list), "gold", "prediction", "expected" (0 or 1), and "options" where the test passes
    `compare_strings` any (`compare_options`)}; prints how many and from which commit."""
    git = ["git", f"--git-dir={mirror}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    show = [*git, "show", f"{commit.stdout.strip()}:{MATH_VERIFY_TESTS}"]
    source = subprocess.run(show, check=True, capture_output=True, text=True).stdout
    cases = []
    for func in ast.parse(source).body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for decorator in func.decorator_list:
            if not ast.unparse(decorator).startswith("pytest.mark.parametrize("):
                continue
            assert isinstance(decorator, ast.Call)
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            if not {"gold", "pred", "expected"} <= set(names):
                continue
            entries = decorator.args[1]
            assert isinstance(entries, ast.List)
            for index, entry in enumerate(entries.elts):
                assert isinstance(entry, ast.Tuple)
                row = dict(zip(names, map(literal, entry.elts), strict=True))
                case = {"suite": suite, "test": func.name, "index": index, "gold": row["gold"]}
                case |= {"prediction": row["pred"], "expected": int(row["expected"])}
                if options := compare_options(func, row):
                    case["options"] = options
                cases.append(case)
    path.write_text("".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases))
    print(f"{len(cases)} cases from {MATH_VERIFY_TESTS} at {commit.stdout.strip()} -> {path}")


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
    """One suite's figures: cases, agreements of strict and lenient ([all, expected 1,
    expected 0]), timeouts, disagreements by class, and every disagreement."""
    from oncurve.rewards.extraction import extract_answer
    from oncurve.rewards.matching import usable_gold

    checks = oncurve_checks()
    cases = [json.loads(line) for line in (BENCHMARKS / suite["cases"]).read_text().splitlines()]
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
    unusable = sum(case["reference"] is None for case in cases)  # unscored, no verdict
    agree, timeouts = {}, {}
    for name in checks:
        c = tally((case["verdicts"][name], case["expected"] == 1) for case in cases)
        agree[name] = [c["tp"] + c["tn"], c["tp"], c["tn"]]
        timeouts[name] = c["skipped"] - unusable  # no verdict on a usable gold: a timeout
    classes = Counter(row["why"] for row in wrong)
    order = [*SUITES["classes"], "unclassified"]
    return {
        "name": suite["name"],
        "source": suite["source"],
        "cases": len(cases),
        "must_verify": sum(case["expected"] for case in cases),
        "agree": agree,
        "timeouts": timeouts,
        "classes": {name: classes[name] for name in order if classes[name]},
        "disagreements": wrong,
    }


def suite_section(row: dict[str, Any], suite: dict[str, Any]) -> str:
    """One suite's section: agreements, classes, every disagreement."""
    n, must = suite["cases"], suite["must_verify"]
    python = row.get("versions", {}).get("python", "")
    labels = ["all", "expected 1 (must verify)", "expected 0 (must not)"]
    columns = zip(labels, (n, must, n - must), *suite["agree"].values(), strict=True)
    table = markdown_table(
        ["", "cases", "agree strict", "agree lenient"], [list(map(str, c)) for c in columns]
    )
    text = f"## {suite['name']}\n\n{row['date']}, `{row['command']}`, Python {python}. "
    text += f"Cases: {suite['source']}.\n\n{table}\n\n"
    text += f"{must} cases expect a match and {n - must} expect none. "
    wrong = suite["disagreements"]
    if not wrong:
        return text + "No case disagrees under strict or lenient.\n"
    timeouts = suite["timeouts"]
    text += f"{len(wrong)} cases disagree under strict or lenient; by class (timeouts, counted "
    text += f"unpaid: strict {timeouts['strict']}, lenient {timeouts['lenient']}):\n\n"
    text += markdown_table(["why", "cases"], [[k, str(v)] for k, v in suite["classes"].items()])
    text += "\n\nEvery disagreement (extracted: what `extract_answer` took from the prediction; "
    text += "reference: the gold given to `answers_match`):\n\n"
    header = ["test", "gold", "reference", "prediction", "extracted", "expected", "strict"]
    cells = [
        [w["test"], code_cell(w["gold"], PRED_CHARS), code_cell(w["reference"])]
        + [code_cell(w["prediction"], PRED_CHARS), code_cell(w["extracted"], PRED_CHARS)]
        + [str(int(w[k])) for k in ("expected", "strict", "lenient")]
        + [w["why"], w["note"].replace("|", "\\|")]
        for w in wrong
    ]
    return text + markdown_table([*header, "lenient", "why", "note"], cells) + "\n"


def section(row: dict[str, Any]) -> str:
    """results/peer_suites.md from a row: a section per suite."""
    sections = [suite_section(row, suite) for suite in row["suites"]]
    return f"# {TITLE}\n\n" + "\n".join(sections)


def summary(row: dict[str, Any]) -> str:
    """The row in one line: each suite's cases oncurve's checker agrees with, strict."""
    return "oncurve's checker on peers' suites, strict: " + "; ".join(
        f"{suite['name']} {suite['agree']['strict'][0]}/{suite['cases']}" for suite in row["suites"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extract", action="store_true", help="rebuild math-verify's data file")
    parser.add_argument("--mirror", type=Path, default=MATH_VERIFY_MIRROR, help="its git dir")
    args = parser.parse_args()
    if args.extract:
        math_verify = SUITES["suites"][0]
        extract_cases(args.mirror, BENCHMARKS / math_verify["cases"], math_verify["name"])
    suites = [score_suite(suite) for suite in SUITES["suites"]]
    for suite in suites:
        n, (strict, lenient) = suite["cases"], suite["agree"].values()
        print(f"{suite['name']}: agree strict {strict[0]}/{n}, lenient {lenient[0]}/{n}")
        print(f"  timeouts (unpaid): {suite['timeouts']}; disagreements: {suite['classes']}")
    publish(NAME, TITLE, "", {"renderer": NAME, "suites": suites})


if __name__ == "__main__":
    main()
