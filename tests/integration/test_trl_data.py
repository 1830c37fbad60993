"""A dataset prepared for TRL's `GRPOTrainer` (prompts as messages, the gold as `solution`,
other columns for the rewards) trains with nothing but its path, or passed to `oncurve.train`
as TRL's `train_dataset` takes it, and reward functions written
as TRL documents them train unchanged: their logged columns land in samples.jsonl, their
logged metrics in metrics.jsonl."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml
from helpers.models import tiny_qwen2
from helpers.runs import metric_rows

import oncurve
from oncurve.cli import main
from oncurve.errors import UserError
from oncurve.run.metrics import read_jsonl

TRL_REWARDS = ", ".join(
    f"helpers.rewards_for_tests:{name}"
    for name in ("think_format_reward", "accuracy_reward", "logging_reward", "async_length_reward")
)


def trl_dataset(path, rows: int = 8):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": [{"role": "user", "content": f"{i}+{i}="}],
                    "solution": str(2 * i),
                    "difficulty": i % 3,
                }
            )
            + "\n"
            for i in range(rows)
        )
    )
    return path


def test_a_trl_dataset_and_trl_rewards_train_unchanged(chat_model_dir, tmp_path, capsys):
    data = trl_dataset(tmp_path / "trl.jsonl")
    short = [f"model.path={chat_model_dir}", "run.steps=2", "data.prompts_per_step=2",
             "rollout.group_size=2", "rollout.max_new_tokens=6", "run.device=cpu",
             "eval.at_start_end=false", "run.preflight=false"]  # fmt: skip
    assert main(["train", f"data.path={data}", *short, f"run.dir={tmp_path / 'a'}"]) == 0
    assert "reference answers from column 'solution'" in capsys.readouterr().err

    run = tmp_path / "b"
    rewards = f"reward.functions=[{TRL_REWARDS}]"
    # each step samples once and takes mu x minibatches = 4 optimizer steps: TRL's
    # steps_per_generation=2 with gradient_accumulation_steps=1 and num_iterations=2
    update = ["algo.mu=2", "algo.minibatches=2"]
    assert main(["train", f"data.path={data}", rewards, *short, *update, f"run.dir={run}"]) == 0
    samples = read_jsonl(run / "samples.jsonl")
    # optimizer steps done before the sampling, and in the run, as TRL's global_step and max_steps
    assert {s["step_seen"] for s in samples} == {0, 4}
    assert {s["of_steps"] for s in samples} == {8}
    assert all(s["asked"] == s["prompt"] for s in samples)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics if "logging_reward/tokens" in m] == [1, 2]
    assert all(1 <= m["logging_reward/tokens"] <= 6 for m in metrics if m["step"] > 0)
    assert {"reward/accuracy_reward", "reward/async_length_reward"} <= metrics[-1].keys()


def test_a_prompt_template_through_the_chat_template_is_conversational(chat_model_dir, tmp_path):
    """TRL's recipe maps plain columns to a `prompt` of messages; oncurve's `prompt_template`
    with `data.chat_template` is that map, so the same conversational rewards read it."""
    data = tmp_path / "plain.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"{i}+{i}=", "solution": str(2 * i)}) + "\n" for i in range(4)
        )
    )
    run = tmp_path / "run"
    assert main([
        "train", f"data.path={data}", "data.prompt_template={question} Answer:",
        "data.chat_template=true", f"reward.functions=[{TRL_REWARDS}]", f"model.path={chat_model_dir}",
        "run.steps=1", "data.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=6", "run.device=cpu", "eval.at_start_end=false",
        "run.preflight=false", f"run.dir={run}",
    ]) == 0  # fmt: skip
    samples = read_jsonl(run / "samples.jsonl")
    assert all(s["asked"].endswith("= Answer:") for s in samples)
    # the same data as text prompts (no chat template) reaches rewards as text, as TRL's
    # standard format does: the conversational rewards cannot read it
    text = tmp_path / "text"
    assert main([
        "train", f"data.path={data}", "data.prompt_template={question} Answer:",
        "reward.functions=[helpers.rewards_for_tests:text_prompt_reward]",
        f"model.path={chat_model_dir}", "run.steps=1", "data.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=6", "run.device=cpu",
        "eval.at_start_end=false", "run.preflight=false", f"run.dir={text}",
    ]) == 0  # fmt: skip


def test_reward_functions_pass_to_train_as_trl_takes_them(chat_model_dir, tmp_path):
    """`oncurve.train(config, reward_funcs=[...], reward_weights=[...])`, as
    `GRPOTrainer(reward_funcs=...)` takes them: functions of the script itself, a closure a
    factory made, a callable object; each logged under its name."""
    from helpers.rewards_for_tests import accuracy_reward

    def length_bonus(scale):
        def bonus(completions, **kwargs):
            return [scale * len(c[0]["content"]) for c in completions]

        return bonus

    class Constant:
        def __call__(self, completions, **kwargs):
            return [0.5] * len(completions)

    data = trl_dataset(tmp_path / "trl.jsonl", rows=4)
    run = tmp_path / "run"
    config = oncurve.load_config(None, [
        f"data.path={data}", f"model.path={chat_model_dir}", "run.steps=1",
        "data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
        "run.device=cpu", "eval.at_start_end=false", "run.preflight=false", f"run.dir={run}",
    ])  # fmt: skip
    oncurve.train(
        config,
        quiet=True,
        reward_funcs=[accuracy_reward, length_bonus(0.1), Constant()],
        reward_weights=[1.0, 0.0, 2.0],
    )
    (metrics,) = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] == 1]
    assert metrics["reward/Constant"] == 0.5
    assert {"reward/accuracy_reward", "reward/bonus"} <= metrics.keys()
    expected = metrics["reward/accuracy_reward"] + 2.0 * 0.5
    assert abs(metrics["reward/mean"] - expected) < 1e-6
    with pytest.raises(UserError, match="reward_weights: 2 weights for 3 reward_funcs"):
        oncurve.train(config, reward_funcs=[accuracy_reward] * 3, reward_weights=[1.0, 1.0])
    with pytest.raises(UserError, match="reward_weights: finite numbers are needed"):
        oncurve.train(config, reward_funcs=accuracy_reward, reward_weights=[float("nan")])
    with pytest.raises(UserError, match="reward_weights: numbers are needed"):
        oncurve.train(config, reward_funcs=accuracy_reward, reward_weights=["x"])
    # resumed from its own config.yaml, given the functions again (one alone, as TRL takes it)
    saved = oncurve.load_config(run / "config.yaml", ["run.steps=2", "run.resume=auto"])
    assert [f.name for f in saved.reward.functions][-1] == "given:Constant"
    oncurve.train(saved, quiet=True, reward_funcs=[accuracy_reward, length_bonus(0.1), Constant()],
                  reward_weights=[1.0, 0.0, 2.0])  # fmt: skip
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")][-1] == 2
    # and not given them: refused, not trained on another reward
    again = oncurve.load_config(run / "config.yaml", ["run.steps=3", "run.resume=auto"])
    again = dataclasses.replace(again, reward=dataclasses.replace(again.reward, functions=[]))
    with pytest.raises(UserError, match="had given:Constant, given:bonus, passed to oncurve.train"):
        oncurve.train(again, quiet=True, reward_funcs=accuracy_reward)


def test_an_answer_column_read_otherwise_than_stored_is_said_to_trl_rewards(tmp_path):
    """TRL passes the `answer` column as stored (a number stays a number); oncurve's rewards
    get the reference text it reads off it, and the stored values as `answer_raw`: with a
    `module:function` reward, the start-up report says so, with a row's two values."""
    from oncurve.config import load_config
    from oncurve.data.files import load_rows
    from oncurve.data.prompts import PromptData
    from oncurve.model.char_tokenizer import char_tokenizer
    from oncurve.rewards.registry import resolve_reward
    from oncurve.rewards.runner import RewardRunner
    from oncurve.run.setup import startup_notes

    def notes(records, reward):
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        config = load_config(None, [f"data.path={path}", "data.prompts_per_step=1"])
        data = PromptData(load_rows(str(path)), char_tokenizer(), config.data, seed=0)
        runner = RewardRunner([resolve_reward(reward) + (1.0,)], timeout_s=None)
        return [n for n in startup_notes(config, runner, data) if "answer_raw" in n]

    numbers = [{"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": 6}]
    trl = "helpers.rewards_for_tests:accuracy_reward"
    assert notes(numbers, trl) == [
        "data: column 'answer' reaches module:function rewards as the reference text oncurve "
        "reads off it ('4' for the stored 4), where TRL passes it as stored; as stored, it is "
        "column 'answer_raw'"
    ]
    assert notes(numbers, "correct") == []  # the built-ins read the text
    texts = [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"}]
    assert notes(texts, trl) == []  # read as stored


@pytest.mark.parametrize("timeout_s", [None, 5.0], ids=["in-process", "worker"])
def test_columns_named_state_and_log_reach_trl_rewards_as_trl_passes_them(tmp_path, timeout_s):
    """`state` and `log` are ordinary column names to TRL (a question's US state, a row's log
    text): they load and reach a reward by name beside TRL's own `trainer_state`."""
    from oncurve.data.files import load_rows
    from oncurve.data.prompts import group_columns
    from oncurve.rewards.runner import RewardRunner
    from oncurve.rewards.trl_contract import TrainerState, TrlReward

    def by_state(completions, state, log, trainer_state, log_metric, **kwargs):
        log_metric("steps", trainer_state.global_step)
        return [
            float(c == s) + len(entry) for c, s, entry in zip(completions, state, log, strict=True)
        ]

    path = tmp_path / "states.jsonl"
    rows = [{"prompt": "Capital of Ohio?", "answer": "Columbus", "state": "Ohio", "log": "ab"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts, columns = group_columns(load_rows(str(path)), 2)
    with RewardRunner([("s", TrlReward(by_state), 1.0)], timeout_s=timeout_s) as runner:
        result = runner.score(prompts, ["Ohio", "Texas"], columns, TrainerState(3, 10))
    assert result.per_fn[:, 0].tolist() == [3.0, 2.0]
    assert result.logged == {"steps": [3.0]}


def _given_config(model_dir, run_dir, *extra: str):
    """A one-step job of `helpers.configs.make_config`'s kind with no data.path: the rows are
    passed to `train`."""
    return oncurve.load_config(None, [
        f"model.path={model_dir}", "data.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=6", "reward.functions=[helpers.rewards_for_tests:count_digits]",
        "reward.timeout=null", "run.steps=1", "run.device=cpu", "eval.at_start_end=false",
        "run.preflight=false", f"run.dir={run_dir}", *extra,
    ])  # fmt: skip


def test_a_given_dataset_samples_step_1_as_its_rows_in_a_file_do(
    tiny_model_dir, data_file, tmp_path
):
    """`train(config, train_dataset=rows)`, as `GRPOTrainer(train_dataset=...)` takes them,
    trains as `data.path` naming a file of the same rows does, and config.yaml names them."""
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    oncurve.train(_given_config(tiny_model_dir, tmp_path / "given"), quiet=True, train_dataset=rows)
    filed = _given_config(tiny_model_dir, tmp_path / "file", f"data.path={data_file}")
    oncurve.train(filed, quiet=True)
    given, from_file = (tmp_path / name for name in ("given", "file"))
    assert (given / "samples.jsonl").read_bytes() == (from_file / "samples.jsonl").read_bytes()
    assert metric_rows(given) == metric_rows(from_file)
    assert "  path: given:train_dataset\n" in (given / "config.yaml").read_text()


def test_a_run_on_given_datasets_resumes_given_them_again(tiny_model_dir, data_file, tmp_path,
                                                          capsys):  # fmt: skip
    """A resume is given the datasets again: without them it is refused in one line saying
    so, given other training rows it is refused as for an edited file, given other held-out
    rows it says so, and `oncurve eval --run` asks for the held-out rows as a file."""
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    run = tmp_path / "run"
    config = _given_config(tiny_model_dir, run)
    oncurve.train(config, quiet=True, train_dataset=rows, eval_dataset=rows[:2])
    saved = oncurve.load_config(run / "config.yaml", ["run.steps=2", "run.resume=auto"])
    assert (saved.data.path, saved.eval.path) == ("given:train_dataset", "given:eval_dataset")
    with pytest.raises(UserError) as err:
        oncurve.train(saved, quiet=True)
    assert str(err.value) == (
        "data.path given:train_dataset: the train_dataset passed to oncurve.train, which is not "
        "given here; pass it again: oncurve.train(config, train_dataset=...)"
    )
    resumed = dataclasses.replace(config, run=dataclasses.replace(config.run, resume="auto"))
    with pytest.raises(UserError, match=r"data.path was the train_dataset passed to oncurve.tr"):
        oncurve.train(resumed, quiet=True)  # the config's own data: the task
    other = [{**row, "answer": "0"} for row in rows]
    with pytest.raises(UserError, match=r"the training rows differ from the ones the run start"):
        oncurve.train(saved, quiet=True, train_dataset=other, eval_dataset=rows[:2])
    capsys.readouterr()
    oncurve.train(saved, quiet=True, train_dataset=rows, eval_dataset=rows[:2])
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1, 2]
    assert "changed settings: run.steps 1 -> 2\n" in capsys.readouterr().err
    assert main(["eval", "--device", "cpu", "--run", str(run)]) == 2
    assert capsys.readouterr().err == (
        "oncurve: error: the run's eval.path is the eval_dataset passed to oncurve.train, which "
        "only that process held: give the rows with --data\n"
    )
    # other held-out rows are said, as eval.path naming another file is; none are eval.path unset
    saved = oncurve.load_config(run / "config.yaml", ["run.steps=3", "run.resume=auto"])
    oncurve.train(saved, quiet=True, train_dataset=rows, eval_dataset=rows[2:4])
    assert "changed settings: run.steps 2 -> 3, eval.rows 'rows:" in capsys.readouterr().err
    resumed = dataclasses.replace(
        config, run=dataclasses.replace(config.run, resume="auto", steps=4)
    )
    oncurve.train(resumed, quiet=True, train_dataset=rows)
    assert "eval.path 'given:eval_dataset' -> None" in capsys.readouterr().err


def test_a_given_dataset_beside_a_path_or_a_task_is_refused_before_the_run(data_file, tmp_path):
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    config = _given_config("default", tmp_path / "run", f"data.path={data_file}")
    with pytest.raises(UserError) as err:
        oncurve.train(config, train_dataset=rows)
    assert str(err.value) == (
        f"train_dataset: the config's data.path names {data_file} as well; give the rows one "
        "way: unset data.path, or pass no train_dataset"
    )
    on_task = _given_config("default", tmp_path / "run")
    with pytest.raises(UserError) as err:
        oncurve.train(on_task, eval_dataset=rows)
    assert str(err.value) == (
        "eval_dataset: the run trains on the built-in task arith, which evaluates on its own "
        "held-out problems; pass train_dataset (or set data.path) too"
    )
    with pytest.raises(UserError, match=r"^train_dataset: expected a datasets.Dataset or a list"):
        oncurve.train(on_task, train_dataset=str(data_file))
    # (without data.path, a data.split or data.config is refused as the config loads)
    split = ("data.path=given:train_dataset", "data.split=test")
    with pytest.raises(UserError) as err:
        oncurve.train(_given_config("default", tmp_path / "run", *split), train_dataset=rows)
    assert str(err.value) == (
        "train_dataset: data.split picks a split of a Hub dataset, not of given rows; unset it"
    )
    assert not (tmp_path / "run").exists()


def test_a_model_passed_to_train_as_trl_takes_it_trains_as_model_path_does(
    tiny_model_dir, data_file, tmp_path
):
    """`train(config, model=path)`, as `GRPOTrainer(model="Qwen/...")` takes it, trains as the
    config naming it does, with a real model's defaults where the config, loaded for the
    bundled model, set nothing (optim.lr); the config may be a YAML file's path."""
    job, given, named = tmp_path / "job.yaml", tmp_path / "given", tmp_path / "named"
    job.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data_file), "prompts_per_step": 2},
                "rollout": {"group_size": 2, "max_new_tokens": 6},
                "reward": {"timeout": None},
                "eval": {"at_start_end": False},
                "run": {"steps": 1, "device": "cpu", "preflight": False, "dir": str(given)},
            }
        )
    )
    oncurve.train(str(job), quiet=True, model=str(tiny_model_dir))
    oncurve.train(oncurve.load_config(job, [f"model.path={tiny_model_dir}", f"run.dir={named}"]),
                  quiet=True)  # fmt: skip
    assert (given / "samples.jsonl").read_bytes() == (named / "samples.jsonl").read_bytes()
    assert metric_rows(given) == metric_rows(named)
    assert metric_rows(given)[0]["lr"] < 1e-5  # a real model's 1e-6 warming up, not 1e-4
    assert f"  path: {tiny_model_dir}\n" in (given / "config.yaml").read_text()


