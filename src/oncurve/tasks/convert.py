"""Convert local copies of the public GSM8K and MATH files to prompt/answer JSONL.

    python -m oncurve.tasks.convert gsm8k gsm8k/train.jsonl data/gsm8k_train.jsonl
    python -m oncurve.tasks.convert math MATH/train data/math_train.jsonl

GSM8K records have "question" and "answer" ending in `#### 42`; MATH records have "problem" and
"solution" with the answer in the last `\\boxed{}` (a directory of MATH's per-problem .json
files is read recursively). The prompt asks for the answer in `\\boxed{}`, which the built-in
`correct` reward extracts, so the matching setting is `reward: {functions: [correct]}`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oncurve.data import read_records, write_jsonl
from oncurve.errors import UserError
from oncurve.rewards.answers import extract_answer

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def gsm8k_rows(path: str) -> list[dict[str, Any]]:
    """{"prompt", "answer", "solution"} from GSM8K records; the answer without commas."""
    rows = []
    for where, record in read_records(path):
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


def math_rows(path: str) -> list[dict[str, Any]]:
    """{"prompt", "answer", "solution", "level", "type"} from MATH records (a file, or a
    directory of per-problem .json files)."""
    p = Path(path)
    if (
        p.is_dir()
        and not (p / "dataset_info.json").exists()
        and not (p / "dataset_dict.json").exists()
    ):
        records = []
        for file in sorted(p.rglob("*.json")):
            try:
                records.append((str(file), json.loads(file.read_text(encoding="utf-8"))))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise UserError(f"{file}: not a MATH problem file ({e})") from None
        if not records:
            raise UserError(f"{path}: no .json problem files found")
    else:
        records = read_records(path)
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


def _fields(path: str, where: str, record: dict, *names: str) -> list[str]:
    values = []
    for name in names:
        if not isinstance(record.get(name), str):
            raise UserError(f"{path} {where}: missing or non-text field {name!r}")
        values.append(record[name])
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("gsm8k", "math"))
    parser.add_argument("source", help="local GSM8K/MATH file or directory")
    parser.add_argument("dest", help="output JSONL")
    args = parser.parse_args(argv)
    try:
        rows = (gsm8k_rows if args.kind == "gsm8k" else math_rows)(args.source)
    except UserError as e:
        parser.exit(2, f"error: {e}\n")
    write_jsonl(args.dest, rows)
    print(f"wrote {len(rows)} rows to {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
