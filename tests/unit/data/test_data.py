import csv
import itertools
import json
import sys
from types import SimpleNamespace

import pytest
from helpers.dataset_rows import EXPECTED, ROWS

from oncurve.config import DataConfig
from oncurve.data.files import load_rows
from oncurve.data.prompts import PromptData, encode_prompt, group_columns
from oncurve.data.tasks.convert import gsm8k_rows, main, math_rows
from oncurve.errors import UserError
from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.rewards import answers_match, extract_answer
from oncurve.rollout.base import MAX_CHARS_PER_TOKEN, check_room


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_jsonl_with_field_mapping(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    assert load_rows(str(path), "question", "result") == EXPECTED


def test_csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('question,result,level\n1+1?,2,easy\n"2*3?",6,hard\n', encoding="utf-8")
    assert load_rows(str(path), "question", "result") == EXPECTED


# A column's cells as written in a CSV file, and the values `datasets.load_dataset("csv")`
# gives for them (pandas' inference), which reward functions written for TRL expect.
CSV_COLUMNS = [
    (["5", " 6 ", "+7", "007", "-0"], [5, 6, 7, 7, 0]),
    (["3", "NA"], [3.0, None]),  # whole numbers with a gap are floats
    (["1.10", "1e5", ".5", "5.", "-inf"], [1.1, 100000.0, 0.5, 5.0, float("-inf")]),
    (["True", "FALSE", "true", ""], [True, False, True, None]),
    (["1", "true"], ["1", "true"]),
    (["1_000", "2"], ["1_000", "2"]),
    (["1,000", "2"], ["1,000", "2"]),
    (["0x10", "2"], ["0x10", "2"]),
    (["yes", " ", "", "None", "null", "nan", "N/A"], ["yes", " ", None, None, None, None, None]),
    (["", "NA"], [None, None]),
    (["18446744073709551615", "1"], [18446744073709551615, 1]),
    (["99999999999999999999999", "1"], ["99999999999999999999999", "1"]),
    (["-1", "18446744073709551615"], ["-1", "18446744073709551615"]),
    (["1" * 5000], ["1" * 5000]),
]


def _csv_file(path, columns: dict[str, list[str]]) -> str:
    rows = max(len(values) for values in columns.values())
    cells = {name: values + [""] * (rows - len(values)) for name, values in columns.items()}
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "answer", *cells])
        writer.writerows([f"p{i}", "1", *(c[i] for c in cells.values())] for i in range(rows))
    return str(path)


@pytest.mark.parametrize(("cells", "values"), CSV_COLUMNS, ids=lambda v: ",".join(map(str, v)))
def test_csv_values_are_typed_as_datasets_reads_them(tmp_path, cells, values):
    rows = load_rows(_csv_file(tmp_path / "d.csv", {"x": cells}))
    assert [row["x"] for row in rows][: len(values)] == values
    assert [type(row["x"]) for row in rows][: len(values)] == [type(v) for v in values]


