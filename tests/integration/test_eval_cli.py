"""`oncurve eval` and `oncurve sample` format prompts as training does and give the trainer's
numbers: `--run`, the chat template, `--system-prompt`, `--out`, and the prompt as the model
saw it in samples.jsonl."""

from __future__ import annotations

import json
import shutil

import pytest
import transformers
from helpers.configs import make_config

from oncurve.cli import main
from oncurve.config import load_config
from oncurve.data.tasks import get_task
from oncurve.loop.trainer import train
from oncurve.report import write_report


def eval_json(capsys, *argv: str) -> dict:
    assert main(["eval", "--device", "cpu", *argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_eval_of_a_run_gives_the_trainers_held_out_accuracy(tmp_path, capsys):
    """The bundled model on the arith task: `oncurve eval --run` with no other argument scores
    the run's final model on the run's held-out problems as the trainer's last evaluation."""
    run_dir = tmp_path / "run"
    # a step of 2 groups of 2 still moves the model (and so the accuracy) off its start
    config = load_config(
        None,
        ["run.steps=1", "data.prompts_per_step=2", "rollout.group_size=2", "run.preflight=false",
         "eval.num_prompts=24", "eval.samples=3", "eval.batch_rows=24", "run.seed=5",
         f"run.dir={run_dir}", "run.device=cpu"],
    )  # fmt: skip
    result = train(config, quiet=True)
    got = eval_json(capsys, "--run", str(run_dir))
    assert (got["n"], got["scorer"]) == (24, "arith task's correct")
    assert got["accuracy"] == pytest.approx(result.eval_after["accuracy"], abs=1e-9)
    # sampled with the run's seed, K and batches, as the trainer's last evaluation
    for metric in ("mean@3", "pass@3"):
        assert got[metric] == pytest.approx(result.eval_after[metric], abs=1e-9)
    assert got["prompt_format"]["chat_template"] is False
    assert 0 < got["accuracy"] < 1  # a number that depends on the prompts and the model


def train_with_held_out_file(tmp_path, problems: int, *overrides: str):
    """A one-step run of the bundled model on a file of `problems` arith problems, which is its
    eval.path too: (its directory, its result)."""
    held_out = tmp_path / "held_out.jsonl"
    rows = get_task("arith").examples("test", problems, 0)
    held_out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    overrides = ("run.steps=1", f"data.path={held_out}", f"eval.path={held_out}",
                 f"run.dir={run_dir}", "run.device=cpu", *overrides)  # fmt: skip
    return run_dir, train(load_config(None, list(overrides)), quiet=True)


def test_eval_of_a_run_scores_the_eval_file_rows_the_trainer_scored(tmp_path, capsys):
    run_dir, result = train_with_held_out_file(tmp_path, 16, "eval.num_prompts=6")
    got = eval_json(capsys, "--run", str(run_dir))
    assert got["n"] == 6
    assert got["accuracy"] == pytest.approx(result.eval_after["accuracy"], abs=1e-9)


def test_a_chat_template_run_is_evaluated_in_its_template(
    chat_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    config = make_config(
        chat_model_dir,
        data_file,
        run_dir,
        "data.chat_template=true",
        "data.system_prompt=be brief",
        f"eval.path={data_file}",
        "eval.num_prompts=40",
        "run.steps=1",
    )
    result = train(config, quiet=True)
    out = tmp_path / "rows.jsonl"
    got = eval_json(capsys, "--run", str(run_dir), "--data", str(data_file), "--out", str(out))
    assert got["accuracy"] == pytest.approx(result.eval_after["accuracy"], abs=1e-9)
    # without --data, the run's own eval.path; and its final/ named alone is evaluated as the run
    assert eval_json(capsys, "--run", str(run_dir)) == got
    assert eval_json(capsys, "--model", str(run_dir / "final")) == got
    assert (got["scorer"], got["prompt_format"]["system_prompt"]) == ("correct", "be brief")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == got["n"] == 40
    assert rows[0]["prompt"].endswith("[system] be brief\n[user] 0+0=\n[assistant] ")
    assert {"answer", "extracted", "greedy", "greedy_correct"} <= set(rows[0])
    # the prompt as the model saw it, in samples.jsonl (and so in the report)
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert "[system] be brief\n[user] " in sample["prompt_as_seen"]
    assert sample["prompt_as_seen"].endswith("\n[assistant] ")
    page = write_report([run_dir], tmp_path / "report").read_text()
    shown = page.split("The first prompt as the model saw it:")[1].split("</div>")[0]
    assert "[system]" in shown and "[assistant]" in shown


def test_the_template_is_the_default_when_the_tokenizer_has_one(
    chat_model_dir, data_file, tmp_path, capsys
):
    common = ["--model", str(chat_model_dir), "--data", str(data_file), "--max-new-tokens", "4"]
    templated, plain = tmp_path / "t.jsonl", tmp_path / "p.jsonl"
    eval_json(capsys, *common, "--out", str(templated))
    eval_json(capsys, *common, "--no-chat-template", "--system-prompt", "hi", "--out", str(plain))
    first = json.loads(templated.read_text().splitlines()[1])["prompt"]
    assert first.endswith("[user] 1+1=\n[assistant] ")
    assert json.loads(plain.read_text().splitlines()[1])["prompt"].endswith("hi\n\n1+1=")


def test_sample_formats_its_prompt_and_errors_are_one_line(chat_model_dir, tmp_path, capsys):
    argv = ["sample", "--device", "cpu", "--max-new-tokens", "3", "-n", "2"]
    assert main([*argv, "--model", str(chat_model_dir), "--prompt", "2+2="]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main([*argv, "--prompt", "2+2="]) == 2
    assert "--model or --run" in capsys.readouterr().err
    assert main([*argv, "--run", str(tmp_path), "--prompt", "2+2="]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_a_model_directory_s_generation_settings_are_used_and_shortened_to_fit(
    tiny_model_dir, tmp_path, capsys
):
    """`oncurve sample --model DIR` samples with DIR's generation_config.json, as with the same
    settings given as flags; a carried
    max_new_tokens longer than the model's 256 positions leave is shortened to the room there
    is (the prompt is BOS and 4 characters), in one line; the same length given as a flag is a
    one-line error."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    carried = {"do_sample": True, "max_new_tokens": 1000, "temperature": 0.5, "top_k": 3}
    (model_dir / "generation_config.json").write_text(json.dumps(carried))
    argv = ["sample", "--device", "cpu", "--model", str(model_dir), "--prompt", "2+2=", "-n", "1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err.strip() == (
        f"oncurve: max_new_tokens 1000 (from {model_dir}/generation_config.json) does not fit "
        "after the longest prompt (5 tokens) in the model's 256 positions: using 251"
    )
    flags = ["--max-new-tokens", "251", "--temperature", "0.5", "--top-k", "3"]
    assert main([*argv, *flags]) == 0
    assert capsys.readouterr().out == out
    assert main([*argv, *flags[:2], "--temperature", "1"]) == 0
    assert capsys.readouterr().out != out
    assert main([*argv, "--max-new-tokens", "1000"]) == 2
    assert "--max-new-tokens=1000 does not fit" in capsys.readouterr().err


def test_a_run_s_final_model_carries_the_sampling_it_trained_with(tmp_path):
    """final/generation_config.json holds the run's rollout settings, which `generate` reads."""
    run_dir = tmp_path / "run"
    overrides = ["rollout.max_new_tokens=24", "rollout.temperature=0.7", "rollout.top_k=5"]
    config = load_config(
        None,
        [*overrides, "run.steps=1", "eval.at_start_end=false", "run.preflight=false",
         "data.prompts_per_step=2", "rollout.group_size=2", f"run.dir={run_dir}",
         "run.device=cpu"],
    )  # fmt: skip
    train(config, quiet=True)
    generation = transformers.GenerationConfig.from_pretrained(run_dir / "final")
    assert (generation.do_sample, generation.max_new_tokens) == (True, 24)
    assert (generation.temperature, generation.top_p, generation.top_k) == (0.7, 1.0, 5)
    assert generation.eos_token_id is not None


def test_a_checkpoint_samples_and_evaluates_as_its_run(tiny_model_dir, data_file, tmp_path, capsys):
    """`--model RUN/checkpoints/step-N` loads the policy of step N and samples with the settings
    its run trained with (from its state.json); the last step's gives what final/ gives. A run
    with no final/ yet names its newest checkpoint in its one-line error."""
    run_dir = tmp_path / "run"
    extra = ["run.steps=2", "run.save_every=1", "rollout.temperature=0.7", "rollout.top_k=5"]
    train(make_config(tiny_model_dir, data_file, run_dir, *extra), quiet=True)
    last = run_dir / "checkpoints" / "step-000002"
    prompt = ["--prompt", "3+3=", "-n", "3", "--seed", "1"]

    def sample(*argv: str) -> str:
        assert main(["sample", "--device", "cpu", *argv, *prompt]) == 0
        return capsys.readouterr().out

    from_checkpoint = sample("--model", str(last))
    flags = ["--max-new-tokens", "8", "--temperature", "0.7", "--top-k", "5"]
    assert from_checkpoint == sample("--model", str(run_dir / "final"), *flags)
    assert from_checkpoint != sample("--model", str(last), "--temperature", "1")
    scored = eval_json(capsys, "--model", str(last), "--data", str(data_file))
    assert scored == eval_json(capsys, "--model", str(run_dir / "final"), "--data", str(data_file))
    assert scored["n"] == 40
    shutil.rmtree(run_dir / "final")
    assert main(["eval", "--run", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"no final/ model yet (the run has not finished): name a checkpoint "
                        f"with --model {last}")  # fmt: skip


def test_no_held_out_prompts_is_no_evaluation_and_eval_says_so(tmp_path, capsys):
    run_dir, result = train_with_held_out_file(
        tmp_path, 4, "eval.num_prompts=0", "run.preflight=false"
    )
    assert result.eval_before is None and result.eval_after is None
    assert main(["eval", "--run", str(run_dir)]) == 2
    assert "eval.num_prompts=0): give --data" in capsys.readouterr().err


def test_no_usable_reference_is_null_accuracy_in_strict_json(tmp_path, capsys):
    data = tmp_path / "bad_golds.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "0/0"}) + "\n")
    out = tmp_path / "rows.jsonl"
    argv = ["eval", "--device", "cpu", "--model", "default", "--data", str(data)]
    assert main([*argv, "--max-new-tokens", "4", "--samples", "2", "--out", str(out)]) == 0

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    summary = json.loads(capsys.readouterr().out.splitlines()[-1], parse_constant=refuse)
    assert (summary["accuracy"], summary["unscored"]) == (None, 1.0)
    row = json.loads(out.read_text())
    assert (row["greedy_correct"], row["samples_correct"]) == (None, None)


def test_eval_of_a_multi_turn_run_plays_its_episodes_as_the_trainer(
    tiny_model_dir, data_file, tmp_path, capsys
):
    """A run with `rollout.env` is scored on the episodes it plays (the environment's reward),
    as its trainer's evaluation scored it; single-turn completions would fail to score."""
    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [f"model.path={tiny_model_dir}", f"data.path={data_file}", f"eval.path={data_file}",
         "eval.num_prompts=6", "eval.samples=2", "data.prompts_per_step=2",
         "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.stop=[1, 2, 3]",
         "rollout.env=helpers.rewards_for_tests:DigitsEnv", "rollout.max_turns=2",
         "rollout.max_observation_tokens=16", "reward.timeout=null", "run.steps=1",
         "run.preflight=false", "run.device=cpu", f"run.dir={run_dir}"],
    )  # fmt: skip
    result = train(config, quiet=True)
    got = eval_json(capsys, "--run", str(run_dir))
    assert got["scorer"] == (
        "rollout.env helpers.rewards_for_tests:DigitsEnv: the episode's reward"
    )
    assert got["n"] == 6
    for metric in ("accuracy", "mean@2", "pass@2"):
        assert got[metric] == pytest.approx(result.eval_after[metric], abs=1e-9)


def test_a_tasks_scorer_needs_the_files_answers_before_anything_is_sampled(tmp_path, capsys):
    data = tmp_path / "no_answers.jsonl"
    data.write_text('{"prompt": "0012+0034="}\n')
    argv = ["eval", "--device", "cpu", "--model", "default", "--task", "arith", "--data"]
    assert main([*argv, str(data)]) == 2  # arith's reward reads the answers the file lacks
    assert capsys.readouterr().err.strip() == (
        f"oncurve: error: {data} line 1: missing field 'answer' (fields: prompt)"
    )


def test_a_task_whose_reward_reads_no_answer_scores_a_file_without_one(tmp_path, capsys):
    """countdown's reward reads a row's numbers and target: a file without answers is valid."""
    data = tmp_path / "countdown.jsonl"
    data.write_text('{"prompt": "Use 3 and 5 to make 8.", "numbers": [3, 5], "target": 8}\n')
    argv = ["--model", "default", "--task", "countdown", "--data", str(data)]
    got = eval_json(capsys, *argv, "--max-new-tokens", "4")
    assert (got["n"], got["scorer"]) == (1, "countdown task's correct")


def test_a_config_or_split_local_data_lacks_is_one_line_before_anything_loads(tmp_path, capsys):
    """--config picks a Hub dataset's config and --split a Hub dataset's or saved DatasetDict's
    split: given for a file, they would be ignored, so eval stops in one line, exit 2."""
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "0012+0034=", "answer": "46"}\n')
    argv = ["eval", "--device", "cpu", "--model", "default", "--data", str(data)]
    for flag, value, message in [
        ("--config", "main", f"--config: {data} is local data, which has no configs"),
        ("--split", "validation", f"--split: {data} is a file, which has no splits"),
    ]:
        assert main([*argv, flag, value]) == 2
        assert capsys.readouterr().err == f"oncurve: error: {message}; drop it\n"


def test_a_runs_flags_its_rows_would_ignore_are_one_line(tmp_path, capsys):
    """Without --data, eval reads the run's eval.path, or its task's held-out problems: a
    --config or --split those do not read stops in one line, exit 2, as for --data."""
    from oncurve.config import config_yaml

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "0012+0034=", "answer": "46"}\n')
    runs = {"file": [f"data.path={rows}", f"eval.path={rows}"], "task": []}
    for name, overrides in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(config_yaml(load_config(None, overrides)))
    argv = ["eval", "--device", "cpu", "--model", "default", "--run"]
    for run, flag, message in [
        ("file", "--split", f"--split: {rows} is a file, which has no splits"),
        ("file", "--config", f"--config: {rows} is local data, which has no configs"),
        ("task", "--split", "--split: the run's held-out rows are its task's or environment's"),
        ("task", "--config", "--config: the run's held-out rows are its task's or environment's"),
    ]:
        assert main([*argv, str(tmp_path / run), flag, "x"]) == 2
        assert capsys.readouterr().err == f"oncurve: error: {message}; drop it\n"
