"""Convert the public GSM8K, MATH, MBPP and HumanEval datasets to JSONL rows: local files, or
Hub dataset ids at `--config` and `--split` (extra `data`).

    python -m oncurve.data.tasks.convert gsm8k openai/gsm8k data/gsm8k_train.jsonl --config main
    python -m oncurve.data.tasks.convert gsm8k gsm8k/train.jsonl data/gsm8k_train.jsonl
    python -m oncurve.data.tasks.convert math MATH/train data/math_train.jsonl
    python -m oncurve.data.tasks.convert mbpp mbpp.jsonl data/mbpp.jsonl
    python -m oncurve.data.tasks.convert humaneval HumanEval.jsonl data/humaneval.jsonl
    python -m oncurve.data.tasks.convert kodcode KodCode/KodCode-Light-RL-10K data/kodcode.jsonl

GSM8K records have "question" and "answer" ending in `#### 42`; MATH records have "problem" and
"solution" with the answer in the last `\\boxed{}` (a directory of MATH's per-problem .json
files is read recursively). The prompt is the question followed by INSTRUCTION (asking for the
answer in `\\boxed{}`, which the built-in `correct` reward extracts), so the matching setting is
`reward: {functions: [correct]}`. Training needs no conversion of these two: `data.path` reads
them from the Hub as they are, with `data.answer_format` and `data.prompt_template`
(configs/gsm8k_qwen2.5_0.5b.yaml).

MBPP records have "text" (or "prompt", in the sanitized set), "code", "test_list" and
optionally "test_setup_code" and "test_imports" (sanitized); HumanEval records have "prompt" (a
signature and docstring, after any helpers the tests call), "canonical_solution", "test" (which
defines `check`) and "entry_point". Rows get "prompt", "answer" (the reference solution, shown
in samples, not scored), "tests", "test_setup" (code the dataset runs around the program: MBPP's
imports and setup code, HumanEval's prompt without the function to write) and "entry_point"
(the function the tests call), which the built-in `code_tests` reward reads:
`reward: {functions: [code_tests]}`. KodCode records have "question", "solution", "test" (a
pytest file that imports the program as `solution`) and optionally "test_info" (the functions
to write, each with its "function_declaration", which the prompt states); rows get "prompt",
"answer" and "tests".
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path
from typing import Any

from oncurve.data.files import read_records, unread_options, write_jsonl
from oncurve.data.tasks.code import INSTRUCTION as CODE_INSTRUCTION
from oncurve.errors import UserError
from oncurve.rewards.extraction import extract_answer

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def gsm8k_rows(path: str, config: str | None = None, split: str = "train") -> list[dict[str, Any]]:
    """{"prompt", "answer", "solution"} from GSM8K records; the answer without commas."""
    rows = []
    for where, record in read_records(path, config, split):
        question, solution = _fields(path, where, record, "question", "answer")
        answer = extract_answer(solution, "gsm8k")
        if answer is None:
            raise UserError(f"{path} {where}: field 'answer' has no '#### <answer>' line")
        rows.append(
            {
                "prompt": question.strip() + INSTRUCTION,
                "answer": answer.replace(",", ""),
                "solution": solution,
            }
        )
    return rows


def math_rows(path: str, config: str | None = None, split: str = "train") -> list[dict[str, Any]]:
    """{"prompt", "answer", "solution", "level", "type"} from MATH records (a file, or a
    directory of per-problem .json files)."""
    if _problem_directory(path):
        records = []
        for file in sorted(Path(path).rglob("*.json")):
            try:
                record = json.loads(file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"{file}: not a MATH problem file ({e})") from None
            if not isinstance(record, dict):
                raise UserError(f"{file}: not a MATH problem file (a JSON object is required)")
            records.append((str(file), record))
        if not records:
            raise UserError(f"{path}: no .json problem files found")
    else:
        records = read_records(path, config, split)
    rows = []
    for where, record in records:
        problem, solution = _fields(path, where, record, "problem", "solution")
        answer = record.get("answer") or extract_answer(solution, "boxed")
        if answer is None:
            raise UserError(f"{path} {where}: field 'solution' has no \\boxed{{}} answer")
        rows.append(
            {
                "prompt": problem.strip() + INSTRUCTION,
                "answer": answer,
                "solution": solution,
                "level": record.get("level", ""),
                "type": record.get("type", record.get("subject", "")),
            }
        )
    return rows


def _problem_directory(path: str) -> bool:
    """Whether `path` is a directory of MATH's per-problem .json files, not one that
    `datasets.save_to_disk` wrote."""
    p = Path(path)
    saved = (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()
    return p.is_dir() and not saved


def mbpp_rows(path: str, config: str | None = None, split: str = "train") -> list[dict[str, Any]]:
    """{"prompt", "answer", "tests", "test_setup", "entry_point", "task_id"} from MBPP records.
    The prompt states the task and its tests, as MBPP's paper prompts (the tests name the
    function); each test is one case; the record's test imports and setup code are the row's
    setup; the entry point is the reference's first function that the tests call."""
    rows = []
    for where, record in read_records(path, config, split):
        text_field = "prompt" if "prompt" in record and "text" not in record else "text"
        text, code = _fields(path, where, record, text_field, "code")
        tests = _text_list(path, where, record, "test_list")
        if not tests:
            raise UserError(f"{path} {where}: field 'test_list' is empty")
        setup_code = record.get("test_setup_code") or ""
        if not isinstance(setup_code, str):
            raise UserError(f"{path} {where}: field 'test_setup_code' must be text")
        setup = "\n".join([*_text_list(path, where, record, "test_imports"), setup_code])
        listed = "\n".join(tests)
        rows.append(
            {
                "prompt": f"{text.strip()} Your code should pass these tests:\n\n{listed}\n\n"
                + CODE_INSTRUCTION,
                "answer": code,
                "tests": tests,
                "test_setup": setup if setup.strip() else None,
                "entry_point": _called_function(code, tests),
                "task_id": record.get("task_id", where),
            }
        )
    return rows