def test_csv_values_are_the_ones_datasets_gives(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    # numbers past 64 bits break pyarrow (the other columns' padding turns a uint64 one to text)
    readable = [cells for cells, _ in CSV_COLUMNS if all(len(cell) < 19 for cell in cells)]
    path = _csv_file(tmp_path / "d.csv", {f"c{i}": cells for i, cells in enumerate(readable)})
    theirs = datasets.load_dataset("csv", data_files=path, split="train", cache_dir=tmp_path)
    ours = load_rows(path)
    for name in theirs.column_names[2:]:
        assert [row[name] for row in ours] == theirs[name], name


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow (extra `data`) not installed")
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    assert load_rows(str(path), "question", "result") == EXPECTED


@pytest.mark.parametrize(
    "column, values, where",
    [
        ("question", [b"a\xed\xa0\x80b", b"ok"], "row 1: column 'question'"),
        ("level", [b"easy", b"\xff"], "row 2: column 'level'"),
        ("question", [[b"1+1?"], [b"2*3?", b"\xff"]], "row 2: column 'question'"),
    ],
)
def test_arrow_text_that_is_not_utf8_is_one_line(tmp_path, column, values, where):
    """Parquet and a saved dataset's Arrow files store a string's bytes as written (an encoded
    surrogate, a Latin-1 byte), in a column or a list: reading them is one line naming the
    file, row and column."""
    pa = pytest.importorskip("pyarrow", reason="pyarrow (extra `data`) not installed")
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(ROWS)
    if isinstance(values[0], list):  # a list column: its strings are one array beneath
        strings = pa.array([v for value in values for v in value], pa.binary())
        ends = [0, *itertools.accumulate(len(value) for value in values)]
        text = pa.ListArray.from_arrays(pa.array(ends, pa.int32()), strings.view(pa.string()))
    else:
        text = pa.array(values, pa.binary()).view(pa.string())
    table = table.set_column(table.column_names.index(column), column, text)
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    with pytest.raises(UserError) as err:
        load_rows(str(path), "question", "result")
    assert str(err.value) == f"{path} {where} is not valid UTF-8 text"
    # a saved dataset's Arrow files the same, a DatasetDict's rows named by their split
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset(table)}).save_to_disk(str(saved))
    with pytest.raises(UserError) as err:
        load_rows(str(saved), "question", "result")
    assert str(err.value) == f"{saved} train {where} is not valid UTF-8 text"


@pytest.mark.parametrize("as_dict", [False, True])
def test_saved_dataset_directory(tmp_path, as_dict):
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    data = datasets.Dataset.from_list(ROWS)
    if as_dict:
        data = datasets.DatasetDict({"train": data, "test": data.select([0])})
    data.save_to_disk(str(tmp_path / "saved"))
    assert load_rows(str(tmp_path / "saved"), "question", "result") == EXPECTED


class FakeHub:
    """`datasets.load_dataset` for Hub ids: the rows of ROWS per split, each call recorded."""

    def __init__(self, datasets):
        self.datasets = datasets
        self.calls = []

    def __call__(self, path, name=None, split=None, **kwargs):
        self.calls.append((path, name, split))
        if path == "acme/unreachable":
            raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")
        if path == "acme/absent":
            raise self.datasets.exceptions.DatasetNotFoundError(f"Dataset '{path}' doesn't exist")
        if split not in ("train", "test"):
            raise ValueError(f"Unknown split \"{split}\". Should be one of ['train', 'test'].")
        return self.datasets.Dataset.from_list(ROWS if split == "train" else ROWS[:1])


@pytest.fixture
def fake_hub(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    hub = FakeHub(datasets)
    monkeypatch.setattr(datasets, "load_dataset", hub)
    return hub


def test_a_hub_dataset_id_loads_its_config_and_split(fake_hub):
    rows = load_rows("openai/gsm8k", "question", "result", config="main", split="train")
    assert rows == EXPECTED
    assert rows[1].where == "openai/gsm8k train row 2"
    assert fake_hub.calls == [("openai/gsm8k", "main", "train")]
    with pytest.raises(
        ValueError, match=r"^openai/gsm8k \(config 'main', split 'dev'\): .*Unknown"
    ):
        load_rows("openai/gsm8k", "question", "result", config="main", split="dev")
    with pytest.raises(ValueError, match="no such local file or directory, nor a dataset on the"):
        load_rows("acme/absent")
    unreachable = "acme/unreachable: no such local file or directory, and as a Hub dataset it"
    with pytest.raises(ValueError, match=unreachable):
        load_rows("acme/unreachable")


def test_hub_dataset_settings_reach_the_train_and_held_out_rows(fake_hub):
    from oncurve.config import load_config
    from oncurve.data.prompts import load_prompts

    config = load_config(
        None,
        [
            "data.path=openai/gsm8k",
            "data.config=main",
            "data.prompt_field=question",
            "data.answer_field=result",
            "eval.path=openai/gsm8k",
            "reward.functions=[correct]",
        ],
    )
    train, held_out, task = load_prompts(config)
    assert (train, held_out[0], task) == (EXPECTED, EXPECTED[0], None)
    assert fake_hub.calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]


