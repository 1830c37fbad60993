"""A peer's test suite as data: the cases of the `pytest.mark.parametrize` tests of one file at
the HEAD of a bare git mirror, read with `ast`, never imported or run."""

from __future__ import annotations

import ast
import math
import re
import subprocess
from pathlib import Path
from typing import Any


def file_at_head(mirror: Path, path: str) -> tuple[str, str]:
    """The HEAD commit of the bare git `mirror` and the text of its file `path` there."""
    git = ["git", f"--git-dir={mirror}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    show = [*git, "show", f"{commit.stdout.strip()}:{path}"]
    return commit.stdout.strip(), subprocess.run(
        show, check=True, capture_output=True, text=True
    ).stdout


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


def keywords(func: ast.FunctionDef, callee: str, row: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the test `func` passes to its first call of `callee`, a test
    parameter resolved to its value in `row`; {} when it calls no `callee`."""
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == callee:
            return {
                k.arg: row[k.value.id]
                if isinstance(k.value, ast.Name)
                else ast.literal_eval(k.value)
                for k in node.keywords
                if k.arg
            }
    return {}


def defaults(tree: ast.Module, name: str) -> dict[str, Any]:
    """The default of each parameter of the function `name` defined at the top of `tree`."""
    (func,) = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == name]
    with_default = func.args.args[len(func.args.args) - len(func.args.defaults) :]
    return {
        a.arg: ast.literal_eval(d) for a, d in zip(with_default, func.args.defaults, strict=True)
    }


def parametrized_cases(source: str, fields: dict[str, str], callee: str) -> list[dict[str, Any]]:
    """Every case in file order of each parametrized test in `source` with all of `fields`'
    parameters: {"test", "index", those parameters under `fields`' keys, and "options": the
    non-default keywords it passes `callee`, where it does}."""
    tree, cases = ast.parse(source), []
    unchanged = defaults(tree, callee)
    for func in tree.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        for decorator in func.decorator_list:
            if not ast.unparse(decorator).startswith("pytest.mark.parametrize("):
                continue
            assert isinstance(decorator, ast.Call)
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            if not set(fields) <= set(names):
                continue
            entries = decorator.args[1]
            assert isinstance(entries, ast.List)
            for index, entry in enumerate(entries.elts):
                assert isinstance(entry, ast.Tuple)
                row = dict(zip(names, map(literal, entry.elts), strict=True))
                case = {"test": func.name, "index": index}
                case |= {key: row[name] for name, key in fields.items()}
                passed = keywords(func, callee, row).items()
                if options := {k: v for k, v in passed if unchanged.get(k) != v}:
                    case["options"] = options
                cases.append(case)
    return cases
