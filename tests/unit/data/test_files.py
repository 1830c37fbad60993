"""Reading dataset files: splits of saved datasets, line breaks, byte-order marks, JSON arrays,
empty answers and the column names oncurve writes itself."""

import json
import sys
from pathlib import Path

import pytest
from helpers.dataset_rows import EXPECTED, ROWS

from oncurve.data.files import load_rows, write_jsonl
from oncurve.errors import UserError


def _one_line_error(match: str, *args, **kwargs) -> str:
    with pytest.raises(UserError, match=match) as err:
        load_rows(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture
def saved_dict(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    train = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": train, "test": train.select([1])}).save_to_disk(
        str(tmp_path / "saved")
    )
    return str(tmp_path / "saved")


def test_a_saved_dataset_dict_reads_the_split_asked_for(saved_dict):
    assert load_rows(saved_dict, "question", "result") == EXPECTED
    (row,) = load_rows(saved_dict, "question", "result", split="test")
    assert row == EXPECTED[1]
    assert row.where == f"{saved_dict} test row 1"
    message = _one_line_error("no split", saved_dict, "question", "result", split="dev")
    assert message == f"{saved_dict}: the saved dataset has no split 'dev' (splits: train, test)"


def test_a_damaged_saved_dataset_is_one_line(saved_dict):
    info = next(Path(saved_dict).glob("*/dataset_info.json"))
    info.write_text("{not json")
    message = _one_line_error("cannot read the saved dataset", saved_dict, "question", "result")
    assert message.startswith(f"{saved_dict}: cannot read the saved dataset (JSONDecodeError")


def test_a_csv_cell_past_the_csv_modules_cap_loads(tmp_path):
    program = "x = 1\n" * 40_000  # 240 KB, past the csv module's 128 KiB default
    path = tmp_path / "big.csv"
    path.write_text(f'prompt,answer\n"{program}",1\n')
    (row,) = load_rows(str(path))
    assert row["prompt"] == program


def test_a_saved_dataset_dicts_splits_reach_the_train_and_held_out_rows(saved_dict):
    from oncurve.config import load_config
    from oncurve.data.prompts import load_prompts

    settings = ["data.prompt_field=question", "data.answer_field=result"]
    config = load_config(
        None,
        [f"data.path={saved_dict}", f"eval.path={saved_dict}", "eval.split=test", *settings],
    )
    train, held_out, _ = load_prompts(config)
    assert (train, held_out) == (EXPECTED, EXPECTED[1:])


def test_line_separators_inside_json_strings_are_text_not_line_breaks(tmp_path):
    rows = [
        {"prompt": "one\u2028two", "answer": "1"},
        {"prompt": "three\u2029four\x85five", "answer": "2"},
    ]
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), rows)
    loaded = load_rows(str(path))
    assert loaded == rows
    assert loaded[1].where == f"{path} line 2"

    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(b'{"prompt": "a", "answer": "1"}\r\n\r\n{"prompt": "b", "answer": "2"}\r\n')
    assert [row["prompt"] for row in load_rows(str(crlf))] == ["a", "b"]
    assert load_rows(str(crlf))[1].where == f"{crlf} line 3"


def test_an_unpaired_surrogate_escape_in_json_is_one_line_naming_the_field(tmp_path):
    """JSON may escape half of a UTF-16 pair alone (`\\ud800`), which decodes to no character:
    a tokenizer or a UTF-8 writer would fail on it with no file or line. A whole pair is one
    character, and an escaped backslash before `ud800` is plain text."""
    path = tmp_path / "d.jsonl"
    fine = [
        r'{"prompt": "smile \ud83d\ude00", "answer": "1"}',
        r'{"prompt": "a\\ud800b", "answer": "2"}',
    ]
    path.write_text("\n".join(fine) + "\n", encoding="utf-8")
    assert [row["prompt"] for row in load_rows(str(path))] == ["smile \U0001f600", "a\\ud800b"]
    for line, field, code in [
        (r'{"prompt": "a\ud800b", "answer": "1"}', "prompt", "d800"),
        (r'{"prompt": "a", "answer": "1\uDC00"}', "answer", "dc00"),
        (r'{"prompt": [{"role": "user", "content": "\ude00\ud83d"}], "answer": "1"}', "prompt", "de00"),
        (r'{"prompt": "a", "answer": "1", "note\udfff": 3}', "note\udfff", "dfff"),
    ]:  # fmt: skip
        path.write_text(fine[0] + "\n" + line + "\n", encoding="utf-8")
        assert _one_line_error("surrogate", str(path)) == (
            f"{path} line 2: field {field!r} holds an unpaired surrogate \\u{code}, which is no "
            "Unicode character"
        )
    array = tmp_path / "d.json"
    array.write_text('[{"prompt": "a", "answer": "1"},\n {"prompt": "b\\udbff", "answer": "2"}]')
    assert _one_line_error("surrogate", str(array)) == (
        f"{array} row 2: field 'prompt' holds an unpaired surrogate \\udbff, which is no Unicode "
        "character"
    )