def test_a_local_path_wins_over_a_hub_id_and_a_missing_file_is_never_looked_up(
    fake_hub, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    _write_jsonl(tmp_path / "acme" / "rows.jsonl", ROWS)
    assert load_rows("acme/rows.jsonl", "question", "result") == EXPECTED
    with pytest.raises(ValueError, match=r"acme/gone.jsonl: no such file or directory"):
        load_rows("acme/gone.jsonl")
    assert fake_hub.calls == []


def test_a_hub_dataset_without_datasets_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match=r"pip install 'oncurve\[data\]'") as err:
        load_rows("openai/gsm8k")
    assert "openai/gsm8k" in str(err.value) and "\n" not in str(err.value)


def test_bad_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty.jsonl: empty, no rows"):
        load_rows(str(empty))

    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"prompt": "a", "answer": "1"}, {"q": 1}])
    with pytest.raises(ValueError, match=r"missing.jsonl line 2: missing field 'prompt'"):
        load_rows(missing)
    with pytest.raises(ValueError, match=r"line 1: missing field 'result'"):
        load_rows(missing, answer_field="result")

    binary = tmp_path / "latin1.jsonl"
    binary.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"latin1.jsonl line 2: not valid UTF-8"):
        load_rows(str(binary))

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken.jsonl line 2: invalid JSON"):
        load_rows(str(broken))

    csv_path = tmp_path / "d.csv"
    csv_path.write_text("prompt,answer\na,1\nb,2,extra\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"d.csv line 3: more values than header columns"):
        load_rows(str(csv_path))

    for name in ("completion_lengths", "trainer_state", "log_metric"):
        clash = _write_jsonl(tmp_path / f"{name}.jsonl", [{"prompt": "a", "answer": "1", name: 1}])
        with pytest.raises(ValueError, match=rf"{name}.jsonl line 1: column '{name}' is a name"):
            load_rows(clash)
    # what multi-turn episodes add to the columns is a free name in a run that plays none (a
    # TRL dataset's `turns`), and refused in one that does
    turns = _write_jsonl(tmp_path / "turns.jsonl", [{"prompt": "a", "answer": "1", "turns": 2}])
    assert load_rows(turns)[0]["turns"] == 2
    with pytest.raises(ValueError, match=r"turns.jsonl line 1: column 'turns' is a name"):
        load_rows(turns, episodes=True)

    with pytest.raises(ValueError, match=r"no such file"):
        load_rows(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"unknown data file kind '.txt'"):
        (tmp_path / "d.txt").write_text("x")
        load_rows(str(tmp_path / "d.txt"))


def test_a_prompt_over_max_prompt_tokens_names_file_line_and_field(tmp_path):
    path = tmp_path / "long.jsonl"
    lines = [{"q": "ab", "a": "1"}, {"q": "abc", "a": "2"}, {"q": "abcd", "a": "3"}]
    # a blank line, so the reported line is the file's, not the row's index
    path.write_text("\n".join(json.dumps(r) for r in lines[:2]) + "\n\n" + json.dumps(lines[2]))
    rows = load_rows(str(path), "q", "a")
    tokenizer = char_tokenizer()  # <bos> + one token per character
    fits = DataConfig(prompt_field="q", answer_field="a", max_prompt_tokens=5)
    lengths = [len(r["prompt_ids"]) for r in PromptData(rows, tokenizer, fits, seed=0).rows]
    assert lengths == [3, 4, 5]
    short = DataConfig(prompt_field="q", answer_field="a", max_prompt_tokens=4)
    with pytest.raises(ValueError) as err:
        PromptData(rows, tokenizer, short, seed=0)
    assert str(err.value) == (
        f"{path} line 4: field 'q' has 5 tokens, more than data.max_prompt_tokens=4"
    )
    # rows from a built-in task have no file: they are named by their index
    with pytest.raises(ValueError, match=r"^row 1: field 'prompt' has 4 tokens"):
        PromptData(
            [{"prompt": "a", "answer": "1"}, {"prompt": "abc", "answer": "2"}],
            tokenizer,
            DataConfig(max_prompt_tokens=3),
            seed=0,
        )


def test_a_templated_prompt_over_max_prompt_tokens_names_the_template():
    templated = DataConfig(prompt_field="q", prompt_template="{q}?", max_prompt_tokens=5)
    with pytest.raises(ValueError, match=r"^row 1: the prompt \(data.prompt_template\) has 6 "):
        encode_prompt(char_tokenizer(), "abcd?", templated, "row 1")


def test_a_prompt_too_long_for_any_tokenizer_is_refused_before_tokenizing():
    seen: list[int] = []

    def recording(text: str) -> dict[str, list[int]]:
        seen.append(len(text))
        return {"input_ids": [ord(c) for c in text]}

    recording.chat_template = "{{ messages }}"  # type: ignore[attr-defined]
    huge = "x" * (50 * 2**20)  # 50 MB: minutes and gigabytes in a real tokenizer
    with pytest.raises(ValueError, match=r"^row 7: field 'prompt' has 52428800 characters, more "):
        encode_prompt(recording, huge, DataConfig(max_prompt_tokens=512), "row 7")
    messages = [{"role": "user", "content": huge}]
    with pytest.raises(ValueError, match=r"^row 8: field 'prompt' has 52428800 characters"):
        encode_prompt(recording, "", DataConfig(max_prompt_tokens=512), "row 8", messages)
    assert seen == []
    fits = "x" * (512 * MAX_CHARS_PER_TOKEN)  # as long as the bound: the tokenizer decides
    with pytest.raises(ValueError, match=r"has 32768 tokens, more than data.max_prompt_tokens"):
        encode_prompt(recording, fits, DataConfig(max_prompt_tokens=512), "row 9")
    assert seen == [len(fits)]


def test_a_prompt_of_no_tokens_names_its_row_and_field():
    def no_bos(text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    assert encode_prompt(no_bos, "ab", DataConfig(), "row 3") == [97, 98]
    with pytest.raises(ValueError, match=r"^row 3: field 'prompt' encodes to no tokens$"):
        encode_prompt(no_bos, "", DataConfig(), "row 3")


def test_the_longest_prompt_and_max_new_tokens_must_fit_the_models_positions():
    positions = SimpleNamespace(max_position_embeddings=16)
    check_room(7, 9, positions)  # fits exactly
    check_room(7, 10**6, SimpleNamespace())  # a model without a position limit
    with pytest.raises(ValueError) as err:
        check_room(7, 10, positions)
    assert str(err.value) == (
        "rollout.max_new_tokens=10 does not fit: the longest prompt has 7 tokens and the "
        "model's context length (max_position_embeddings) is 16, which leaves room for 9 new tokens"
    )
    with pytest.raises(ValueError, match=r"^--max-new-tokens=20 does not fit"):
        check_room(7, 20, positions, "--max-new-tokens")


@pytest.mark.parametrize("rounds_per_step", [1, 5])
def test_each_row_is_a_steps_first_round_once_per_epoch(rounds_per_step):
    """Dynamic sampling's later rounds (up to `rounds_per_step`) draw prompts of their own,
    whether or not a step runs them: the first rounds of an epoch's steps hold every row
    once, and a step's rounds differ."""
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)]
    data = PromptData(rows, char_tokenizer(), DataConfig(), seed=3)
    for epoch in range(2):
        steps = range(3 * epoch + 1, 3 * epoch + 4)
        first = [r["prompt"] for step in steps for r in data.batch(step, 4, 0, rounds_per_step)]
        assert sorted(first) == sorted(r["prompt"] for r in rows)
    if rounds_per_step > 1:  # while rows are left, a step's rounds hold no row twice
        for step in range(1, 20):
            rounds = [data.batch(step, 4, r, rounds_per_step) for r in range(3)]
            prompts = [row["prompt"] for picks in rounds for row in picks]
            assert len(set(prompts)) == 12
    largest_seed = PromptData(rows, char_tokenizer(), DataConfig(), seed=2**63 - 1)
    assert len(largest_seed.batch(7, 4, 1, rounds_per_step)) == 4


