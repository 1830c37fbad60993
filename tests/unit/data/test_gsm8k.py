"""Real datasets as they are on the Hub: GSM8K's worked solutions, MATH's boxed answers, prompt
templates, conversational prompts, the gold-answer check before step 1 and the dead-step
warning, and configs/gsm8k_qwen2.5_0.5b.yaml run end to end on a GSM8K-shaped dataset served
offline from a local Hugging Face datasets cache."""

import json
from dataclasses import replace

import pytest
from helpers.paths import REPO

from oncurve.config import DataConfig, RewardFnConfig, load_config
from oncurve.data.files import final_answer, load_rows
from oncurve.data.prompts import correctness_name, encode_prompt
from oncurve.data.tasks import get_task
from oncurve.errors import UserError
from oncurve.loop.reward_signal import DeadStepWatch, check_gold_answers, stated_answer
from oncurve.rewards.registry import resolve_reward

COMMIT = "e53f048856ff4f594e959d75785d2c2d37b678ee"


def gsm8k_record(i: int) -> dict[str, str]:
    """A GSM8K-shaped record: GSM8K's column names, a worked solution ending in `#### n`, with
    a thousands comma past 999 as GSM8K writes them."""
    total = 600 * i
    return {
        "question": f"Ann has {300 * i} pens and buys {300 * i} more. How many now?",
        "answer": f"She has {300 * i}+{300 * i}=<<{300 * i}+{300 * i}={total}>>{total} pens.\n"
        f"#### {total:,}",
    }


