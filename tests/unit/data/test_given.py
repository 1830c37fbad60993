"""Datasets passed to `oncurve.train` as TRL takes them (a `datasets.Dataset`, a list of dict
rows): read through a file's reading and checks while held, named by their argument in errors,
and refused in one line where oncurve cannot train on them."""

from __future__ import annotations

import itertools
import json

import pytest

from oncurve.data.files import load_rows
from oncurve.data.given import check_dataset, first_rows, holding, streams
from oncurve.errors import UserError

# TRL's conversational form, the gold as a GSM8K solution under TRL's `solution`, a column more
TRL_ROWS = [
    {
        "prompt": [{"role": "user", "content": f"{i}+{i}="}],
        "solution": f"{i} plus {i}\n#### {2 * i}",
        "difficulty": i % 3,
    }
    for i in range(3)
]


def _given_rows(dataset, **kwargs) -> list[dict]:
    with holding({"train_dataset": dataset}):
        return load_rows("given:train_dataset", **kwargs)


def _refusal(dataset, **kwargs) -> str:
    with pytest.raises(UserError) as err:
        _given_rows(dataset, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def _fake_refusal(dataset) -> str:
    with pytest.raises(UserError) as err:
        check_dataset("train_dataset", dataset)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_given_rows_read_as_the_same_rows_in_a_file(tmp_path):
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in TRL_ROWS))
    from_file = load_rows(str(path))
    given = _given_rows(TRL_ROWS)
    assert given == from_file
    assert [row["answer"] for row in given] == ["0", "2", "4"]  # answer_format auto: gsm8k
    assert given[2]["solution"] == TRL_ROWS[2]["solution"]
    assert given[1]["prompt_messages"] == TRL_ROWS[1]["prompt"]
    assert [row.where for row in given] == ["train_dataset row 1", "train_dataset row 2",
                                            "train_dataset row 3"]  # fmt: skip
    assert {row.answer_field for row in given} == {"solution"}
    # reading takes the prompt out of its copy of each row, not out of the caller's rows
    assert TRL_ROWS[0]["prompt"] == [{"role": "user", "content": "0+0="}]


def test_a_datasets_dataset_reads_as_its_list_of_rows():
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    assert _given_rows(datasets.Dataset.from_list(TRL_ROWS)) == _given_rows(TRL_ROWS)


def test_an_object_with_a_length_that_yields_rows_reads_as_they_do():
    class Rows:
        column_names = ["prompt", "solution", "difficulty"]

        def __len__(self):
            return len(TRL_ROWS)

        def __iter__(self):
            return iter(TRL_ROWS)

    assert _given_rows(Rows()) == _given_rows(TRL_ROWS)