def test_system_prompt_and_chat_template():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    rows = [{"prompt": "1+1=", "answer": "2"}]

    def text(data: DataConfig) -> str:
        return tokenizer.decode(PromptData(rows, tokenizer, data, seed=0).rows[0]["prompt_ids"])

    assert text(DataConfig()) == "<bos>1+1="
    assert text(DataConfig(system_prompt="Add.")) == "<bos>Add.\n\n1+1="
    assert text(DataConfig(chat_template=True)) == "[user]1+1=\n[assistant]"
    assert text(DataConfig(chat_template=True, system_prompt="Add.")) == (
        "[system]Add.\n[user]1+1=\n[assistant]"
    )


def test_a_prompt_ending_in_the_assistants_message_is_continued():
    """As TRL's `apply_chat_template` renders a conversational prompt: after a user's or a
    tool's message the generation prompt opens the assistant's turn; an assistant's last message
    (a prefill) is continued, its text the end of the prompt's tokens and no new turn opened; a
    prompt ending in another role's message is one line naming the row and field."""
    tokenizer = char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )

    def text(*messages: dict) -> str:
        row = {"prompt": "q", "prompt_messages": list(messages), "answer": "2"}
        ids = PromptData([row], tokenizer, DataConfig(system_prompt="S"), seed=0).rows[0]
        return tokenizer.decode(ids["prompt_ids"])

    user = {"role": "user", "content": "q"}
    prefill = {"role": "assistant", "content": "Let me"}
    assert text(user) == "[system]S\n[user]q\n[assistant]"
    assert text(user, prefill) == "[system]S\n[user]q\n[assistant]Let me"
    tool = {"role": "tool", "content": "4"}
    assert (
        text(user, prefill, tool) == "[system]S\n[user]q\n[assistant]Let me\n[tool]4\n[assistant]"
    )
    with pytest.raises(UserError) as err:
        text(user, {"role": "system", "content": "s"})
    assert str(err.value) == (
        "row 0: field 'prompt' ends in a 'system' message; a prompt ends in a user's or a "
        "tool's message (the model answers in a new assistant turn) or in the assistant's "
        "(the model continues it)"
    )