@pytest.fixture
def gsm8k_hub_cache(tmp_path, monkeypatch):
    """`openai/gsm8k` (config main, splits train and test) in a Hugging Face datasets cache laid
    out as a first `load_dataset` with network leaves it, read with the Hub offline."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    import huggingface_hub
    from datasets.packaged_modules.json.json import Json

    files = {}
    for split, count in (("train", 12), ("test", 4)):
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps(gsm8k_record(i)) + "\n" for i in range(1, count + 1)))
        files[split] = str(path)
    cache = tmp_path / "hf-datasets"
    # prepared as the Hub's parquet files are, into the directory names a Hub load uses
    builder = Json(
        cache_dir=str(cache),
        dataset_name="gsm8k",
        config_name="main",
        data_files=files,
        hash=COMMIT,
    )
    builder.download_and_prepare()
    (prepared,) = (cache / "gsm8k").iterdir()  # main-<hash of the data files>
    (cache / "openai___gsm8k").mkdir()
    prepared.rename(cache / "openai___gsm8k" / "main")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.mark.parametrize(
    ("value", "answer_format", "expected"),
    [
        ("She has 2+3=<<2+3=5>>5.\n#### 5", "auto", "5"),
        ("so 600+600=1,200.\n#### 1,200", "gsm8k", "1200"),
        ("#### Step 1\nadd them: \\boxed{\\frac{1}{2}}", "auto", "\\frac{1}{2}"),
        ("#### Step 1\nthen 7", "auto", "#### Step 1\nthen 7"),  # a heading, not an answer line
        ("42", "auto", "42"),
        ("it is 3.5 metres wide and 4 feet tall", "last_number", "4"),
        ("She has 5.\n#### 5", "raw", "She has 5.\n#### 5"),
        ("no answer line", "gsm8k", None),
    ],
)
def test_the_final_answer_is_read_off_the_answer_column(value, answer_format, expected):
    assert final_answer(value, answer_format) == expected


def test_gsm8k_from_the_hub_reads_its_final_answers_and_keeps_the_solutions(gsm8k_hub_cache):
    rows = load_rows("openai/gsm8k", "question", "answer", config="main", split="test")
    assert [row["answer"] for row in rows] == ["600", "1200", "1800", "2400"]
    assert rows[1]["answer_raw"].endswith("\n#### 1,200")
    assert rows[1]["prompt"] == "Ann has 600 pens and buys 600 more. How many now?"
    assert rows[1].where == "openai/gsm8k test row 2"
    raw = load_rows("openai/gsm8k", "question", "answer", "main", "test", answer_format="raw")
    assert raw[0]["answer"].endswith("#### 600") and "answer_raw" not in raw[0]


def test_a_format_that_finds_no_answer_names_the_row_field_and_setting(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "p", "answer": "no final line"}) + "\n")
    with pytest.raises(UserError) as err:
        load_rows(str(path), answer_format="gsm8k")
    assert str(err.value).startswith(f"{path} line 1: field 'answer' has no gsm8k answer")
    assert "data.answer_format" in str(err.value) and "\n" not in str(err.value)


def test_a_prompt_template_fills_columns_and_keeps_latex_braces(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "1/2+1/2?", "solution": "It is \\boxed{1}."}) + "\n")
    template = "{problem}\nPut the answer in \\boxed{}; {{literal}}"
    (row,) = load_rows(str(path), "problem", "solution", prompt_template=template)
    assert row["prompt"] == "1/2+1/2?\nPut the answer in \\boxed{}; {literal}"
    assert (row["answer"], row["answer_raw"]) == ("1", "It is \\boxed{1}.")
    with pytest.raises(
        UserError, match=r"line 1: missing data.prompt_template's column 'question'"
    ):
        load_rows(str(path), answer_field="solution", prompt_template="{question}")


def _rows_file(tmp_path, row: dict) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**row, "answer": "2"}) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("row", "template", "prompt"),
    [
        ({"Question Text": "1+1?"}, "Solve: {Question Text}", "Solve: 1+1?"),
        ({"problem-text": "1+1?"}, "{problem-text} Think.", "1+1? Think."),
    ],
)
def test_a_prompt_template_names_columns_as_the_data_spells_them(tmp_path, row, template, prompt):
    (loaded,) = load_rows(_rows_file(tmp_path, row), prompt_template=template)
    assert loaded["prompt"] == prompt


@pytest.mark.parametrize(
    ("row", "template", "error"),
    [
        # no column named: every prompt would be this text
        ({"question": "1+1?"}, "Q: { question }", "uses none of the data's columns (question,"),
        ({"question": None}, "Q: {question}", "column 'question' (its value is null)"),
        ({"question": [1, 2]}, "Q: {question}", "column 'question' holds list, not text"),
        ({"question": " "}, "{question}", "line 1: the prompt (data.prompt_template) is empty"),
        ({"prompt": ""}, None, "line 1: the prompt ('prompt') is empty"),
    ],
)
def test_a_prompt_that_asks_nothing_or_the_same_of_every_row_is_one_line(
    tmp_path, row, template, error
):
    with pytest.raises(UserError) as refused:
        load_rows(_rows_file(tmp_path, row), prompt_template=template)
    assert error in str(refused.value) and "\n" not in str(refused.value)


def test_the_answer_column_is_required_only_when_asked(tmp_path):
    path = tmp_path / "open.jsonl"
    path.write_text(json.dumps({"prompt": "Write a haiku."}) + "\n")
    with pytest.raises(UserError, match=r"line 1: missing field 'answer' \(fields: prompt\)"):
        load_rows(str(path))
    assert load_rows(str(path), require_answer=False) == [
        {"prompt": "Write a haiku.", "answer": None}
    ]
    config = load_config(
        None, [f"data.path={path}", "reward.functions=[helpers.rewards_for_tests:count_digits]"]
    )
    from oncurve.data.prompts import load_prompts

    assert load_prompts(config)[0][0]["prompt"] == "Write a haiku."


class ChatTokenizer:
    """The two calls `encode_prompt` makes, recording the messages it renders."""

    chat_template = "{{ messages }}"

    def __init__(self):
        self.rendered = []

    def apply_chat_template(self, messages, **kwargs):
        self.rendered.append(messages)
        return list(range(len(messages)))

    def __call__(self, text):
        return {"input_ids": [0] * len(text)}


def test_conversational_prompts_are_rendered_with_the_chat_template(tmp_path):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": messages, "answer": "4"}) + "\n")
    (row,) = load_rows(str(path))
    assert (row["prompt"], row["prompt_messages"]) == ("2+2?", messages)
    tokenizer = ChatTokenizer()
    data = DataConfig(chat_template=False, system_prompt="ignored: the row has one")
    ids = encode_prompt(tokenizer, row["prompt"], data, "x", messages=row["prompt_messages"])
    assert (ids, tokenizer.rendered) == ([0, 1], [messages])
    tokenizer.chat_template = None
    with pytest.raises(UserError, match="x: field 'prompt' is a list of messages, and the"):
        encode_prompt(tokenizer, row["prompt"], data, "x", messages=row["prompt_messages"])
    path.write_text(json.dumps({"prompt": [{"text": "hi"}], "answer": "4"}) + "\n")
    with pytest.raises(UserError, match="line 1: field 'prompt' is a list but not of"):
        load_rows(str(path))
    # a text prompt under data.chat_template with a tokenizer that has none: one line
    with pytest.raises(UserError, match="x: data.chat_template=true, but the model's tokenizer"):
        encode_prompt(tokenizer, "2+2?", DataConfig(chat_template=True), "x")


def test_raw_gsm8k_answers_stop_the_run_before_step_1_and_extracted_ones_pass(
    gsm8k_hub_cache,
):
    correct = resolve_reward("correct")[1]
    template = "{question}\nPut your final answer within \\boxed{}."
    settings = ("openai/gsm8k", "question", "answer", "main", "train")
    raw = load_rows(*settings, prompt_template=template, answer_format="raw")
    with pytest.raises(UserError) as err:
        check_gold_answers(raw, correct, "answer")
    message = str(err.value)
    assert message.startswith("openai/gsm8k train row 1: the correctness reward scores 0.0 for")
    assert "'The final answer is \\\\boxed{600}.'" in message
    assert "data.answer_format" in message and "\n" not in message
    rows = load_rows(*settings, prompt_template=template)
    assert check_gold_answers(rows, correct, "answer").startswith("gold answers: 4 rows'")
    assert stated_answer(rows[1]["answer_raw"]) == "1200"


def test_the_dead_step_warning_comes_once_per_streak(capsys):
    watch = DeadStepWatch(3)
    dead = {"groups/all_equal_frac": 1.0, "reward/mean": 0.0, "length/truncated_frac": 1.0}
    alive = {"groups/all_equal_frac": 0.5}
    said = [watch.update(m) for m in [dead, dead, alive, dead, dead, dead, dead, dead]]
    assert [s is not None for s in said] == [False] * 5 + [True, False, False]
    assert said[5].startswith("warning: every group has been all-equal (no gradient) for 3 steps")
    assert "data.answer_format" in said[5] and "rollout.max_new_tokens" in said[5]
    assert capsys.readouterr().err == said[5] + "\n"
    assert DeadStepWatch(0).update(dead) is None


def test_the_gsm8k_recipe_trains_end_to_end_from_the_hub_cache(
    gsm8k_hub_cache, tiny_model_dir, tmp_path, capsys
):
    from oncurve.loop.trainer import setup, train

    run_dir = tmp_path / "run"
    overrides = [
        # the recipe's model and batch are a GPU's; its data, reward and schedule are tested
        f"model.path={tiny_model_dir}",
        "data.chat_template=false",  # the tiny model's tokenizer has no chat template
        "data.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "run.device=cpu",
        "run.steps=2",
        "eval.every=1",
        "run.save_every=1",
        f"run.dir={run_dir}",
    ]
    recipe = load_config(REPO / "configs" / "gsm8k_qwen2.5_0.5b.yaml", overrides)
    assert (recipe.data.path, recipe.data.config, recipe.eval.path) == (
        "openai/gsm8k",
        "main",
        "openai/gsm8k",
    )
    result = train(recipe, quiet=True)
    err = capsys.readouterr().err
    assert "gold answers: 4 rows' answers, stated as their prompts ask, score 1" in err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evaluated] == [0, 1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1].endswith("2")
    assert result.eval_after is not None
    # the same recipe comparing with the whole worked solutions stops before step 1
    raw = replace(recipe, data=replace(recipe.data, answer_format="raw"))
    raw.run = replace(recipe.run, dir=str(tmp_path / "raw"))
    with pytest.raises(UserError, match=r"train row 1: the correctness reward scores 0.0 for"):
        train(raw, quiet=True)
    assert not (tmp_path / "raw" / "metrics.jsonl").exists()
    # the check is the data's, not the numerics preflight's: run.preflight=false keeps it
    unchecked = replace(raw, run=replace(raw.run, dir=str(tmp_path / "unchecked"), preflight=False))
    with pytest.raises(UserError, match=r"train row 1: the correctness reward scores 0.0 for"):
        train(unchecked, quiet=True)
    # rewards of the run's own that do not read the answers train on the same rows; a note
    # says that held-out accuracy, which reads them, will not mean much
    own = replace(raw, reward=replace(raw.reward, functions=[RewardFnConfig("format")]))
    own.run = replace(raw.run, dir=str(tmp_path / "own"), steps=1)
    train(own, quiet=True)
    err = capsys.readouterr().err
    assert "note: gold answers: openai/gsm8k train row 1: the correctness reward scores 0.0" in err
    assert "held-out accuracy" in err
    assert (tmp_path / "own" / "metrics.jsonl").exists()
    # the reward tells a right answer from a wrong one on these rows
    s = setup(replace(recipe, run=replace(recipe.run, dir=str(tmp_path / "again"))))
    s.rewards.close()
    row = s.data.rows[0]
    right = f"The final answer is \\boxed{{{row['answer']}}}."
    scores = s.correct([row["prompt"]] * 2, [right, "The final answer is \\boxed{-1}."],
                       answer=[row["answer"]] * 2, answer_raw=[row["answer_raw"]] * 2)  # fmt: skip
    assert scores == [1.0, 0.0]


def test_eval_scores_a_hub_dataset_with_the_correct_reward_and_says_so(
    gsm8k_hub_cache, tiny_model_dir, tmp_path, capsys
):
    from oncurve.cli import main

    out = tmp_path / "rows.jsonl"
    argv = ["eval", "--device", "cpu", "--model", str(tiny_model_dir), "--max-new-tokens", "4"]
    hub = ["--data", "openai/gsm8k", "--config", "main", "--prompt-field", "question"]
    assert main([*argv, *hub, "--out", str(out)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (got["n"], got["scorer"], got["prompt_format"]["answer_format"]) == (
        4,
        "correct",
        "auto",
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["answer"] for row in rows] == ["600", "1200", "1800", "2400"]  # the test split
    # a dataset without answers, scored by a reward that reads none
    open_ended = tmp_path / "open.jsonl"
    open_ended.write_text(json.dumps({"prompt": "Say 7."}) + "\n")
    assert (
        main(
            [*argv, "--data", str(open_ended), "--reward", "helpers.rewards_for_tests:count_digits"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["scorer"] == "count_digits"
    assert main([*argv, "--data", str(open_ended)]) == 2
    assert "line 1: missing field 'answer' (fields: prompt)" in capsys.readouterr().err


def test_the_converter_reads_a_hub_id_at_a_config_and_split(gsm8k_hub_cache, tmp_path, capsys):
    from oncurve.data.tasks.convert import INSTRUCTION, main

    out = tmp_path / "gsm8k_test.jsonl"
    assert main(["gsm8k", "openai/gsm8k", str(out), "--config", "main", "--split", "test"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["answer"] for row in rows] == ["600", "1200", "1800", "2400"]
    assert rows[0]["prompt"] == gsm8k_record(1)["question"] + INSTRUCTION
    assert capsys.readouterr().out == f"wrote 4 rows to {out}\n"


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["data.path=d.jsonl"], "correct"),
        (["data.path=d.jsonl", "reward.answer_match=lenient"], "correct"),
        (["data.path=d.jsonl", "reward.functions=[code_tests]"], "code_tests"),
        (["data.task=countdown"], "countdown task's correct"),
        (
            ["data.path=d.jsonl", "rollout.env=helpers.rewards_for_tests:DigitsEnv"],
            "rollout.env helpers.rewards_for_tests:DigitsEnv: the episode's reward",
        ),
    ],
)
def test_evaluation_names_the_reward_that_decides_correctness(overrides, name) -> None:
    """The name an evaluation's warnings give the reward `correctness_fn` picks: the
    environment's episode reward, the task's `correct`, `code_tests` for a run its tests score,
    else `correct` (strict or lenient)."""
    config = load_config(None, overrides)
    task = None if config.data.path else get_task(config.data.task)
    assert correctness_name(config, task) == name
