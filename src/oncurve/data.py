"""Dataset files and Hub datasets -> rows of {"prompt", "answer", other columns...}.

Kinds, by extension: `.jsonl` / `.json` (one JSON object per line), `.csv` (header row),
`.parquet` (pyarrow, extra `data`), and a directory written by `datasets.save_to_disk` (extra
`data`; a DatasetDict uses its "train" split, or its only split). A path that does not exist
locally and reads `owner/name` is a Hugging Face Hub dataset, loaded (downloaded into the
Hugging Face cache, or read from it) with `datasets.load_dataset` at a config and split (extra
`data`). Every problem is reported in one line naming the file, the line (or row) and the field.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oncurve.errors import UserError

Record = tuple[str, dict[str, Any]]  # (location such as "line 3" or "row 3", raw record)
# `owner/name`, as the Hugging Face Hub spells a repository id: a missing local path of this
# shape names a Hub dataset (here) or model (`models.resolve_model_path`).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
FILE_KINDS = (".jsonl", ".json", ".csv", ".parquet")


class Row(dict):
    """A dataset row; `where` ("data.jsonl line 3") locates it for errors found later, such as
    a prompt longer than `data.max_prompt_tokens`, which takes the tokenizer to see."""

    where: str = ""


def load_rows(
    path: str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    config: str | None = None,
    split: str = "train",
) -> list[dict[str, Any]]:
    """Rows (`Row`s) with the prompt under "prompt" and the answer (as a string) under "answer";
    other columns are kept and reach the reward functions by name. `config` and `split` pick
    the part of a Hub dataset."""
    rows = []
    for where, record in read_records(path, config, split):
        for field in (prompt_field, answer_field):
            if field not in record:
                present = ", ".join(record) or "none"
                raise UserError(f"{path} {where}: missing field {field!r} (fields: {present})")
        prompt = record.pop(prompt_field)
        answer = record.pop(answer_field)
        if not isinstance(prompt, str):
            raise UserError(
                f"{path} {where}: field {prompt_field!r} must be a string, got "
                f"{type(prompt).__name__}"
            )
        row = Row(record, prompt=prompt, answer=None if answer is None else str(answer))
        row.where = f"{path} {where}"
        rows.append(row)
    return rows


def read_records(path: str, config: str | None = None, split: str = "train") -> list[Record]:
    """The raw records of a local dataset file, saved-dataset directory or (split `split` of
    config `config` of) Hub dataset, each with its location for error messages; an error if
    there are none."""
    p = Path(path)
    if not p.exists():
        if not HUB_ID.fullmatch(path) or p.suffix in FILE_KINDS:
            raise UserError(f"{path}: no such file or directory")
        records = list(_hub_dataset(path, config, split))
    elif p.is_dir():
        records = list(_saved_dataset(p))
    elif p.suffix in (".jsonl", ".json"):
        records = list(_jsonl(p))
    elif p.suffix == ".csv":
        records = list(_csv(p))
    elif p.suffix == ".parquet":
        records = list(_parquet(p))
    else:
        raise UserError(
            f"{path}: unknown data file kind {p.suffix!r}; use .jsonl, .csv, .parquet or a "
            "directory saved by datasets.save_to_disk"
        )
    if not records:
        raise UserError(f"{path}: empty, no rows")
    return records


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """One JSON object per line, UTF-8."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _text(p: Path) -> str:
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{p} line {line}: not valid UTF-8 (byte {e.start})") from None


def _jsonl(p: Path) -> Iterator[Record]:
    for number, line in enumerate(_text(p).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{p} line {number}: invalid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise UserError(
                f"{p} line {number}: expected a JSON object, got {type(record).__name__}"
            )
        yield f"line {number}", record


def _csv(p: Path) -> Iterator[Record]:
    reader = csv.DictReader(io.StringIO(_text(p), newline=""))
    for record in reader:
        if None in record:
            raise UserError(f"{p} line {reader.line_num}: more values than header columns")
        yield f"line {reader.line_num}", dict(record)


def _parquet(p: Path) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(
            f"{p}: reading Parquet needs pyarrow (pip install 'oncurve[data]')"
        ) from None
    for number, record in enumerate(pq.read_table(p).to_pylist(), start=1):
        yield f"row {number}", record


def _saved_dataset(p: Path) -> Iterator[Record]:
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"{p}: reading a saved dataset directory needs the datasets package "
            "(pip install 'oncurve[data]')"
        ) from None
    try:
        data = datasets.load_from_disk(str(p))
    except FileNotFoundError as e:
        raise UserError(f"{p}: not a directory saved by datasets.save_to_disk ({e})") from None
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        if "train" in data:
            data = data["train"]
        elif len(splits) == 1:
            data = data[splits[0]]
        else:
            raise UserError(f"{p}: dataset has splits {splits} and none is 'train'; save one split")
    for number, record in enumerate(data, start=1):
        yield f"row {number}", dict(record)


def _hub_dataset(path: str, config: str | None, split: str) -> Iterator[Record]:
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"{path} is no local file; as a Hugging Face Hub dataset it needs the datasets "
            "package: pip install 'oncurve[data]'"
        ) from None
    try:
        data = datasets.load_dataset(path, name=config, split=split)
    except datasets.exceptions.DatasetNotFoundError:
        raise UserError(
            f"{path}: no such local file or directory, nor a dataset on the Hugging Face Hub "
            "(a private or gated one needs `hf auth login`)"
        ) from None
    except ConnectionError:
        raise UserError(
            f"{path} is not in the local Hugging Face cache and the Hub cannot be reached "
            "(or HF_HUB_OFFLINE is set); load it once with network, which caches it, or give a "
            "local file"
        ) from None
    except (OSError, ValueError) as e:
        part = f"config {config!r}, split {split!r}" if config else f"split {split!r}"
        raise UserError(
            f"{path} ({part}): cannot load the Hugging Face Hub dataset: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        ) from None
    for number, record in enumerate(data, start=1):
        yield f"{split} row {number}", dict(record)