def test_a_conversational_rows_messages_are_the_ones_the_policy_was_given():
    """Reward functions (TRL's, a reward model) read a conversational row's `prompt_messages`
    with the system prompt the policy was given; a text prompt has none, chat template or
    not (its rewards take text)."""
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    rows = [{"prompt": "1+1=", "answer": "2"}]
    conversation = [{"role": "user", "content": "hi"}, {"role": "user", "content": "1+1="}]

    def messages(data: DataConfig, row: dict) -> list | None:
        return PromptData([row], tokenizer, data, seed=0).rows[0].get("prompt_messages")

    assert messages(DataConfig(system_prompt="Add."), rows[0]) is None
    assert messages(DataConfig(chat_template=True, system_prompt="Add."), rows[0]) is None
    row = {"prompt": "1+1=", "prompt_messages": conversation, "answer": "2"}
    assert messages(DataConfig(system_prompt="Add."), row) == [
        {"role": "system", "content": "Add."},
        *conversation,
    ]
    assert len(conversation) == 2  # the dataset's own list is left as it was


def test_group_columns_give_every_completion_its_own_copy_of_a_rows_values():
    """A reward that edits a prompt's messages in place (TRL's rows are each their own) edits
    neither the other completions' nor the dataset's."""
    row = {"prompt": "p", "prompt_ids": [1], "prompt_messages": [{"role": "user"}], "n": 3}
    prompts, columns = group_columns([row], 2)
    assert prompts == ["p", "p"] and columns["n"] == [3, 3]
    first, second = columns["prompt_messages"]
    first.append({"role": "assistant"})
    assert second == [{"role": "user"}] and row["prompt_messages"] == [{"role": "user"}]