def test_a_given_rows_problem_is_one_line_naming_the_argument_row_and_column():
    rows = [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": " "}]
    assert _refusal(rows, prompt_field="question") == (
        "train_dataset row 2: missing field 'answer' (its value is empty)"
    )
    assert _refusal(rows) == (
        "train_dataset row 1: missing field 'prompt' (fields: question, answer)"
    )
    assert _refusal([{"prompt": "1+1=", "answer": "2", "image": None}]) == (
        "train_dataset row 1: column 'image' holds a vision-language model's images, which "
        "oncurve does not train on (text-only models); drop the column to train on the text"
    )
    assert _refusal([{"prompt": "1+1=", "answer": "2", "completions": 1}]).startswith(
        "train_dataset row 1: column 'completions' is a name the trainer passes reward functions"
    )
    assert _refusal([{"prompt": "1+1=", "answer": "2"}, "2+2="]) == (
        "train_dataset row 2: expected a dict of columns, got str"
    )
    assert _refusal([{"prompt": "1+1=", "answer": "2", 3: "x"}]) == (
        "train_dataset row 1: column 3 is not named by text"
    )
    assert _refusal([]) == "train_dataset: empty, no rows"


def test_a_dataset_not_held_is_one_line_saying_to_pass_it_again():
    with holding({"eval_dataset": TRL_ROWS}):
        assert len(load_rows("given:eval_dataset")) == 3
        with pytest.raises(UserError) as err:  # held as another argument: not this one
            load_rows("given:train_dataset")
    assert str(err.value) == (
        "data.path given:train_dataset: the train_dataset passed to oncurve.train, which is not "
        "given here; pass it again: oncurve.train(config, train_dataset=...)"
    )
    with pytest.raises(UserError, match=r"^eval.path given:eval_dataset: the eval_dataset "):
        load_rows("given:eval_dataset")  # the block has ended: released


def test_what_oncurve_cannot_train_on_is_refused_before_reading():
    assert _fake_refusal("data.jsonl") == (
        "train_dataset: expected a datasets.Dataset or a list of dict rows, got str"
    )
    assert _fake_refusal(TRL_ROWS[0]).endswith("rows, got dict")


def test_a_dataset_dict_and_image_features_are_refused():
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    train = datasets.Dataset.from_list(TRL_ROWS)
    assert _fake_refusal(datasets.DatasetDict({"train": train})) == (
        "train_dataset: expected a datasets.Dataset or a list of dict rows, got DatasetDict: "
        "pass one split, train_dataset=dataset['train']"
    )
    check_dataset("train_dataset", train.to_iterable_dataset())  # streamed: read as needed
    images = {
        "picture": datasets.Image(),
        "pages": datasets.List(datasets.Image()),
        "shot": {"frame": datasets.Image()},
    }
    for name, feature in images.items():
        features = datasets.Features({"prompt": datasets.Value("string"), name: feature})
        pictured = datasets.Dataset.from_dict({"prompt": ["1+1="], name: [None]}, features)
        assert _fake_refusal(pictured) == (
            f"train_dataset: column {name!r} holds a vision-language model's images, which "
            "oncurve does not train on (text-only models); drop the column to train on the text"
        )
    check_dataset("train_dataset", train)  # text columns alone: taken


def test_a_dict_of_eval_datasets_is_refused_naming_one_to_pass():
    """TRL evaluates each dataset of a dict passed as `eval_dataset` (and of a `DatasetDict`);
    oncurve evaluates one held-out set: refused in one line saying so and naming one."""
    with pytest.raises(UserError) as err:
        check_dataset("eval_dataset", {"easy": TRL_ROWS, "hard": TRL_ROWS[:1]})
    assert str(err.value) == (
        "eval_dataset: a dict of 2 datasets ('easy', 'hard'), each of which TRL evaluates; "
        "oncurve evaluates one held-out set: pass one, eval_dataset=eval_dataset['easy']"
    )


@pytest.mark.parametrize("kind", ["torch", "numpy", "pandas", "arrow"])
def test_a_dataset_formatted_as_arrays_is_refused_naming_its_format(kind):
    """`set_format("torch")` makes a number column a tensor, whose text (`tensor(2)`) would be
    read as the answer: refused in one line naming the format and what to pass."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    pytest.importorskip("torch" if kind == "torch" else "numpy")
    numbers = datasets.Dataset.from_list([{"prompt": "1+1=", "answer": 2}])
    assert _fake_refusal(numbers.with_format(kind)) == (
        f"train_dataset: formatted as {kind!r} (set_format), its columns come as tensors, arrays "
        "or tables; oncurve reads rows as stored: pass train_dataset.with_format(None)"
    )
    custom = numbers.with_transform(lambda batch: batch)  # a transform of Python values: taken
    check_dataset("train_dataset", custom)
    assert [row["answer"] for row in _given_rows(custom)] == ["2"]
    assert [row["answer"] for row in _given_rows(numbers.with_format(None))] == ["2"]


def test_a_data_frame_is_refused_naming_the_dataset_to_make_of_it():
    pandas = pytest.importorskip("pandas", reason="pandas not installed")
    frame = pandas.DataFrame(TRL_ROWS)
    assert _fake_refusal(frame) == (
        "train_dataset: expected a datasets.Dataset or a list of dict rows, got DataFrame: pass "
        "train_dataset=datasets.Dataset.from_pandas(frame)"
    )


@pytest.mark.parametrize("conversational", [False, True], ids=["plain", "conversational"])
def test_a_datasets_columns_reach_trl_rewards_as_stored(conversational):
    """What TRL passes a reward for each column, `[row[column] for each completion]` of the
    rows as the `Dataset` yields them (numbers, lists, dicts, None), reaches it here alike."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    from oncurve.data.prompts import group_columns
    from oncurve.rewards.runner import RewardRunner
    from oncurve.rewards.trl_contract import TrainerState, TrlReward

    stored = ["count", "ratio", "flag", "tags", "meta", "note"]
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{i}+{i}="}] if conversational else f"{i}+{i}=",
            "answer": str(2 * i),
            "count": i,
            "ratio": i / 2,
            "flag": i == 1,
            "tags": [i, i + 1],
            "meta": {"k": i, "s": [0.5]},
            "note": None if i == 0 else "seen",
        }
        for i in range(2)
    ]
    dataset = datasets.Dataset.from_list(rows)
    passed = {}

    def spy(prompts, completions, **kwargs):
        passed.update(kwargs, prompts=prompts)
        return [0.0] * len(completions)

    prompts, columns = group_columns(_given_rows(dataset), 2)
    completions = ["a", "b", "c", "d"]
    if conversational:
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    with RewardRunner([("spy", TrlReward(spy), 1.0)], timeout_s=None) as runner:
        runner.score(prompts, completions, columns, TrainerState(0, 1))
    for column in ["prompt", "answer", *stored]:
        trl = [row[column] for row in dataset for _ in range(2)]
        given = passed["prompts" if column == "prompt" else column]
        assert given == trl and list(map(type, given)) == list(map(type, trl)), column