def test_a_file_that_is_not_parquet_is_one_line_naming_it(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow (extra `data`) not installed")
    path = tmp_path / "d.parquet"
    path.write_text("not parquet")
    message = _one_line_error("as Parquet", str(path))
    assert message.startswith(f"{path}: cannot read it as Parquet (")


def test_a_null_or_empty_answer_is_a_missing_one(tmp_path):
    null = tmp_path / "null.jsonl"
    write_jsonl(str(null), [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}])
    assert (
        _one_line_error("missing field", str(null))
        == f"{null} line 2: missing field 'answer' (its value is null)"
    )
    empty = tmp_path / "empty.jsonl"
    write_jsonl(str(empty), [{"prompt": "a", "solution": " "}])
    assert (
        _one_line_error("missing field", str(empty))
        == f"{empty} line 1: missing field 'solution' (its value is empty)"
    )
    assert load_rows(str(null), require_answer=False)[1]["answer"] is None
    assert load_rows(str(empty), require_answer=False)[0]["answer"] is None

    short = tmp_path / "d.csv"
    short.write_text("prompt,answer\na,1\nb\n", encoding="utf-8")
    assert (
        _one_line_error("missing field", str(short))
        == f"{short} line 3: missing field 'answer' (its value is null)"
    )
    short.write_text("prompt,answer\na,1\nc,\n", encoding="utf-8")  # an empty cell is null
    assert (
        _one_line_error("missing field", str(short))
        == f"{short} line 3: missing field 'answer' (its value is null)"
    )


def test_a_nan_answer_is_a_missing_one(tmp_path):
    """JSON's NaN (pandas and pyarrow write it for a missing float) is no answer "nan"."""
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": NaN}\n')
    assert (
        _one_line_error("missing field", str(nan))
        == f"{nan} line 2: missing field 'answer' (its value is NaN)"
    )


def test_an_answer_column_the_first_row_lacks_is_refused_when_the_column_is_guessed(tmp_path):
    """The first row decides which column holds the answers: a later row's own `answer` would
    be passed over for its `solution` without a word."""
    mixed = tmp_path / "mixed.jsonl"
    write_jsonl(str(mixed), [{"prompt": "a", "solution": "1"},
                             {"prompt": "b", "answer": "2", "solution": "3"}])  # fmt: skip
    assert _one_line_error("answer", str(mixed)) == (
        f"{mixed} line 2: has a column 'answer' the first row lacks, whose 'solution' holds "
        "the answers; name the answers' column with data.answer_field"
    )
    # named, the other column is the answers, and a row's `answer` column would be lost
    _one_line_error(
        "line 2: column 'answer' would be overwritten", str(mixed), answer_field="solution"
    )
    # a later `solution` beside the answers' own column passes nothing over
    later = tmp_path / "later.jsonl"
    write_jsonl(str(later), [{"prompt": "a", "answer": "1"},
                             {"prompt": "b", "answer": "2", "solution": "3"}])  # fmt: skip
    assert [row["answer"] for row in load_rows(str(later))] == ["1", "2"]