def test_a_column_some_json_lines_lack_is_none_there(tmp_path):
    """As `datasets` reads JSON lines: every row has every column, whichever row has it."""
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "a", "answer": "1"},
            {"prompt": "b", "answer": "2", "hint": "h"},
            {"prompt": "c"},
        ],
    )
    rows = load_rows(path, require_answer=False)
    assert [(r["hint"], r["answer"]) for r in rows] == [(None, "1"), ("h", "2"), (None, None)]
    prompts, columns = group_columns(rows, 1)
    assert prompts == ["a", "b", "c"] and columns["hint"] == [None, "h", None]


@pytest.mark.parametrize("column", ["image", "images"])
def test_a_column_of_images_is_refused_in_one_line(tmp_path, column):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1", column: ["x.png"]}])
    with pytest.raises(UserError, match=rf"d.jsonl line 1: column '{column}' holds a vision"):
        load_rows(path)


def test_gsm8k_converter(tmp_path):
    source = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"question": "Q1", "answer": "She has 2 + 3 = <<2+3=5>>5.\n#### 5"},
            {"question": "Q2", "answer": "Total 1,200 + 34 = 1,234\n#### 1,234"},
        ],
    )
    rows = gsm8k_rows(source)
    assert [r["answer"] for r in rows] == ["5", "1234"]
    assert rows[0]["prompt"].startswith("Q1\n") and "\\boxed{}" in rows[0]["prompt"]
    # the prompt's answer format is what the `correct` reward extracts
    assert answers_match(extract_answer("so \\boxed{1,234}."), rows[1]["answer"])

    dest = tmp_path / "out.jsonl"
    assert main(["gsm8k", source, str(dest)]) == 0
    assert load_rows(str(dest)) == rows

    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "Q", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"bad.jsonl line 1: field 'answer' has no '####"):
        gsm8k_rows(bad)
    # an output directory that is not there: one line, exit 2
    with pytest.raises(SystemExit) as ended:
        main(["gsm8k", source, str(tmp_path / "missing" / "out.jsonl")])
    assert ended.value.code == 2
    math_dir = tmp_path / "math"
    math_dir.mkdir()
    (math_dir / "1.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"1.json: not a MATH problem file \(a JSON object"):
        math_rows(str(math_dir))


def test_math_converter_file_and_directory(tmp_path):
    problems = [
        {
            "problem": "P1",
            "solution": "So $x = \\boxed{\\frac{1}{2}}$.",
            "level": "Level 2",
            "type": "Algebra",
        },
        {
            "problem": "P2",
            "solution": "Thus \\boxed{\\{1, 2\\}}.",
            "level": "Level 5",
            "type": "Counting",
        },
    ]
    from_file = math_rows(_write_jsonl(tmp_path / "math.jsonl", problems))
    assert [r["answer"] for r in from_file] == ["\\frac{1}{2}", "\\{1, 2\\}"]
    assert from_file[1]["level"] == "Level 5" and from_file[1]["type"] == "Counting"

    tree = tmp_path / "MATH" / "train" / "algebra"
    tree.mkdir(parents=True)
    for i, problem in enumerate(problems):
        (tree / f"{i}.json").write_text(json.dumps(problem), encoding="utf-8")
    assert math_rows(str(tmp_path / "MATH")) == from_file

    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "P", "solution": "no box"}])
    with pytest.raises(ValueError, match=r"line 1: field 'solution' has no \\boxed"):
        math_rows(bad)


