"""Dataset files, Hub datasets and datasets passed to `oncurve.train` (`oncurve.data.given`)
-> rows of {"prompt", "answer", other columns...}.

Kinds, by extension: `.jsonl` (one JSON object per line), `.json` (the same, or one JSON array of
objects), `.csv` (header row; values typed as `datasets` types them), `.parquet` (pyarrow, extra
`data`), and a directory written by `datasets.save_to_disk` (extra `data`; of a DatasetDict, the
split asked for). Text files are UTF-8, a byte-order mark at the start ignored. A path that does not
exist locally and reads `owner/name` is a Hugging Face Hub dataset, loaded (downloaded into the
Hugging Face cache, or read from it) with `datasets.load_dataset` at a config and split (extra
`data`). Every problem is reported in one line naming the file, the line (or row) and the field.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oncurve.data.given import given_argument, given_records
from oncurve.errors import UserError, error_line

Record = tuple[str, dict[str, Any]]  # (location such as "line 3" or "row 3", raw record)
# `owner/name`, as the Hugging Face Hub spells a repository id: a missing local path of this
# shape names a Hub dataset (here) or model (`sources.resolve_model_path`).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
FILE_KINDS = (".jsonl", ".json", ".csv", ".parquet")
# What `Dataset.save_to_disk` writes beside the data, and `datasets.load_from_disk` looks for to
# read a directory as one Dataset (a DatasetDict's has `dataset_dict.json` and a folder per split)
_SAVED_DATASET_FILES = ("dataset_info.json", "state.json")


class Row(dict):
    """A dataset row; `where` ("data.jsonl line 3") locates it for errors found later, such as
    a prompt longer than `data.max_prompt_tokens`, which takes the tokenizer to see;
    `answer_field` is the column its reference answer was read from."""

    where: str = ""
    answer_field: str = ""


# Where the reference answer is when the data section does not say: oncurve's name, then TRL's.
ANSWER_FIELDS = ("answer", "solution")
# What the trainer itself passes reward functions by name: a column of the same name would
# replace it (a `trainer_state` column breaks every TRL reward, a `completion_lengths` one fakes
# lengths).
TRAINER_COLUMNS = frozenset(
    ("prompts", "completions", "completion_lengths", "completion_ids", "trainer_state",
     "log_extra", "log_metric")
)  # fmt: skip
# What multi-turn episodes (`rollout.env`) add to those: free names in a run that plays none.
EPISODE_COLUMNS = frozenset(
    ("episode_reward", "episode_metrics", "episode_fault", "episode_end", "turns")
)
# What `load_rows` and `PromptData` write into each row: a column of the same name would be
# overwritten (the original answer, the prompt's token ids, a conversational prompt's messages).
ROW_COLUMNS = frozenset(("answer_raw", "prompt_ids", "prompt_messages", "prompt_tools"))
# The columns TRL builds multimodal prompts from.
IMAGE_COLUMNS = frozenset(("image", "images"))
# The roles a conversational prompt may end in, as TRL's `apply_chat_template` renders one: a
# user's or a tool's message is answered in a new assistant turn, the assistant's is continued.
ANSWERED_ROLES = ("user", "tool")


ANSWER_FORMATS = ("auto", "raw", "gsm8k", "boxed", "last_number")
# GSM8K's worked solutions end in a line `#### 72`; a markdown heading earlier in a solution
# is no answer line.
_FINAL_GSM8K = re.compile(r"(?:^|\n)####[ \t]*([^\n]*?)\s*$")
# `{column}`: a name, or any other column's name as the data spells it (`{Question Text}`)
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}\n]+)\}")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# JSON's whitespace; `str.strip` would also take the line separators a JSON string may hold
_JSON_SPACE = " \t\r\n"
# JSON text that may escape a UTF-16 surrogate (`\ud800`): `json` joins a pair into one
# character and leaves one alone as a lone surrogate, which is no character (tokenizers and
# UTF-8 writers refuse it). Only text that matches is searched for one, after parsing.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# What pandas, and so `datasets`, reads in a CSV cell as missing (`read_csv`'s na_values), as a
# whole number, as a number (Python's `float` would also take `1_000`) and as a boolean
_CSV_NA = frozenset(
    ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
     "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
)  # fmt: skip
_CSV_INT = re.compile(r"\s*[+-]?\d+\s*")
_CSV_FLOAT = re.compile(r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|(?i:inf|infinity))\s*")
_CSV_BOOL = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False,
             "false": False}  # fmt: skip


def load_rows(
    path: str,
    prompt_field: str = "prompt",
    answer_field: str | None = None,
    config: str | None = None,
    split: str = "train",
    *,
    prompt_template: str | None = None,
    answer_format: str = "auto",
    require_answer: bool = True,
    episodes: bool = False,
    answer_use: str = "",
) -> list[dict[str, Any]]:
    """Rows (`Row`s) with the prompt under "prompt" and the answer under "answer"; other
    columns are kept and reach the reward functions by name. `config` and `split` pick the part
    of a Hub dataset.

    The prompt is `prompt_template` filled from the row's columns, or the `prompt_field`
    column; a list of {"role", "content"} messages is kept under "prompt_messages" (for the chat
    template), with its last user message as "prompt": one the chat template cannot end
    (`chat_template_ending`) or whose messages hold no text is an error, as an empty text
    prompt is. The answer is read off `answer_field` (None: "answer", else TRL's "solution",
    whichever the first row has) in `answer_format` (`final_answer`), the original value kept
    as "answer_raw" when that changed any row's, and under its own name too when that is
    "solution" (TRL's rewards read it). An answer that is null or blank text counts as missing:
    an error (ending with `answer_use`, what the answers are read for, where given), or
    without `require_answer` an answer of None. A column named as one the trainer
    passes reward functions (with `episodes`, a run's that plays multi-turn episodes, also as
    one they add), or as one written here (`ROW_COLUMNS`), is an error unless it is
    the prompt or answer field read here, and so are a `prompt` column the prompt is not read
    from (the prompt would replace it) and an `answer` column the answer is not read from."""
    rows = []
    records = read_records(path, config, split)
    guessed = answer_field is None
    first_fields = set(records[0][1])
    if answer_field is None:
        answer_field = next((name for name in ANSWER_FIELDS if name in first_fields), "answer")
    # the prompt and answer columns are read and replaced here, whatever their names
    consumed = {answer_field} - {"solution"} | (
        {prompt_field} if prompt_template is None else set()
    )
    first_kind = None
    # the columns the prompt is read from: a `prompt` column not among them would be replaced
    prompt_columns = (
        {prompt_field} if prompt_template is None else template_columns(prompt_template)
    )
    passed = TRAINER_COLUMNS | (EPISODE_COLUMNS if episodes else frozenset())
    # a dataset passed to `oncurve.train` is named as its argument is (`train_dataset row 3`)
    source = given_argument(path) or path
    for where, record in records:
        location = f"{source} {where}"
        if clash := sorted((passed | ROW_COLUMNS).intersection(record) - consumed):
            owner = (
                "the trainer passes reward functions"
                if clash[0] in passed
                else "oncurve writes into each row"
            )
            raise UserError(f"{location}: column {clash[0]!r} is a name {owner} itself; rename it")
        if "prompt" in record and "prompt" not in prompt_columns:
            raise UserError(
                f"{location}: column 'prompt' would be overwritten by the prompt, which "
                + (
                    f"data.prompt_field reads from {prompt_field!r}; rename the column, or read "
                    "the prompt from it with data.prompt_field=prompt"
                    if prompt_template is None
                    else "data.prompt_template fills; rename the column, or use it in the "
                    "template as {prompt}"
                )
            )
        if images := sorted(IMAGE_COLUMNS.intersection(record)):
            raise UserError(
                f"{location}: column {images[0]!r} holds a vision-language model's images, which "
                "oncurve does not train on (text-only models); drop the column to train on the text"
            )
        # a column that ranks before the guessed one would have been this row's answer
        ahead = ANSWER_FIELDS[: ANSWER_FIELDS.index(answer_field)] if guessed else ()
        if other := [name for name in ahead if name in record and name not in first_fields]:
            raise UserError(
                f"{location}: has a column {other[0]!r} the first row lacks, whose "
                f"{answer_field!r} holds the answers; name the answers' column with "
                "data.answer_field"
            )
        # a null prompt (JSON's null, an empty CSV cell) is a missing one, as a null answer is
        if prompt_template is None and record.get(prompt_field) is None:
            _missing(location, prompt_field, record)
        # a null (JSON, Parquet, a short CSV row) or blank answer would leave the row unscored
        if require_answer and _blank(record.get(answer_field)):
            _missing(location, answer_field, record, use=answer_use)
        if "answer" in record and answer_field != "answer":
            raise UserError(
                f"{location}: column 'answer' would be overwritten by the reference answer, "
                f"which data.answer_field reads from {answer_field!r}; rename the column, or "
                "read the answers from it with data.answer_field=answer"
            )
        prompt: Any = (
            fill_template(prompt_template, record, location)
            if prompt_template is not None
            else record[prompt_field]
        )
        messages = None
        if isinstance(prompt, list):
            messages = _messages(prompt, location, prompt_field)
            # a prompt the chat template cannot end (a system message last): refused on loading
            chat_template_ending(messages, f"{location}: field {prompt_field!r}")
            if all(_blank(m["content"]) and not m.get("tool_calls") for m in messages):
                raise UserError(
                    f"{location}: the prompt ({prompt_field!r}) is empty: its messages hold no text"
                )
            prompt = next(
                (m["content"] for m in reversed(messages) if m["role"] == "user"),
                messages[-1]["content"] or "",
            )
        elif not isinstance(prompt, str):
            raise UserError(
                f"{location}: field {prompt_field!r} must be text or a list of "
                f"{{role, content}} messages, got {type(prompt).__name__}"
            )
        elif not prompt.strip():  # the model would be asked nothing (a BOS token alone)
            what = "data.prompt_template" if prompt_template is not None else repr(prompt_field)
            raise UserError(f"{location}: the prompt ({what}) is empty")
        kind = "text" if messages is None else "messages"
        first_kind = first_kind or kind
        if kind != first_kind:  # TRL's rewards take a batch's prompts as one or the other
            raise UserError(
                f"{location}: field {prompt_field!r} is {kind}, the first row's {first_kind}; a "
                "dataset's prompts are all {role, content} messages or all text"
            )
        # the columns stay, named as in the data: TRL's rewards read the gold by its name
        # (`solution`, `ground_truth`) and may read the prompt's column; `answer` is replaced
        # by the answer text, and `prompt` by the prompt
        raw = record.pop("answer", None) if answer_field == "answer" else record.get(answer_field)
        if prompt_template is None and prompt_field == "prompt":
            record.pop(prompt_field, None)
        row = Row(record, prompt=prompt)
        if messages is not None:
            row["prompt_messages"] = messages
        raw = None if _blank(raw) else raw
        text = None if raw is None else str(raw)
        row["answer"] = None if text is None else final_answer(text, answer_format)
        if text is not None and row["answer"] is None:
            raise UserError(
                f"{location}: field {answer_field!r} has no {answer_format} answer (ends "
                f"{text[-60:]!r}); set data.answer_format: auto, raw, gsm8k, boxed or last_number"
            )
        row.where = location
        row.answer_field = answer_field
        rows.append((row, raw))
    # the original, as stored (a number, a list), is kept only where it says more than the
    # answer text, in every row alike (reward functions take each column for a whole batch)
    if any(raw is not None and (type(raw) is not str or raw != row["answer"]) for row, raw in rows):
        for row, raw in rows:
            row["answer_raw"] = raw
    # a column some records lack (JSON lines need not agree) is None in those, as `datasets`
    # reads them: reward functions take each column for a whole batch
    columns = dict.fromkeys(k for row, _ in rows for k in row if k not in ROW_COLUMNS)
    for row, _ in rows:
        for name in columns.keys() - row.keys():
            row[name] = None
    return [row for row, _ in rows]


def final_answer(value: str, answer_format: str) -> str | None:
    """The reference answer of an answer column's value, None when `answer_format` finds none:
    gsm8k, the text of a last `#### x` line (thousands commas dropped); boxed, the last
    `\\boxed{}`; last_number, the last number; raw, the value itself; auto, gsm8k when the value
    ends in a `#### x` line, boxed when it holds a `\\boxed`, else raw."""
    # here, not at the top: `oncurve.rewards` loads torch, which reading a file does not need
    from oncurve.rewards.extraction import extract_answer

    if answer_format not in ANSWER_FORMATS:
        raise UserError(
            f"data.answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
        )
    final = _FINAL_GSM8K.search(value)
    if answer_format == "auto":
        answer_format = (
            "gsm8k" if final and final.group(1) else "boxed" if "\\boxed" in value else "raw"
        )
    if answer_format == "raw":
        return value
    if answer_format == "gsm8k":
        found = final.group(1) if final else extract_answer(value, "gsm8k")
        return found.replace(",", "") if found else None
    return extract_answer(value, answer_format)


def fill_template(template: str, record: dict[str, Any], where: str) -> str:
    """`template` with each `{column}` replaced by the row's value of that column (a name,
    which the row must have, or any column's name as the data spells it); `{{` and `}}` are
    single braces, and braces around anything else (`\\boxed{}`) stay. A template that uses no
    column (every prompt the same), or a column whose value is null or not text or a number,
    is a one-line error."""
    used = []

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)[0]
        if name not in record:
            if not _IDENTIFIER.fullmatch(name):
                return match.group(0)  # LaTeX's braces, not a column
            _missing(where, name, record, what="data.prompt_template's column")
        value = record[name]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            _missing(where, name, record, what="data.prompt_template's column")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise UserError(
                f"{where}: data.prompt_template's column {name!r} holds "
                f"{type(value).__name__}, not text or a number"
            )
        used.append(name)
        return str(value)

    filled = _PLACEHOLDER.sub(fill, template)
    if not used:
        columns = ", ".join(record) or "none"
        raise UserError(
            f"data.prompt_template uses none of the data's columns ({columns}), so every "
            "prompt would be the same; name one as {column}"
        )
    return filled


def template_columns(template: str) -> set[str]:
    """The names `template` writes as `{column}` (`fill_template` fills those the row has)."""
    return {name for name in _PLACEHOLDER.findall(template) if name}


def chat_template_ending(messages: list[dict[str, Any]], where: str) -> dict[str, bool]:
    """`apply_chat_template`'s settings for a conversational prompt, as TRL's
    `apply_chat_template` renders one: the assistant's last message (a prefill, its text part of
    the prompt's tokens) continued, a user's or a tool's followed by the generation prompt that
    opens the assistant's turn; another last role is a one-line error after `where`."""
    role = messages[-1]["role"]
    if role == "assistant":
        return {"add_generation_prompt": False, "continue_final_message": True}
    if role not in ANSWERED_ROLES:
        raise UserError(
            f"{where} ends in a {role!r} message; a prompt ends in a user's or a tool's message "
            "(the model answers in a new assistant turn) or in the assistant's (the model "
            "continues it)"
        )
    return {"add_generation_prompt": True}


def _messages(value: list, where: str, field: str) -> list[dict[str, Any]]:
    """A conversational prompt checked: a non-empty list of messages, each a text `role` and a
    text `content` (null, read as "", in an assistant's message of `tool_calls`), with their
    other keys (`tool_calls`, a tool's `name`, `reasoning_content`) for the chat template; a
    key that is null (a columnar file fills every message's struct with each key) is left out."""
    ok = value and all(
        isinstance(m, dict)
        and isinstance(m.get("role"), str)
        and (
            isinstance(m.get("content"), str) or (m.get("content") is None and m.get("tool_calls"))
        )
        for m in value
    )
    if not ok:
        raise UserError(
            f"{where}: field {field!r} is a list but not of {{role, content}} messages "
            f"(got {str(value)[:60]})"
        )
    # a null content as "" (OpenAI writes null beside tool calls; Qwen's templates refuse it)
    return [
        {**{k: v for k, v in m.items() if v is not None}, "content": m.get("content") or ""}
        for m in value
    ]


def _missing(
    where: str, field: str, record: dict[str, Any], what: str = "field", use: str = ""
) -> None:
    """A one-line error for `field` missing from `record`, ending with `use` where given."""
    if field in record:
        found = record[field]
        value = "null" if found is None else "NaN" if isinstance(found, float) else "empty"
        found_as = f"its value is {value}"
    else:
        found_as = f"fields: {', '.join(record) or 'none'}"
    raise UserError(f"{where}: missing {what} {field!r} ({found_as})" + (f"; {use}" if use else ""))


def _blank(value: Any) -> bool:
    """None, NaN (what pandas writes for a missing value) or text of only spaces."""
    if isinstance(value, float):
        return math.isnan(value)
    return value is None or (isinstance(value, str) and not value.strip())


def read_records(path: str, config: str | None = None, split: str = "train") -> list[Record]:
    """The raw records of a local dataset file, saved-dataset directory, (split `split` of
    config `config` of) Hub dataset or dataset passed to `oncurve.train` (`given:<argument>`,
    `oncurve.data.given`), each with its location for error messages; an error if there are
    none."""
    if given_argument(path):
        return given_records(path)
    p = Path(path)
    if not p.exists():
        if not HUB_ID.fullmatch(path) or p.suffix in FILE_KINDS:
            raise UserError(f"{path}: no such file or directory")
        records = list(_hub_dataset(path, config, split))
    elif p.is_dir():
        records = list(_saved_dataset(p, split))
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


def local_kind(path: str) -> str:
    """What `path` is when it is local data: "a file" or "a directory" (a saved dataset's);
    else "" (a Hub id)."""
    return "a file" if Path(path).is_file() else "a directory" if Path(path).is_dir() else ""


def without_splits(path: str | None) -> str:
    """What `path` is when it is local data without splits to pick: "a file" or "the directory
    of one saved Dataset", which `Dataset.save_to_disk` wrote (a saved DatasetDict's and a Hub
    dataset have splits), told by its files without loading `datasets`; else ""."""
    if path is None:
        return ""
    if Path(path).is_file():
        return "a file"
    if all((Path(path) / name).is_file() for name in _SAVED_DATASET_FILES):
        return "the directory of one saved Dataset"
    return ""


def unread_options(source: str, config: str | None, split: str | None) -> str:
    """Why the `--config` or `--split` given for `source` would be ignored: a config is a Hub
    dataset's, a split a Hub dataset's or a saved DatasetDict's; else ""."""
    if config is not None and local_kind(source):
        return f"--config: {source} is local data, which has no configs"
    unsplit = without_splits(source) if split is not None else ""
    return f"--split: {source} is {unsplit}, which has no splits" if unsplit else ""


def write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """One JSON object per line, UTF-8."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _text(p: Path) -> str:
    data = p.read_bytes()
    try:
        # a byte-order mark (Excel's and Notepad's UTF-8) would start the first field name; it is
        # dropped after decoding so that a bad byte's offset counts from the file's start
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{p} line {line}: not valid UTF-8 (byte {e.start})") from None


def _jsonl(p: Path) -> Iterator[Record]:
    """The objects of a JSON Lines file or, for a `.json` file holding one JSON array (as
    `to_json(lines=False)` writes), of that array."""
    text = _text(p)
    if p.suffix == ".json" and text.lstrip(_JSON_SPACE).startswith("["):
        yield from _json_array(p, text)
        return
    # only "\n" ends a line ("\r" before it is JSON whitespace): `splitlines` would also split
    # at U+2028, U+2029 and U+0085, which JSON strings may hold unescaped
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip(_JSON_SPACE):
            continue
        try:
            record = json.loads(line, object_pairs_hook=_object)
        except json.JSONDecodeError as e:
            raise UserError(f"{p} line {number}: invalid JSON ({e.msg})") from None
        except _RepeatedKey as e:
            raise UserError(f"{p} line {number}: key {e.args[0]!r} is given twice") from None
        except ValueError:
            raise UserError(f"{p} line {number}: {_long_integer(line)}") from None
        if not isinstance(record, dict):
            raise UserError(
                f"{p} line {number}: expected a JSON object, got {type(record).__name__}"
            )
        if _SURROGATE_ESCAPE.search(line):
            _refuse_surrogates(f"{p} line {number}", record)
        yield f"line {number}", record


class _RepeatedKey(ValueError):
    """A key given twice in one JSON object (`json` would keep the last value)."""


def _long_integer(text: str) -> str:
    """Why JSON `text` failed with a plain ValueError: the one `json` raises for an integer of
    more digits than Python converts from text (`sys.set_int_max_str_digits`). Parsed again
    with its integers kept as text, to name the longest; the normal parse converts them in C."""
    longest = 0

    def measure(digits: str) -> str:
        nonlocal longest
        longest = max(longest, len(digits.lstrip("-")))
        return digits

    json.loads(text, parse_int=measure)
    return (
        f"an integer of {longest:,} digits, more than Python reads from text "
        f"({sys.get_int_max_str_digits():,}): write it as a JSON string"
    )


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record = dict(pairs)
    if len(record) < len(pairs):
        keys = [key for key, _ in pairs]
        raise _RepeatedKey(next(key for key in keys if keys.count(key) > 1))
    return record


def _json_array(p: Path, text: str) -> Iterator[Record]:
    try:
        items = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise UserError(f"{p} line {e.lineno}: invalid JSON ({e.msg})") from None
    except _RepeatedKey as e:
        raise UserError(f"{p}: key {e.args[0]!r} is given twice in an object") from None
    except ValueError:
        raise UserError(f"{p}: {_long_integer(text)}") from None
    escapes = _SURROGATE_ESCAPE.search(text) is not None
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise UserError(f"{p} row {number}: expected a JSON object, got {type(item).__name__}")
        if escapes:
            _refuse_surrogates(f"{p} row {number}", item)
        yield f"row {number}", item


def _refuse_surrogates(where: str, record: dict[str, Any]) -> None:
    """A one-line error naming the first field of `record` whose name or value (at any depth:
    a message's content) holds a lone surrogate."""
    for key, value in record.items():
        if found := first_surrogate(key) or first_surrogate(value):
            raise UserError(
                f"{where}: field {key!r} holds an unpaired surrogate \\u{ord(found):04x}, which "
                "is no Unicode character"
            )


def first_surrogate(value: Any) -> str:
    """The first lone surrogate in `value`'s text (a mapping's keys and values, a list's items,
    at any depth: a parsed JSON or YAML value), "" if there is none."""
    if isinstance(value, str):
        match = _SURROGATE.search(value)
        return match.group() if match else ""
    if isinstance(value, dict):
        return next(
            (c for k, v in value.items() if (c := first_surrogate(k) or first_surrogate(v))), ""
        )
    if isinstance(value, list):
        return next((c for v in value if (c := first_surrogate(v))), "")
    return ""


def _csv(p: Path) -> Iterator[Record]:
    text = _text(p)
    # a cell may hold a whole program or document: the csv module's default cap is 128 KiB
    csv.field_size_limit(max(csv.field_size_limit(), len(text)))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    for name in header:
        if header.count(name) > 1:
            raise UserError(f"{p}: column {name!r} is in the header twice")
    records = []
    for record in reader:
        if None in record:
            raise UserError(f"{p} line {reader.line_num}: more values than header columns")
        records.append((f"line {reader.line_num}", dict(record)))
    for name in header:
        typed = _csv_column([record.get(name) for _, record in records])
        for (_, record), value in zip(records, typed, strict=True):
            if name in record:
                record[name] = value
    yield from records


def _csv_column(cells: list[str | None]) -> list[Any]:
    """A CSV column's values as `datasets.load_dataset("csv")` types them (pandas' inference),
    so that reward functions get what they get under TRL: a missing or NA cell (`""`, `NA`,
    `null`, `None`, `nan`, ...) is None; a column of whole numbers is ints (floats when a cell
    is None), of numbers floats, of true/false (`True`, `TRUE`, `true`) booleans; any other
    column is text as written. Whole numbers past 64 bits (signed, or unsigned where none is
    negative), which `datasets` cannot store, stay text."""
    cells = [None if cell is None or cell in _CSV_NA else cell for cell in cells]
    given = [cell for cell in cells if cell is not None]
    if not given:
        return cells
    if all(_CSV_INT.fullmatch(cell) for cell in given):
        # 20 digits bound 64 bits; `int` refuses thousands of them
        if any(len(cell.strip().lstrip("+-")) > 20 for cell in given):
            return cells
        numbers = [int(cell) for cell in given]
        signed = min(numbers) >= -(2**63) and max(numbers) < 2**63
        if not signed and not (min(numbers) >= 0 and max(numbers) < 2**64):
            return cells
        if len(given) < len(cells):
            return [None if cell is None else float(int(cell)) for cell in cells]
        return numbers
    if all(_CSV_FLOAT.fullmatch(cell) for cell in given):
        return [None if cell is None else float(cell) for cell in cells]
    if all(cell in _CSV_BOOL for cell in given):
        return [None if cell is None else _CSV_BOOL[cell] for cell in cells]
    return cells


def _parquet(p: Path) -> Iterator[Record]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(
            f"{p}: reading Parquet needs pyarrow (pip install 'oncurve[data]')"
        ) from None
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as e:  # not Parquet, truncated or corrupt
        raise UserError(f"{p}: cannot read it as Parquet ({error_line(e)})") from None
    try:
        records = table.to_pylist()
    except UnicodeDecodeError:  # Arrow keeps a string's bytes as written, unchecked
        raise UserError(_not_utf8(p, table, "row")) from None
    for number, record in enumerate(records, start=1):
        yield f"row {number}", record


def _not_utf8(p: Path, table: Any, row: str) -> str:
    """The error for the pyarrow `table` of `p` (its rows named `row`: "row", "train row")
    holding text, at any depth (a message's content), that is not valid UTF-8, naming the
    first such row and column: the column found by Arrow's own check, the row by reading that
    column's values one by one."""
    import pyarrow as pa

    for index, name in enumerate(table.column_names):
        column = table.column(index)
        try:
            column.validate(full=True)
        except pa.ArrowInvalid:
            for number in range(len(column)):
                try:
                    column[number].as_py()
                except UnicodeDecodeError:
                    return f"{p} {row} {number + 1}: column {name!r} is not valid UTF-8 text"
    return f"{p}: holds text that is not valid UTF-8"


def _saved_dataset(p: Path, split: str) -> Iterator[Record]:
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
    except Exception as e:  # a damaged dataset_info.json or Arrow file: the library's words
        raise UserError(f"{p}: cannot read the saved dataset ({error_line(e)})") from None
    where = "row"
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise UserError(
                f"{p}: the saved dataset has no split {split!r} (splits: {', '.join(data)})"
            )
        data, where = data[split], f"{split} row"
    try:
        records = [dict(record) for record in data]
    except UnicodeDecodeError:  # Arrow keeps a string's bytes as written, unchecked
        raise UserError(_not_utf8(p, data.with_format("arrow")[:], where)) from None
    for number, record in enumerate(records, start=1):
        yield f"{where} {number}", record


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
            f"{path}: no such local file or directory, and as a Hub dataset it is not in the "
            "local Hugging Face cache and the Hub cannot be reached (or HF_HUB_OFFLINE is set); "
            "load it once with network, which caches it, or give a local file"
        ) from None
    except (OSError, ValueError) as e:
        part = f"config {config!r}, split {split!r}" if config else f"split {split!r}"
        raise UserError(
            f"{path} ({part}): cannot load the Hugging Face Hub dataset: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
        ) from None
    for number, record in enumerate(data, start=1):
        yield f"{split} row {number}", dict(record)
