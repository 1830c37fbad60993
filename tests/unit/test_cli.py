"""`oncurve tasks export`, `oncurve eval` and `oncurve sample` through `cli.main` on the bundled
model, checked against transformers' own greedy `generate`."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from helpers.models import with_own_code

from oncurve.cli import main
from oncurve.cli.common import sampling
from oncurve.config import load_config
from oncurve.data.tasks import get_task
from oncurve.model.sources import resolve_model_path
from oncurve.rewards import extract_answer

MAX_NEW_TOKENS = 48


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict]:
    """Run one command; its stdout as JSON lines."""
    assert main(list(argv)) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def reference_greedy_answers(prompts: list[str]) -> list[str | None]:
    """The bundled model's greedy answers from transformers' `generate`, not oncurve's sampler."""
    path = resolve_model_path("default")
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    answers = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        answers.append(extract_answer(text, style="tags"))
    return answers


def test_export_writes_correct_answers_and_the_same_file_for_the_same_seed(capsys, tmp_path):
    rows = run_cli(capsys, "tasks", "export", "arith", "--split", "test", "--seed", "5", "-n", "20")
    assert len(rows) == 20
    for row in rows:
        left, right = row["prompt"].removesuffix("=").split("+")
        assert int(row["answer"]) == int(left) + int(right)
    out = tmp_path / "test.jsonl"
    run_cli(capsys, "tasks", "export", "arith", "--seed", "5", "-n", "20", "-o", str(out))
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    other_seed = run_cli(capsys, "tasks", "export", "arith", "--seed", "6", "-n", "20")
    assert other_seed != rows


def test_export_keeps_the_columns_the_tasks_rewards_read_and_a_small_split_whole(
    capsys, tmp_path, monkeypatch
):
    countdown = run_cli(capsys, "tasks", "export", "countdown", "-n", "3")
    assert all({"prompt", "answer", "numbers", "target"} <= row.keys() for row in countdown)
    code = run_cli(capsys, "tasks", "export", "code")  # no -n: its 25 test problems, not 500
    assert len(code) == 25 and all(row["tests"] for row in code)
    monkeypatch.setenv("HOME", str(tmp_path))  # `~` in -o is the home directory, as checked
    run_cli(capsys, "tasks", "export", "countdown", "-n", "2", "-o", "~/c.jsonl")
    assert [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()] == (
        countdown[:2]
    )
    # countdown's own reward scores an exported row from its columns: any right equation pays
    row = countdown[0]
    assert (row["numbers"], row["target"], row["answer"]) == ("16,7,79", "88", "(16 - 7) + 79")
    correct = get_task("countdown").reward_fns()["correct"]
    columns = {key: [row[key]] for key in ("answer", "numbers", "target")}
    assert correct([row["prompt"]], ["<answer>79 + 16 - 7</answer>"], **columns) == [1.0]


def test_eval_gives_the_known_accuracy_of_a_file_built_from_the_models_own_answers(
    capsys, tmp_path
):
    prompts = [r["prompt"] for r in run_cli(capsys, "tasks", "export", "arith", "-n", "24")]
    answers = reference_greedy_answers(prompts)
    answered = [(p, a) for p, a in zip(prompts, answers, strict=True) if a is not None][:10]
    assert len(answered) == 10
    # 7 rows carry the model's own greedy answer (correct by construction), 3 a different one
    rows = [{"prompt": p, "answer": a} for p, a in answered[:7]]
    rows += [{"prompt": p, "answer": str(int(a) + 1)} for p, a in answered[7:]]
    data = tmp_path / "known.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    (result,) = run_cli(
        capsys, "eval", "--model", "default", "--data", str(data), "--device", "cpu",
        "--max-new-tokens", str(MAX_NEW_TOKENS), "--samples", "4",
    )  # fmt: skip
    assert result["n"] == 10
    assert result["accuracy"] == 7 / 10  # exactly: the fraction, not its float32 rounding
    assert 0 <= result["mean@4"] <= result["pass@4"] <= 1
    assert result["mean@4"] == round(result["mean@4"] * 40) / 40
    assert result["pass@4"] == round(result["pass@4"] * 10) / 10


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_sample_prints_n_completions_and_greedy_ones_are_transformers_greedy(capsys, backend):
    prompt = "0012+0034="
    rows = run_cli(
        capsys, "sample", "--model", "default", "--prompt", prompt, "-n", "3", "--device", "cpu",
        "--temperature", "0", "--max-new-tokens", str(MAX_NEW_TOKENS), "--backend", backend,
    )  # fmt: skip
    assert len(rows) == 3
    assert {r["finish_reason"] for r in rows} <= {"eos", "stop", "length"}
    (expected,) = reference_greedy_answers([prompt])
    assert [extract_answer(r["completion"], style="tags") for r in rows] == [expected] * 3


