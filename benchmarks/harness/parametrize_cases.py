"""A peer's test cases as data: the entries of a pytest file's `parametrize` lists whose
parameters include gold, pred and expected, read from a bare git mirror with `ast` (the file
is never imported or run), with the options each test passes its compare helper; math-verify's
tests/test_all.py written as JSON lines (`write_math_verify_cases`)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
from pathlib import Path
from typing import Any

MATH_VERIFY_MIRROR = Path("/work/.mirror/huggingface+Math-Verify/repo")
MATH_VERIFY_TESTS = "tests/test_all.py"
# compare_strings' defaults in math-verify's tests: an option equal to its default is not kept
COMPARE_DEFAULTS = {
    "match_types": ["latex", "expr"],
    "precision": 6,
    "strict": True,
    "allow_set_relation_comp": False,
}


def git_show(mirror: Path, path: str) -> tuple[str, str]:
    """(HEAD's commit, the text of `path` at it) in the bare git directory `mirror`."""

    def git(*args: str) -> str:
        command = ["git", f"--git-dir={mirror}", *args]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    commit = git("rev-parse", "HEAD").strip()
    return commit, git("show", f"{commit}:{path}")


def literal(node: ast.expr) -> Any:
    """A parametrize entry's value: a literal, or an f-string of literals and `math.f(const)`
    calls (math-verify's test that builds its gold as `f"{math.sqrt(17):.15f}"`)."""
    if not isinstance(node, ast.JoinedStr):
        return ast.literal_eval(node)
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


def helper_options(
    func: ast.FunctionDef, row: dict[str, Any], helper: str, defaults: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments `func` passes to `helper` that differ from `defaults`, a test
    parameter resolved to its value in `row`."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == helper:
            options = {}
            for keyword in node.keywords:
                if isinstance(keyword.value, ast.Name):
                    value = row[keyword.value.id]
                else:
                    value = ast.literal_eval(keyword.value)
                if keyword.arg and defaults.get(keyword.arg) != value:
                    options[keyword.arg] = value
            return options
    return {}


def extract_cases(
    source: str, suite: str, helper: str, defaults: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every case of every `pytest.mark.parametrize` test in `source` whose parameters include
    gold, pred and expected, in file order: {"suite", "test", "index" (its position in the
    list), "gold", "prediction", "expected" (0 or 1), and "options" when `helper` gets any
    that differ from `defaults`}."""
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
                row = dict(zip(names, map(literal, entry.elts), strict=True))
                case = {"suite": suite, "test": func.name, "index": index, "gold": row["gold"]}
                case |= {"prediction": row["pred"], "expected": int(row["expected"])}
                options = helper_options(func, row, helper, defaults)
                if options:
                    case["options"] = options
                cases.append(case)
    return cases


def write_math_verify_cases(mirror: Path, path: Path, suite: str) -> None:
    """Write the cases of math-verify's tests/test_all.py at the HEAD of its bare git `mirror`
    to `path`, one JSON line each, named `suite`; prints how many and from which commit."""
    commit, source = git_show(mirror, MATH_VERIFY_TESTS)
    cases = extract_cases(source, suite, "compare_strings", COMPARE_DEFAULTS)
    path.write_text("".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases))
    print(f"{len(cases)} cases from {MATH_VERIFY_TESTS} at {commit} -> {path}")