def test_a_column_given_twice_is_refused(tmp_path):
    """Which of two values would be the answer is a guess (`datasets` keeps both, renamed)."""
    header = tmp_path / "twice.csv"
    header.write_text("prompt,answer,answer\nq,1,2\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"twice.csv: column 'answer' is in the header twice$"):
        load_rows(str(header))
    keys = tmp_path / "twice.jsonl"
    keys.write_text(
        '{"prompt": "q", "answer": "1"}\n{"prompt": "q", "answer": "1", "answer": "2"}\n'
    )
    with pytest.raises(UserError, match=r"twice.jsonl line 2: key 'answer' is given twice$"):
        load_rows(str(keys))


def test_an_integer_past_pythons_digit_limit_is_one_line_and_as_text_it_loads(tmp_path):
    huge = "9" * 5000
    for name, text in (
        ("long.jsonl", f'{{"prompt": "q", "answer": "1"}}\n{{"prompt": "q", "answer": {huge}}}\n'),
        ("long.json", f'[{{"prompt": "q", "answer": -{huge}}}]'),
    ):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(UserError, match=r"an integer of 5,000 digits, .* JSON string$"):
            load_rows(str(path))
    quoted = tmp_path / "quoted.jsonl"
    quoted.write_text(f'{{"prompt": "q", "answer": "{huge}"}}\n')
    assert [row["answer"] for row in load_rows(str(quoted))] == [huge]
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit (PYTHONINTMAXSTRDIGITS=0): every integer reads
    try:
        assert [row["answer"] for row in load_rows(str(tmp_path / "long.jsonl"))] == ["1", huge]
    finally:
        sys.set_int_max_str_digits(limit)


def test_a_null_parquet_answer_is_a_missing_one(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow (extra `data`) not installed")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": None}]), path)
    assert (
        _one_line_error("missing field", str(path))
        == f"{path} row 1: missing field 'answer' (its value is null)"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("answer_raw", "zzz"), ("prompt_ids", [1, 2]), ("prompt_messages", "x")],
)
def test_a_column_named_as_one_oncurve_writes_is_refused(tmp_path, name, value):
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), [{"prompt": "a", "answer": "1", name: value}])
    assert _one_line_error("column", str(path)) == (
        f"{path} line 1: column '{name}' is a name oncurve writes into each row itself; rename it"
    )


def test_the_prompt_column_may_be_called_prompt_messages(tmp_path):
    messages = [{"role": "user", "content": "2+2?"}]
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), [{"prompt_messages": messages, "answer": "4"}])
    (row,) = load_rows(str(path), "prompt_messages")
    assert row == {"prompt": "2+2?", "prompt_messages": messages, "answer": "4"}


@pytest.mark.parametrize("messages_first", [True, False])
def test_prompts_mixing_messages_and_text_are_one_line(tmp_path, messages_first):
    """A dataset's prompts are all messages or all text: a mix crashed the batching of the
    rows, or handed a message row's prompt to TRL's rewards as text."""
    rows = [
        {"prompt": [{"role": "user", "content": "1+1="}], "solution": "2"},
        {"prompt": "2+2=", "solution": "4"},
    ]
    path = tmp_path / "mixed.jsonl"
    write_jsonl(str(path), rows if messages_first else rows[::-1])
    first, then = ("messages", "text") if messages_first else ("text", "messages")
    assert _one_line_error("field 'prompt'", str(path)) == (
        f"{path} line 2: field 'prompt' is {then}, the first row's {first}; a dataset's prompts "
        "are all {role, content} messages or all text"
    )
    # a prompt that is neither is named for what it is, a null one as missing
    write_jsonl(str(path), [rows[0], {"prompt": 4, "solution": "4"}])
    assert _one_line_error("field 'prompt'", str(path)).endswith("messages, got int")
    write_jsonl(str(path), [rows[0], {"prompt": None, "solution": "4"}])
    assert _one_line_error("prompt", str(path)).endswith(
        "line 2: missing field 'prompt' (its value is null)"
    )