def test_eval_of_a_missing_file_is_a_one_line_user_error(capsys, tmp_path: Path):
    missing = tmp_path / "nope.jsonl"
    assert main(["eval", "--model", "default", "--data", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nope.jsonl" in err


def test_an_unknown_backend_is_a_one_line_user_error(capsys):
    assert main(["sample", "--model", "default", "--prompt", "1+2=", "--backend", "vlm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "oncurve: error: --backend='vlm' is not a sampler backend; choose one of auto, hf, "
        "cpu_llama, cuda_graph"
    )


def test_sample_beyond_the_models_positions_is_a_one_line_user_error(capsys):
    # the bundled model has 256 positions; "12+34=" is 7 tokens with <bos>
    assert (
        main(["sample", "--model", "default", "--prompt", "12+34=", "--max-new-tokens", "250"]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        "oncurve: error: --max-new-tokens=250 does not fit: the longest prompt has 7 tokens and "
        "the model's context length (max_position_embeddings) is 256, which leaves room for 249 "
        "new tokens"
    )


def test_train_checks_the_longest_prompt_fits_before_the_first_step(capsys, tmp_path: Path):
    run_dir = tmp_path / "run"
    assert main(["train", "rollout.max_new_tokens=250", f"run.dir={run_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oncurve: error: rollout.max_new_tokens=250 does not fit: the longest")
    assert "\n" not in err and not (run_dir / "metrics.jsonl").exists()


def test_help_config_into_a_closed_pipe_exits_0_in_silence():
    """`oncurve train --help-config | true`: a reader gone before the reference is printed
    leaves it unread, as for the run's summary; no error, exit status 0."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe fails, as once `true` has exited
    try:
        done = subprocess.run(
            [sys.executable, "-m", "oncurve", "train", "--help-config"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(
    "argv",
    [
        ["tasks", "export", "arith", "-n", "3"],
        ["sample", "--model", "default", "--prompt", "1+1=", "-n", "2", "--max-new-tokens", "2"],
        ["eval", "--model", "default", "--data", "ROWS", "--max-new-tokens", "2"],
    ],
    ids=["export", "sample", "eval"],
)
def test_a_commands_output_into_a_closed_pipe_exits_0_in_silence(argv, tmp_path, monkeypatch):
    """`oncurve tasks export arith | head -0`, and sample's and eval's lines: the reader gone,
    the output is left unread with no error line and exit status 0, as train's summary is."""
    import io
    import os

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe fails, as once the reader has exited
    stdout = io.TextIOWrapper(os.fdopen(write_end, "wb", buffering=0), write_through=True)
    errors = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", errors)
    try:
        code = main([str(rows) if arg == "ROWS" else arg for arg in argv])
    finally:
        monkeypatch.undo()
    assert (code, errors.getvalue()) == (0, "")
    stdout.close()  # what the command left buffered went nowhere, without an error


def test_the_public_api_imports_from_the_package_and_import_oncurve_stays_light():
    import oncurve
    import oncurve.config
    import oncurve.loop.trainer
    import oncurve.rollout

    homes = {
        "Config": oncurve.config,
        "load_config": oncurve.config,
        "SamplingParams": oncurve.rollout,
        "TorchSampler": oncurve.rollout,
        "TrainResult": oncurve.loop.trainer,
        "train": oncurve.loop.trainer,
    }
    assert sorted(oncurve.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(oncurve, name) is getattr(home, name)
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        oncurve.trian  # noqa: B018
    probe = "import sys, oncurve; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    "argv, expected_file, expected_overrides",
    [
        (["--quiet", "run.steps=5"], None, ["run.steps=5"]),
        (["run.steps=5", "--quiet"], None, ["run.steps=5"]),
        (["cfg.yaml", "--quiet", "algo.beta=0"], "cfg.yaml", ["algo.beta=0"]),
        (["run.steps=5", "--quiet", "algo.beta=0"], None, ["run.steps=5", "algo.beta=0"]),
    ],
)
def test_train_takes_overrides_and_flags_in_any_order(
    monkeypatch, argv, expected_file, expected_overrides
):
    import oncurve.config
    import oncurve.loop.trainer

    seen = {}
    load_config = oncurve.config.load_config

    def fake_load_config(path, overrides):
        seen["path"], seen["overrides"] = path, overrides
        return load_config(None, ["run.steps=1"])

    def fake_train(config, quiet):
        seen["quiet"] = quiet
        return oncurve.loop.trainer.TrainResult(Path("x"), 1, None, None)

    monkeypatch.setattr(oncurve.config, "load_config", fake_load_config)
    monkeypatch.setattr(oncurve.loop.trainer, "train", fake_train)
    assert main(["train", *argv]) == 0
    assert seen == {"path": expected_file, "overrides": expected_overrides, "quiet": True}


def test_a_config_file_with_an_equals_sign_in_its_path_is_the_file(monkeypatch, tmp_path):
    """`sweep/lr=1e-4/c.yaml` names an existing YAML file: not an override."""
    import oncurve.config
    import oncurve.loop.trainer

    path = tmp_path / "lr=1e-4" / "c.yaml"
    path.parent.mkdir()
    path.write_text("run:\n  steps: 1\n")
    seen = {}
    load_config = oncurve.config.load_config

    def fake_load_config(path, overrides):
        seen["config"] = load_config(path, overrides)
        return seen["config"]

    def fake_train(config, quiet):
        return oncurve.loop.trainer.TrainResult(Path("x"), 1, None, None)

    monkeypatch.setattr(oncurve.config, "load_config", fake_load_config)
    monkeypatch.setattr(oncurve.loop.trainer, "train", fake_train)
    assert main(["train", str(path), "run.seed=3", "--quiet"]) == 0
    assert (seen["config"].run.steps, seen["config"].run.seed) == (1, 3)
    # a key=value that names no file stays an override
    assert main(["train", "run.steps=2", "--quiet"]) == 0
    assert seen["config"].run.steps == 2


def test_an_unknown_flag_after_overrides_is_still_an_error(capsys):
    assert main(["train", "run.steps=5", "--quite"]) == 2
    assert "unrecognized arguments: --quite" in capsys.readouterr().err


SAMPLE = ["sample", "--model", "default", "--prompt", "1+1="]
EVAL = ["eval", "--model", "default", "--data", "x.jsonl"]
HERE = str(Path(__file__).parent)  # a directory that is not empty


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["train", "run.steps=0"], "run.steps must be in (0, inf), got 0"),
        (["train", "algo.beta=abc"], "algo.beta must be float, got str 'abc'"),
        (["train", "run.steps=2", "extra"], "argument 'extra' must be key=value"),
        (["train", "run.steps"], "argument 'run.steps' is neither a YAML file nor key=value"),
        (["train", "missing.yaml"], "config file missing.yaml does not exist"),
        (["train", "src"], "config file src is a directory (a YAML file comes first"),
        ([*EVAL, "--samples", "0"], "argument --samples: must be at least 1, got 0"),
        ([*EVAL, "--samples", "x"], "argument --samples: must be an integer, got 'x'"),
        ([*EVAL, "--max-new-tokens", "-5"], "argument --max-new-tokens: must be at least 1"),
        ([*EVAL, "--temperature", "nan"], "argument --temperature: must be at least 0"),
        ([*EVAL, "--temperature", "inf"], "argument --temperature: must be a finite number"),
        ([*SAMPLE, "--temperature", "1e999"], "argument --temperature: must be a finite number"),
        ([*EVAL, "--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        ([*EVAL, "--answer-format", "xml"], "argument --answer-format: invalid choice: 'xml'"),
        (["eval", "--run", "/nonexistent"], "--run /nonexistent: no config.yaml"),
        (["sample", "--model", "default"], "the following arguments are required: --prompt"),
        # an undecodable byte of the command line (`--prompt "$(printf '\xff')"`) is no text
        (
            ["sample", "--model", "default", "--prompt", "1+\udcff"],
            "argument --prompt: holds a surrogate \\udcff (an undecodable byte), which is no",
        ),
        ([*SAMPLE, "--system-prompt", "\udcff"], "argument --system-prompt: holds a surrogate"),
        ([*EVAL, "--prompt-template", "{q}\udcff"], "argument --prompt-template: holds a"),
        ([*EVAL, "--answer-field", "\udcff"], "argument --answer-field: holds a surrogate"),
        ([*SAMPLE, "-n", "0"], "argument -n: must be at least 1, got 0"),
        ([*SAMPLE, "-n", "two"], "argument -n: must be an integer, got 'two'"),
        ([*SAMPLE, "--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1"),
        ([*SAMPLE, "--temperature", "-1"], "argument --temperature: must be at least 0"),
        ([*SAMPLE, "--seed", "x"], "argument --seed: must be an integer, got 'x'"),
        ([*SAMPLE, "--seed", str(10**23)], "argument --seed: must be at most 2**63 - 1, got"),
        ([*SAMPLE, "--backend", "nope"], "--backend='nope' is not a sampler backend"),
        ([*SAMPLE, "--top-p", "2"], "argument --top-p: must be in (0, 1], got 2"),
        ([*SAMPLE, "--top-p", "0"], "argument --top-p: must be in (0, 1], got 0"),
        ([*SAMPLE, "--min-p", "nan"], "argument --min-p: must be in [0, 1], got nan"),
        ([*SAMPLE, "--min-p", "x"], "argument --min-p: must be a number, got 'x'"),
        ([*EVAL, "--out", __file__], f"argument --out: {__file__} exists; name a new file"),
        ([*EVAL, "--out", "/nonexistent/x.jsonl"], "argument --out: no directory /nonexistent"),
        (["tasks", "export", "arith", "-o", __file__], f"{__file__} exists; name a new file"),
        (["warmstart", "--out", HERE], f"argument --out: {HERE} is not an empty directory"),
        (["warmstart", "--out", "w", "--steps", "0"], "argument --steps: must be at least 1"),
        (["warmstart"], "the following arguments are required: --out"),
        (["tasks", "export", "sums", "--split", "test", "-n", "200"], "only 43 test problems"),
        (["tasks", "export", "arith", "-n", "-1"], "argument -n: must be at least 1, got -1"),
        (["tasks", "export", "arith", "--split", "val"], "argument --split: invalid choice"),
        (["tasks", "export", "nosuch"], "NAME: unknown task 'nosuch'"),
        (["models", "import", "missing.gguf", "--out", "m"], "missing.gguf: no such GGUF file"),
        (["models", "import", "a.gguf", "--out", "m", "--dtype", "int4"], "invalid choice"),
        (["report", "/nonexistent/run"], "/nonexistent/run: no such run directory"),
    ],
)
def test_every_command_answers_bad_input_in_one_line_with_exit_2(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("oncurve: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "meta"])
def test_sample_on_an_unknown_device_is_a_one_line_user_error(capsys, device):
    assert main(["sample", "--model", "default", "--prompt", "1+1=", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"oncurve: error: --device must be cpu, cuda, cuda:N or auto, got {device!r}"


def _remote_code_note(config_file) -> str:
    return (
        f"note: {config_file} sets model.trust_remote_code: true, which oncurve eval and sample "
        "do not follow: --trust-remote-code runs the code the run's model ships (for code you "
        "trust)"
    )


@pytest.mark.parametrize("named", ["--run", "final", "checkpoint", "other"])
@pytest.mark.parametrize("flag", [False, True])
def test_only_the_flag_trusts_a_models_code_and_a_run_that_does_is_noted(
    tmp_path, monkeypatch, capsys, named, flag
):
    """A run's model.trust_remote_code: true does not carry over: `--trust-remote-code` alone
    trusts the model's code, alike for `--run R`, `--model R/final` and a checkpoint of R; without
    it one note names the run's config and the flag. Another model beside `--run R` (`other`) is
    not the run's, so R's setting earns it no note."""
    import oncurve.model.sources as sources
    import oncurve.run.checkpoint_model as checkpoint_model
    from oncurve.cli.common import load_sampler

    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-000001"
    seen = []
    monkeypatch.setattr(sources, "resolve_model_path", lambda path, *a, **k: path)
    monkeypatch.setattr(sources, "load_tokenizer", lambda path, trust: seen.append(trust))
    monkeypatch.setattr(
        sources, "load_model", lambda *a, trust_remote_code: seen.append(trust_remote_code)
    )
    monkeypatch.setattr(
        checkpoint_model,
        "find_checkpoint",
        lambda path: checkpoint if named == "checkpoint" else None,
    )
    monkeypatch.setattr(
        checkpoint_model,
        "load_checkpoint_model",
        lambda *a, trust_remote_code: (seen.append(trust_remote_code), None),
    )
    monkeypatch.setattr("oncurve.rollout.build_sampler", lambda *a, **k: None)
    config = load_config(None, ["model.path=org/remote", "model.trust_remote_code=true"])
    model, run_dir, config_file = {
        "--run": (run / "final", run, run / "config.yaml"),
        "final": (run / "final", None, run / "config.yaml"),
        "checkpoint": (checkpoint, None, checkpoint / "state.json"),
        "other": (tmp_path / "other", run, run / "config.yaml"),
    }[named]
    args = argparse.Namespace(model=str(model), run_dir=run_dir and str(run_dir), revision=None,
                              device="cpu", dtype="float32", backend="hf",
                              trust_remote_code=flag)  # fmt: skip
    load_sampler(args, config, str(config_file))
    assert seen == [flag] * (1 if named == "checkpoint" else 2)
    noted = not flag and named != "other"
    assert capsys.readouterr().err.splitlines() == (
        [_remote_code_note(config_file)] if noted else []
    )


def test_a_runs_own_code_runs_neither_for_run_nor_for_its_final_without_the_flag(
    tiny_model_dir, tmp_path, capsys
):
    """`--run R` and `--model R/final` of a run that set model.trust_remote_code: true load the
    same model, transformers' own class, and sample the same; the code final/ ships never runs."""
    from oncurve.config import save_config

    run = tmp_path / "run"
    final, marker = run / "final", tmp_path / "ran"
    with_own_code(tiny_model_dir, final, marker)
    overrides = [f"model.path={tiny_model_dir}", "model.trust_remote_code=true"]
    save_config(load_config(None, overrides), run / "config.yaml")
    prompt = ["--prompt", "1+1=", "--device", "cpu", "--temperature", "0", "--max-new-tokens", "4"]
    outputs = []
    for named in (["--run", str(run)], ["--model", str(final)]):
        assert main(["sample", *named, *prompt]) == 0
        captured = capsys.readouterr()
        outputs.append(captured.out)
        assert _remote_code_note(run / "config.yaml") in captured.err.splitlines()
    assert outputs[0] == outputs[1] and outputs[0]
    assert not marker.exists()


def test_revision_with_a_run_names_the_run_not_a_model_never_given(
    tiny_model_dir, tmp_path, capsys
):
    from oncurve.config import save_config

    shutil.copytree(tiny_model_dir, tmp_path / "final")
    save_config(load_config(None, [f"model.path={tiny_model_dir}"]), tmp_path / "config.yaml")
    assert main(["eval", "--run", str(tmp_path), "--revision", "main", "--data", "x.jsonl"]) == 2
    assert capsys.readouterr().err == (
        f"oncurve: error: --revision applies to a Hugging Face Hub id only; --run {tmp_path} "
        "loads its local final/\n"
    )


def test_a_run_directory_given_as_the_model_points_to_run(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("run: {steps: 1}\n")
    assert main(["sample", "--model", str(tmp_path), "--prompt", "1+1="]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"has no config.json (not a Hugging Face model dir); a run directory: "
                        f"--run {tmp_path}, or its final/")  # fmt: skip


def test_an_interrupt_before_the_run_handles_signals_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C while `oncurve train` still imports torch and loads its config (before the run
    takes signals over): one line, the status of a run stopped before step 1, no traceback."""
    import oncurve.loop.trainer as trainer

    def interrupted(config, quiet=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    assert main(["train", "run.steps=1"]) == 130
    assert capsys.readouterr().err == "oncurve: stopped on request (an interrupt)\n"


def test_a_rank_whose_peer_failed_says_so_in_one_line(monkeypatch, capsys):
    """A collective that fails on this rank (the other raised or died): one line that points
    at the other rank's own error, not a traceback; any other RuntimeError keeps its trace."""
    import torch.distributed as dist

    import oncurve.loop.trainer as trainer

    def collective_times_out(config, quiet=False):
        raise RuntimeError("[gloo/transport/tcp] Timed out waiting 20000ms for recv operation")

    monkeypatch.setattr(trainer, "train", collective_times_out)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    assert main(["train", "run.steps=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("oncurve: error: rank 0: a collective failed: another rank of the job")

    def a_bug(config, quiet=False):
        raise RuntimeError("shape mismatch in the loss")

    monkeypatch.setattr(trainer, "train", a_bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(["train", "run.steps=1"])


def test_eval_and_sample_decode_with_the_runs_stop_strings_and_least_length():
    config = load_config(None, ["rollout.stop=[<answer>]", "rollout.min_new_tokens=3"])
    unset = dict.fromkeys(("max_new_tokens", "temperature", "top_p", "top_k", "min_p"))
    chosen = sampling(argparse.Namespace(**unset), config, "run/config.yaml")
    params = chosen.params(2, seed=5)
    assert params.stop == ("<answer>",) and params.seed == 5
    assert (params.max_new_tokens, params.min_new_tokens) == (2, 2)  # fitted under the length


@pytest.mark.parametrize("named", ["--run", "--model"])
def test_a_runs_final_model_cut_short_is_named_so_whether_by_run_or_by_model(
    named, tmp_path, capsys
):
    """`--model RUN/final` says what `--run RUN` says of a final/ whose save was cut short (and
    how to write it again), not that the weights need converting to safetensors."""
    from oncurve.config import save_config

    run = tmp_path / "run"
    shutil.copytree(resolve_model_path("default"), run / "final")
    (run / "final" / "model.safetensors").unlink()
    save_config(load_config(None, []), run / "config.yaml")
    given = str(run) if named == "--run" else str(run / "final")
    assert main(["sample", named, given, "--prompt", "1+1="]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"oncurve: error: {named} {given}: final/ is incomplete (no readable ")
    assert err.rstrip().endswith(f"oncurve train run.resume=auto run.dir={run}")


def test_eval_names_the_reward_given_when_it_fails(tmp_path, capsys):
    """`--reward module:function` that raises is named in the error line, not as `correct`."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    reward = "helpers.rewards_for_tests:raises_value_error"
    argv = ["eval", "--model", "default", "--data", str(rows), "--reward", reward]
    with pytest.warns(RuntimeWarning, match="reward 'raises_value_error' failed on a whole"):
        assert main([*argv, "--max-new-tokens", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "oncurve: error: reward 'raises_value_error' failed on sample 0: ValueError"
    )