def humaneval_rows(
    path: str, config: str | None = None, split: str = "train"
) -> list[dict[str, Any]]:
    """{"prompt", "answer", "tests", "test_setup", "entry_point", "task_id"} from HumanEval
    records: the prompt shows the signature and docstring to complete; the one test case is
    `test` then `check(entry_point)`, so the program must define the whole function, imports
    included; the setup is the record's prompt without that function (its imports and the
    helpers the tests call)."""
    rows = []
    for where, record in read_records(path, config, split):
        prompt, solution, test, entry = _fields(
            path, where, record, "prompt", "canonical_solution", "test", "entry_point"
        )
        rows.append(
            {
                "prompt": "Complete this Python function; reply with the whole function, its "
                f"imports included.\n\n```python\n{prompt.rstrip()}\n```\n\n{CODE_INSTRUCTION}",
                "answer": prompt + solution,
                "tests": f"{test}\n\ncheck({entry})\n",
                "test_setup": _without_function(path, where, prompt, entry),
                "entry_point": entry,
                "task_id": record.get("task_id", where),
            }
        )
    return rows


def kodcode_rows(
    path: str, config: str | None = None, split: str = "train"
) -> list[dict[str, Any]]:
    """{"prompt", "answer", "tests", "task_id"} from KodCode records: the prompt is the question
    and the declarations of the functions its tests import; the one test case is the pytest
    file."""
    rows = []
    for where, record in read_records(path, config, split):
        question, solution, test = _fields(path, where, record, "question", "solution", "test")
        info = record.get("test_info") or []
        declared = (isinstance(i, dict) and isinstance(i.get("function_declaration", ""), str)
                    for i in info) if isinstance(info, list) else [False]  # fmt: skip
        if not all(declared):
            raise UserError(
                f"{path} {where}: field 'test_info' must be a list of objects whose "
                "'function_declaration' is text"
            )
        declarations = [
            i["function_declaration"].strip() for i in info if i.get("function_declaration")
        ]
        stated = "".join(f"\n\nThe function's declaration: `{d}`" for d in declarations)
        rows.append(
            {
                "prompt": f"{question.strip()}{stated}\n\n{CODE_INSTRUCTION}",
                "answer": solution,
                "tests": test,
                "task_id": record.get("question_id", where),
            }
        )
    return rows


CONVERTERS = {
    "gsm8k": gsm8k_rows,
    "math": math_rows,
    "mbpp": mbpp_rows,
    "humaneval": humaneval_rows,
    "kodcode": kodcode_rows,
}


def _called_function(code: str, tests: list[str]) -> str | None:
    """The first top-level function of `code` that a test calls; None when there is none, or
    `code` does not parse."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return None
    called = " ".join(tests)
    for node in body:
        if isinstance(node, ast.FunctionDef) and re.search(rf"\b{node.name}\s*\(", called):
            return node.name
    return None


def _without_function(path: str, where: str, prompt: str, name: str) -> str:
    """`prompt` without its top-level function `name` (decorators included)."""
    try:
        body = ast.parse(prompt).body
    except SyntaxError as e:
        raise UserError(f"{path} {where}: field 'prompt' is not Python ({e.msg})") from None
    lines = prompt.splitlines(keepends=True)
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "".join(lines[: first - 1] + lines[node.end_lineno :])
    raise UserError(f"{path} {where}: field 'prompt' does not define {name!r}")


def _text_list(path: str, where: str, record: dict, name: str) -> list[str]:
    """The list of strings in field `name` ([] when it is absent or null)."""
    value = record.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{path} {where}: field {name!r} must be a list of text")
    return value


def _fields(path: str, where: str, record: dict, *names: str) -> list[str]:
    values = []
    for name in names:
        if not isinstance(record.get(name), str):
            raise UserError(f"{path} {where}: missing or non-text field {name!r}")
        values.append(record[name])
    return values


def _unread_option(kind: str, source: str, config: str | None, split: str | None) -> str:
    """Why `--config` or `--split`, where given, would be ignored for `source` (converted as
    `kind`): a config is a Hub dataset's, a split a Hub dataset's or a saved DatasetDict's;
    else ""."""
    if config is None and split is not None and kind == "math" and _problem_directory(source):
        return f"--split: {source} is a directory of MATH problem files, which has no splits"
    return unread_options(source, config, split)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=tuple(CONVERTERS))
    parser.add_argument(
        "source", help="GSM8K/MATH/MBPP/HumanEval/KodCode file or directory, or a Hub dataset id"
    )
    parser.add_argument("dest", help="output JSONL")
    parser.add_argument("--config", help="config name of a Hub dataset (main for openai/gsm8k)")
    parser.add_argument(
        "--split", help="split of a Hub dataset or saved DatasetDict (default: train)"
    )
    args = parser.parse_args(argv)
    unread = _unread_option(args.kind, args.source, args.config, args.split)
    if unread:
        parser.exit(2, f"error: {unread}; drop it\n")
    try:
        rows = CONVERTERS[args.kind](args.source, args.config, args.split or "train")
    except UserError as e:
        parser.exit(2, f"error: {e}\n")
    try:
        write_jsonl(args.dest, rows)
    except OSError as e:  # a missing or read-only directory
        parser.exit(2, f"error: {args.dest}: {e.strerror or e}\n")
    print(f"wrote {len(rows)} rows to {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