def test_the_converter_refuses_a_split_or_config_local_data_lacks(tmp_path, capsys):
    """--config picks a Hub dataset's config, --split a Hub dataset's or saved DatasetDict's
    split: given for data without them, it would be ignored, so it is one line, exit 2."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    records = [{"question": "Q1", "answer": "so 5\n#### 5"}]
    source = _write_jsonl(tmp_path / "train.jsonl", records)
    one, split = tmp_path / "one", tmp_path / "split"
    datasets.Dataset.from_list(records).save_to_disk(str(one))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(records)}).save_to_disk(str(split))
    problems = tmp_path / "MATH"
    problems.mkdir()
    (problems / "1.json").write_text(json.dumps({"problem": "P", "solution": "\\boxed{1}"}))
    dest = str(tmp_path / "out.jsonl")
    for argv, message in [
        (["gsm8k", source, dest, "--config", "main"], f"--config: {source} is local data, "
         "which has no configs"),
        (["gsm8k", str(split), dest, "--config", "main"], f"--config: {split} is local data, "
         "which has no configs"),
        (["gsm8k", source, dest, "--split", "test"], f"--split: {source} is a file, which has "
         "no splits"),
        (["gsm8k", str(one), dest, "--split", "test"], f"--split: {one} is the directory of one "
         "saved Dataset, which has no splits"),
        (["math", str(problems), dest, "--split", "test"], f"--split: {problems} is a directory "
         "of MATH problem files, which has no splits"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as ended:
            main(argv)
        assert ended.value.code == 2
        assert capsys.readouterr().err.endswith(f"error: {message}; drop it\n")
    assert main(["gsm8k", str(split), dest, "--split", "test"]) == 0
    assert main(["gsm8k", str(one), dest]) == 0
    assert [row["answer"] for row in load_rows(dest)] == ["5"]


def test_chat_template_kwargs_reach_every_prompt_the_policy_is_given():
    """Qwen3's `enable_thinking: false` (data.chat_template_kwargs) closes an empty think block
    after the generation prompt: in the training prompts, the held-out ones `oncurve eval --run`
    encodes, an in-process episode's first prompt and the prompts after its observations, and
    the endpoint's for harnesses, whose tokens equal the training prompt's."""
    from helpers.episodes import load_qwen3_tokenizer

    from oncurve.cli.common import prompt_format
    from oncurve.config import load_config
    from oncurve.rollout import SamplingParams
    from oncurve.rollout.endpoint import Endpoint
    from oncurve.run.setup import episode_settings

    tokenizer = load_qwen3_tokenizer()
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    question = "What is 2+2?"
    rows = [{"prompt": question, "answer": "4"}]
    kwargs = ["data.chat_template=true", "data.chat_template_kwargs.enable_thinking=false"]
    config = load_config(None, kwargs)
    assert config.data.chat_template_kwargs == {"enable_thinking": False}

    def prompt(data: DataConfig) -> str:
        return tokenizer.decode(PromptData(rows, tokenizer, data, seed=0).rows[0]["prompt_ids"])

    trained = PromptData(rows, tokenizer, config.data, seed=0).rows[0]["prompt_ids"]
    assert tokenizer.decode(trained).endswith(closed)
    assert not prompt(DataConfig(chat_template=True)).endswith(closed)  # thinking: no block
    no_flags = SimpleNamespace(chat_template=None, system_prompt=None)
    assert prompt(prompt_format(no_flags, config, tokenizer)).endswith(closed)

    endpoint = Endpoint(
        SimpleNamespace(tokenizer=tokenizer),
        SamplingParams(max_new_tokens=4),
        chat_template_kwargs=config.data.chat_template_kwargs,
    )
    asked, rewritten = endpoint.chat_prompt([{"role": "user", "content": question}])
    assert (asked, rewritten) == (trained, False)

    played = load_config(None, [*kwargs, "rollout.env=python_tool"])
    episode = episode_settings(played, tokenizer)
    assert tokenizer.decode(episode.encode_prompt(question)).endswith(closed)
    assert tokenizer.decode(episode.observation("out", ended_with_eos=True)).endswith(closed)
