import pytest

from oncurve.data.tasks import get_task
from oncurve.data.tasks.arith import ArithTask, prompt, solution
from oncurve.data.tasks.base import hash_split
from oncurve.errors import UserError
from oncurve.model.char_tokenizer import char_tokenizer


def test_solution_writes_column_sums_with_carries():
    assert solution(485, 37, 4) == " 12 12 05 00 <answer>522</answer>"
    assert solution(9999, 1, 4) == " 10 10 10 10 <answer>10000</answer>"
    assert solution(0, 0, 1) == " 00 <answer>0</answer>"
    with pytest.raises(ValueError, match="do not fit in 3 digits"):
        solution(1000, 1, 3)


def test_prompts_pad_both_operands_to_the_same_width():
    assert prompt(485, 37, 4) == "0485+0037="
    rows = ArithTask(max_digits=3).examples("train", 200, seed=0)
    assert {len(r["prompt"]) for r in rows} == {len("000+000=")}


@pytest.mark.parametrize("split", ["train", "test"])
def test_examples_are_seeded_and_correct(split):
    task = ArithTask()
    rows = task.examples(split, 300, seed=3)
    assert rows == task.examples(split, 300, seed=3)
    assert rows != task.examples(split, 300, seed=4)
    for row in rows:
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
        assert row["answer"] == str(a + b)
        assert row["solution"] == solution(a, b, task.max_digits)
        assert row["prompt"] == prompt(a, b, task.max_digits)


def test_train_and_test_never_overlap_across_seeds():
    task = ArithTask()
    train = {r["prompt"] for seed in range(3) for r in task.examples("train", 3000, seed)}
    test = {r["prompt"] for seed in range(3) for r in task.examples("test", 500, seed)}
    assert train.isdisjoint(test)
    assert all(hash_split(p) == "test" for p in test)
    assert all(hash_split(p) == "train" for p in train)


def test_completions_fit_the_default_rollout_budget():
    # The default run samples at most 64 new tokens; the reference completion plus EOS must fit
    # with room for a longer wrong attempt.
    rows = ArithTask().examples("train", 2000, seed=0)
    assert max(len(r["solution"]) for r in rows) + 1 <= 48


def test_tokenizer_round_trips_every_character_the_task_emits():
    tokenizer = char_tokenizer()
    rows = ArithTask().examples("test", 200, seed=0)
    for row in rows:
        text = row["prompt"] + row["solution"]
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert len(ids) == len(text) + 1  # one token per character
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_rewards_score_known_completions():
    fns = get_task("arith").reward_fns()
    prompts = ["0485+0037="] * 4
    completions = [
        " 12 12 05 <answer>522</answer>",  # right
        " 12 11 05 <answer>512</answer>",  # wrong answer, well formed
        " 12 12 05 522",  # right number, no tags
        " 12 12 05 <answer>522</answer> 12 <answer>1",  # runs on past the answer
    ]
    answers = ["522"] * 4
    assert fns["correct"](prompts, completions, answer=answers) == [1.0, 0.0, 0.0, 1.0]
    assert fns["format"](prompts, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0]
    assert ArithTask.reward_weights == {"correct": 1.0, "format": 0.1}


def test_correct_reward_pays_only_the_integer_sum():
    correct = get_task("arith").reward_fns()["correct"]
    completions = [
        " <answer>0522</answer>",  # leading zeros: still the number
        " <answer>0485+0037</answer>",  # the question copied: equal to the sum, not the sum
        " <answer>522.0</answer>",
        " <answer>5 22</answer>",
        " <answer>1044/2</answer>",
    ]
    n = len(completions)
    assert correct(["0485+0037="] * n, completions, answer=["522"] * n) == [1.0] + [0.0] * 4
    # a reference that is no integer (a data file's) leaves its row unscored, not a crash or 0
    golds = ["x46", None, "", 522, " 522 "]
    assert correct(["q"] * 5, [" <answer>522</answer>"] * 5, answer=golds) == [None] * 3 + [1.0] * 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "valid", "n": 1, "seed": 0}, "split must be one of train, test"),
        ({"split": "train", "n": -1, "seed": 0}, "n must be non-negative"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithTask().examples(**kwargs)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"max_digits": 0}, "max_digits must be a whole number in [1, 999], got 0"),
        ({"max_digits": 4.0}, "max_digits must be a whole number in [1, 999], got 4.0"),
        ({"max_digits": True}, "max_digits must be a whole number in [1, 999], got True"),
        # a sum of 1,000 digits is past what `correct` reads (MAX_ANSWER_CHARS); 10^30 digits
        # hung the operand draw at start-up
        ({"max_digits": 1000}, "max_digits must be a whole number in [1, 999], got 1000"),
        ({"max_digits": 10**30}, f"max_digits must be a whole number in [1, 999], got {10**30}"),
        ({"min_digits": 2.5}, "min_digits must be a whole number in [1, max_digits=4], got 2.5"),
        ({"min_digits": 5}, "min_digits must be a whole number in [1, max_digits=4], got 5"),
        (
            {"max_digits": 3, "min_digits": False},
            "min_digits must be a whole number in [1, max_digits=3], got False",
        ),
    ],
)
def test_task_options_that_are_no_digit_counts_are_one_line(options: dict, why: str) -> None:
    """A digit count must be an int: a float or bool would pass a bounds check and then break
    the zero-padding format or the operand draw; a sum must have fewer digits than an answer
    `correct` reads."""
    with pytest.raises(UserError) as refused:
        get_task("arith", options)
    assert str(refused.value) == f"data.task_options {options} do not fit task arith: {why}"


def test_test_problems_are_distinct_and_train_problems_may_repeat():
    # Only 100 one-digit sums exist, about 10 of them in the test split.
    task = ArithTask(max_digits=1)
    assert len(task.examples("train", 500, seed=0)) == 500
    with pytest.raises(ValueError, match="only .* distinct test problems"):
        task.examples("test", 50, seed=0)
    rows = ArithTask().examples("test", 500, seed=0)
    assert len({r["prompt"] for r in rows}) == 500


def test_no_held_out_problem_has_its_commuted_twin_in_training():
    """`a+b=` and `b+a=` are one problem to learn: a held-out sum whose operands swapped are a
    training prompt would measure recall, not addition."""
    task = ArithTask()
    train = {r["prompt"] for seed in range(3) for r in task.examples("train", 3000, seed)}
    for row in task.examples("test", 500, seed=0):
        a, b = (int(x) for x in row["prompt"].rstrip("=").split("+"))
        twin = prompt(b, a, task.max_digits)
        assert hash_split(twin) == "test" and twin not in train