def test_an_empty_csv_prompt_cell_is_a_missing_prompt(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("prompt,answer\nfine,1\n,2\n", encoding="utf-8")
    assert _one_line_error("prompt", str(path)) == (
        f"{path} line 3: missing field 'prompt' (its value is null)"
    )


def test_a_byte_order_mark_is_no_part_of_the_first_field(tmp_path):
    bom = b"\xef\xbb\xbf"
    csv_path = tmp_path / "d.csv"
    csv_path.write_bytes(bom + b"question,result,level\n1+1?,2,easy\n2*3?,6,hard\n")
    assert load_rows(str(csv_path), "question", "result") == EXPECTED
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_bytes(bom + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert load_rows(str(jsonl), "question", "result") == EXPECTED
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(bom + b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9"}\n')
    assert _one_line_error("UTF-8", str(bad)) == f"{bad} line 2: not valid UTF-8 (byte 49)"


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_file_may_hold_an_array_of_objects(tmp_path, indent):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS, indent=indent), encoding="utf-8")
    rows = load_rows(str(path), "question", "result")
    assert rows == EXPECTED
    assert rows[1].where == f"{path} row 2"


def test_a_json_array_with_a_bad_item_names_it(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n  {"prompt": "a", "answer": "1"},\n  3\n]\n', encoding="utf-8")
    assert (
        _one_line_error("expected", str(path)) == f"{path} row 2: expected a JSON object, got int"
    )
    path.write_text('[\n  {"prompt": "a", "answer": "1"},\n  {"prompt": }\n]\n', encoding="utf-8")
    assert _one_line_error("invalid JSON", str(path)).startswith(f"{path} line 3: invalid JSON (")
    path.write_text("[]\n", encoding="utf-8")
    assert _one_line_error("empty", str(path)) == f"{path}: empty, no rows"


def test_the_answer_column_as_stored_stays_in_answer_raw(tmp_path):
    """A number or a list as the answer column holds it reaches the rewards unchanged in
    `answer_raw` (TRL passes the column as stored); `answer` is its text."""
    path = tmp_path / "typed.jsonl"
    write_jsonl(str(path), [{"prompt": "a", "answer": 2}, {"prompt": "b", "answer": [2, 3]}])
    rows = load_rows(str(path))
    assert [(r["answer"], r["answer_raw"]) for r in rows] == [("2", 2), ("[2, 3]", [2, 3])]
    text = tmp_path / "text.jsonl"
    write_jsonl(str(text), [{"prompt": "a", "answer": "2"}, {"prompt": "b", "answer": "3"}])
    assert all("answer_raw" not in row for row in load_rows(str(text)))


def test_a_messages_other_keys_are_kept(tmp_path):
    """A tool call, a tool's name, a reasoning trace: the chat template renders them, as TRL
    has it render the messages as stored; a key a columnar file fills with null is left out."""
    call = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "name": None},
        {"role": "tool", "name": "weather", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    path = tmp_path / "tools.jsonl"
    write_jsonl(str(path), [{"prompt": messages, "answer": "rain"}])
    (row,) = load_rows(str(path))
    assert row["prompt_messages"] == [
        messages[0],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        messages[2],
        messages[3],
    ]
    no_content = tmp_path / "no_content.jsonl"
    write_jsonl(str(no_content), [{"prompt": [messages[0], {"role": "assistant", "tool_calls": [call]}, messages[3]], "answer": "rain"}])  # fmt: skip
    assert load_rows(str(no_content))[0]["prompt_messages"][1]["content"] == ""
    # a call the template cannot render (its arguments a string) is one line naming the row
    from helpers.episodes import load_qwen3_tokenizer

    from oncurve.config import DataConfig
    from oncurve.data.prompts import encode_prompt

    odd = [messages[0], {"role": "assistant", "content": "", "tool_calls": "[]"}]
    tokenizer = load_qwen3_tokenizer()
    with pytest.raises(UserError, match="^row 3: the chat template cannot render the prompt"):
        encode_prompt(tokenizer, "x", DataConfig(chat_template=True), "row 3", messages=odd)
    bad = tmp_path / "bad.jsonl"
    write_jsonl(str(bad), [{"prompt": [{"role": "user", "content": None}], "answer": "1"}])
    assert "not of {role, content} messages" in _one_line_error("messages", str(bad))


def test_a_prompt_may_end_in_the_assistants_message_and_not_in_another_roles(tmp_path):
    """A prefill (the assistant's last message, which the model continues) loads as it is; a
    last message of a role TRL refuses to end a prompt in is one line naming the row and field."""
    user = {"role": "user", "content": "q"}
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), [{"prompt": [user, {"role": "assistant", "content": "Let me"}],
                             "answer": "2"}])  # fmt: skip
    (row,) = load_rows(str(path))
    assert row["prompt_messages"][-1] == {"role": "assistant", "content": "Let me"}
    for role in ("system", "developer"):
        write_jsonl(str(path), [{"prompt": [user, {"role": role, "content": "s"}], "answer": "2"}])
        assert _one_line_error("ends in", str(path)) == (
            f"{path} line 1: field 'prompt' ends in a {role!r} message; a prompt ends in a "
            "user's or a tool's message (the model answers in a new assistant turn) or in the "
            "assistant's (the model continues it)"
        )