def test_a_model_passed_to_train_beside_another_path_or_as_an_object_is_refused(tmp_path):
    config = _given_config("org/other", tmp_path / "run")
    with pytest.raises(UserError) as err:
        oncurve.train(config, model="org/model")
    assert str(err.value) == (
        "model: the config's model.path names org/other as well; give the model one way: "
        "unset model.path, or pass no model"
    )
    loaded = tiny_qwen2(8)
    loaded.name_or_path = "org/model"  # as from_pretrained("org/model") sets it
    with pytest.raises(UserError) as err:
        oncurve.train(_given_config("default", tmp_path / "run"), model=loaded)
    assert str(err.value) == (
        "model: a Qwen2ForCausalLM object; oncurve loads the model itself, at the start and "
        "again to resume: pass its directory or Hub id, model='org/model' if it is unchanged "
        "since loading, else save it (model.save_pretrained(directory)) and pass the directory"
    )
    assert not (tmp_path / "run").exists()


def test_a_streamed_dataset_is_read_as_far_as_the_run_needs(tiny_model_dir, data_file, tmp_path,
                                                            capsys):  # fmt: skip
    """An endless `IterableDataset` trains as the list of its first data.prompts_per_step x
    run.steps rows does, and a resume given it again reads the same rows; one that would read
    others (run.steps raised) is refused in one line saying so; a streamed eval_dataset needs
    eval.num_prompts, the rows read from it."""
    datasets = pytest.importorskip("datasets", reason="datasets (extra `data`) not installed")
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]

    def endless():
        while True:
            yield from rows

    stream = datasets.IterableDataset.from_generator(endless)
    run = tmp_path / "stream"
    config = _given_config(tiny_model_dir, run, "run.steps=2", "run.save_every=1")
    oncurve.train(config, quiet=True, train_dataset=stream)
    listed = _given_config(tiny_model_dir, tmp_path / "listed", "run.steps=2")
    oncurve.train(listed, quiet=True, train_dataset=rows[:4])
    assert (run / "samples.jsonl").read_bytes() == (
        tmp_path / "listed" / "samples.jsonl"
    ).read_bytes()
    trained = (run / "samples.jsonl").read_bytes()
    step_1 = f"run.resume={run}/checkpoints/step-000001", "run.overwrite=true"
    oncurve.train(oncurve.load_config(run / "config.yaml", [*step_1]), quiet=True,
                  train_dataset=stream)  # fmt: skip
    assert (run / "samples.jsonl").read_bytes() == trained  # step 2 again, on the same rows
    longer = oncurve.load_config(run / "config.yaml", ["run.steps=3", "run.resume=auto"])
    with pytest.raises(UserError) as err:
        oncurve.train(longer, quiet=True, train_dataset=stream)
    assert str(err.value) == (
        f"cannot resume {run}/checkpoints/step-000002: run.steps was 2 and is now 3, and the "
        "train_dataset streams its rows, of which a run reads data.prompts_per_step x run.steps: "
        "it would train on others; resume with run.steps=2, force it with "
        "run.force_changes=[data.rows] (the remaining steps draw from the 6 rows read then), or "
        "start a new run.dir"
    )
    evaluated = _given_config(tiny_model_dir, tmp_path / "eval", f"data.path={data_file}")
    with pytest.raises(UserError) as err:
        oncurve.train(evaluated, quiet=True, eval_dataset=stream)
    assert str(err.value) == (
        "eval_dataset streams its rows (IterableDataset, no length), which may not end: set "
        "eval.num_prompts, the held-out rows to read from it"
    )