def test_a_stream_is_read_as_far_as_the_run_needs_and_no_further():
    """An `IterableDataset` (`load_dataset(..., streaming=True)`), endless here, yields the
    rows a run needs and no more; one that ends first gives what it has; each reading starts
    the stream again, so a resumed run given it again reads the same rows."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    made = []

    def endless():
        for i in itertools.count():
            made.append(i)
            yield {"prompt": f"{i}+{i}=", "answer": str(2 * i)}

    stream = datasets.IterableDataset.from_generator(endless)
    assert streams(stream) and not streams(TRL_ROWS)
    assert not streams(datasets.Dataset.from_list(TRL_ROWS))
    check_dataset("train_dataset", stream)
    rows = first_rows(stream, 5)
    assert [row["answer"] for row in rows] == ["0", "2", "4", "6", "8"]
    assert len(made) == 5  # nothing read past the rows needed
    assert first_rows(stream, 5) == rows
    assert _given_rows(rows) == _given_rows([dict(row) for row in rows])
    ended = datasets.Dataset.from_list(TRL_ROWS).to_iterable_dataset()
    assert first_rows(ended, 5) == TRL_ROWS


def test_a_stream_that_is_not_a_datasets_one_is_read_as_one():
    class Streamed:  # an IterableDataset's shape: rows one by one, no length
        column_names = ["prompt"]

        def __iter__(self):
            return iter(TRL_ROWS)

    assert streams(Streamed())
    check_dataset("train_dataset", Streamed())
    assert first_rows(Streamed(), 2) == TRL_ROWS[:2]
    assert first_rows((row for row in TRL_ROWS), 9) == TRL_ROWS


@pytest.mark.parametrize("given", [True, False], ids=["eval_dataset", "eval.path"])
def test_held_out_rows_without_answers_are_refused_saying_what_evaluation_reads(given, tmp_path):
    """TRL scores an `eval_dataset` with the reward functions; oncurve's evaluation is held-out
    accuracy against each row's reference answer: rows without one are refused in one line
    that says so, while the training rows need none for rewards of their own."""
    from oncurve.config import load_config
    from oncurve.data.prompts import load_prompts

    rows = [{"prompt": f"Say {i}"} for i in range(3)]
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config(None, [
        "data.path=given:train_dataset",
        f"eval.path={'given:eval_dataset' if given else path}",
        "reward.functions=[helpers.rewards_for_tests:think_format_reward]",
    ])  # fmt: skip
    source, fix = (
        ("eval_dataset row", "pass no eval_dataset")
        if given
        else (f"{path} line", "unset eval.path")
    )
    with (
        holding({"train_dataset": rows, "eval_dataset": rows}),
        pytest.raises(UserError) as err,
    ):
        load_prompts(config)
    assert str(err.value) == (
        f"{source} 1: missing field 'answer' (fields: prompt); held-out evaluation scores "
        "each row's greedy completion against its reference answer ('answer', 'solution' or "
        "data.answer_field) with the correctness reward, where TRL's eval_dataset is scored by "
        f"the reward functions: add the answers, or {fix}"
    )


def test_a_tensor_or_array_in_a_row_is_refused_as_formatted_rows_are():
    """Rows that hold tensors or arrays (a stream formatted with `with_format("torch")`, whose
    format is not told by the dataset, or a transform's) would read `tensor(4)` as the answer:
    refused in one line naming the row and column; NumPy's scalars read as their numbers."""
    torch = pytest.importorskip("torch")
    numpy = pytest.importorskip("numpy")
    assert _refusal([{"prompt": "2+2=", "answer": torch.tensor(4)}]) == (
        "train_dataset row 1: column 'answer' holds a torch Tensor (rows formatted as tensors "
        "or arrays, with_format('torch') say); oncurve reads rows as stored: pass "
        "train_dataset.with_format(None)"
    )
    assert _refusal([{"prompt": "2+2=", "answer": "4", "ids": numpy.array([1, 2])}]).startswith(
        "train_dataset row 1: column 'ids' holds a numpy ndarray"
    )
    rows = _given_rows([{"prompt": "2+2=", "answer": numpy.int64(4)}])
    assert rows[0]["answer"] == "4"
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    stream = datasets.Dataset.from_list([{"prompt": "2+2=", "answer": 4}]).to_iterable_dataset()
    check_dataset("train_dataset", stream.with_format("torch"))  # not told by the dataset
    assert _refusal(first_rows(stream.with_format("torch"), 1)).startswith(
        "train_dataset row 1: column 'answer' holds a torch Tensor"
    )