def test_a_prompt_of_messages_with_no_text_is_refused_as_an_empty_text_prompt_is(tmp_path):
    path = tmp_path / "d.jsonl"
    blank = [{"role": "system", "content": " "}, {"role": "user", "content": ""}]
    write_jsonl(str(path), [{"prompt": [{"role": "user", "content": "q"}], "answer": "1"},
                            {"prompt": blank, "answer": "2"}])  # fmt: skip
    assert _one_line_error("empty", str(path)) == (
        f"{path} line 2: the prompt ('prompt') is empty: its messages hold no text"
    )
    write_jsonl(str(path), [{"q": "", "answer": "2"}])
    assert _one_line_error("empty", str(path), prompt_template="{q}") == (
        f"{path} line 1: the prompt (data.prompt_template) is empty"
    )
    # a system message's text is a prompt, as is a tool call with no text beside it
    write_jsonl(str(path), [{"prompt": [blank[0] | {"content": "Say hi."}, blank[1]]}])
    assert load_rows(str(path), require_answer=False)[0]["prompt"] == ""
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    called = [{"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "content": ""}]  # fmt: skip
    write_jsonl(str(path), [{"prompt": called}])
    assert len(load_rows(str(path), require_answer=False)) == 1


def test_a_prompt_column_the_prompt_is_not_read_from_is_refused(tmp_path):
    """The prompt goes under "prompt": a column of that name read by neither data.prompt_field
    nor data.prompt_template would be lost without a word."""
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), [{"question": "Q", "prompt": "P-col", "answer": "1"}])
    assert _one_line_error("column 'prompt'", str(path), "question") == (
        f"{path} line 1: column 'prompt' would be overwritten by the prompt, which "
        "data.prompt_field reads from 'question'; rename the column, or read the prompt from it "
        "with data.prompt_field=prompt"
    )
    assert _one_line_error("column 'prompt'", str(path), prompt_template="{question}?") == (
        f"{path} line 1: column 'prompt' would be overwritten by the prompt, which "
        "data.prompt_template fills; rename the column, or use it in the template as {prompt}"
    )
    # read by the setting, it is the prompt
    assert load_rows(str(path))[0]["prompt"] == "P-col"
    (row,) = load_rows(str(path), prompt_template="{question} {prompt}")
    assert (row["prompt"], row["question"]) == ("Q P-col", "Q")


def test_an_answer_column_the_answer_is_not_read_from_is_refused(tmp_path):
    """The reference answer goes under "answer": a column of that name beside the one
    data.answer_field names would reach reward functions as the other column's answer, where
    TRL passes them the column itself."""
    path = tmp_path / "d.jsonl"
    write_jsonl(str(path), [{"prompt": "P", "answer": "worked: 4", "solution": "4"}])
    assert _one_line_error("column 'answer'", str(path), answer_field="solution") == (
        f"{path} line 1: column 'answer' would be overwritten by the reference answer, which "
        "data.answer_field reads from 'solution'; rename the column, or read the answers from "
        "it with data.answer_field=answer"
    )
    # read by the setting, or guessed, it is the answer, and `solution` stays a column
    for field in ("answer", None):
        (row,) = load_rows(str(path), answer_field=field)
        assert (row["answer"], row["solution"]) == ("worked: 4", "4")
