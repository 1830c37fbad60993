"""Out of memory is not the end of a run (`oncurve.run.oom`): each phase that raises
`torch.OutOfMemoryError` is redone in smaller pieces on the same data, says what it changed,
and a run that cannot go on saves its last finished step and stops with one line."""

from __future__ import annotations

import pytest
import torch
import yaml
from helpers.configs import make_config
from helpers.models import tiny_qwen2
from helpers.runs import metric_rows
from safetensors.torch import load_file

from oncurve.config import load_config
from oncurve.loop import collect, trainer
from oncurve.loop import training_step as loop_step
from oncurve.model.char_tokenizer import char_tokenizer
from oncurve.run import checkpoint, oom
from oncurve.update import step as update_step
from oncurve.update.policy import Policy

FAST = ("run.preflight=false", "eval.at_start_end=false", "optim.microbatch_size=16")


def out_of_memory_once(real, calls: list[int], at: int = 1):
    """`real`, raising torch.OutOfMemoryError at its `at`-th call only."""

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    return wrapper


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def run(tiny_model_dir, data_file, run_dir, *extra):
    return trainer.train(make_config(tiny_model_dir, data_file, run_dir, *FAST, *extra), quiet=True)


def test_halving_the_microbatches_settings_then_checkpointing_then_giving_up():
    config = load_config(None, ["optim.microbatch_size=2", "optim.microbatch_tokens=512"])
    config, change = oom.halve_microbatches(config)
    assert change == "optim.microbatch_size 2 -> 1, optim.microbatch_tokens 512 -> 256"
    config, change = oom.halve_microbatches(config)
    assert change == "model.gradient_checkpointing false -> true"
    assert config.model.gradient_checkpointing and config.optim.microbatch_size == 1
    assert oom.halve_microbatches(config) is None
    shrink = oom.fewer_prompts_per_call(5)
    config, change = shrink(config)
    assert change == "rollout.prompts_per_call 5 -> 2" and config.rollout.prompts_per_call == 2
    assert shrink(shrink(config)[0]) is None
    settings = oom.settings_of(config)
    assert oom.settings_of(oom.with_settings(load_config(None, []), settings)) == settings


def test_an_update_that_runs_out_once_is_redone_and_trains_as_the_run_that_never_did(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    """The second microbatch of the first update runs out, after the first one's backward
    added its gradients: those are discarded and the step is redone in microbatches of 4."""
    plain = tmp_path / "plain"
    run(tiny_model_dir, data_file, plain, "optim.microbatch_size=8")
    calls: list[int] = []
    loss = out_of_memory_once(update_step.microbatch_loss, calls, at=2)
    monkeypatch.setattr(update_step, "microbatch_loss", loss)
    recovered = tmp_path / "recovered"
    run(tiny_model_dir, data_file, recovered, "optim.microbatch_size=8")
    assert "out of memory in the update: redoing it with optim.microbatch_size 8 -> 4" in (
        capsys.readouterr().err
    )
    want, got = final_weights(plain), final_weights(recovered)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    rows = metric_rows(recovered)
    # metric_rows leaves memory/* out: read the file's own rows
    retries = [r["memory/oom_retries"] for r in trainer_rows(recovered)]
    assert retries == [1.0, 0.0, 0.0]
    for key in ("reward/mean", "length/mean"):  # the step trained on what it sampled
        assert [r[key] for r in rows] == [r[key] for r in metric_rows(plain)]
    saved = yaml.safe_load((recovered / "config.yaml").read_text())
    assert saved["optim"]["microbatch_size"] == 4
    state = checkpoint.read_state(checkpoint.latest_checkpoint(recovered))
    assert state["oom_settings"] == {"optim.microbatch_size": 4}


def trainer_rows(run_dir) -> list[dict]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "memory/oom_retries" in row]


def test_sampling_the_reference_and_evaluation_each_recover(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    draws, references, evaluations = [], [], []
    monkeypatch.setattr(collect, "draw", out_of_memory_once(collect.draw, draws))
    monkeypatch.setattr(
        Policy,
        "reference_logprobs",
        out_of_memory_once(Policy.reference_logprobs, references, at=2),
    )
    monkeypatch.setattr(trainer, "evaluate", out_of_memory_once(trainer.evaluate, evaluations))
    run_dir = tmp_path / "run"
    config = make_config(
        tiny_model_dir,
        data_file,
        run_dir,
        "run.preflight=false",
        "optim.microbatch_size=16",
        f"eval.path={data_file}",
        "eval.num_prompts=8",
        "eval.batch_rows=8",
    )
    trainer.train(config, quiet=True)
    err = capsys.readouterr().err
    assert "out of memory in sampling: redoing it with rollout.prompts_per_call 4 -> 2" in err
    assert "out of memory in the reference forward: redoing it with optim.microbatch_size" in err
    assert "out of memory in evaluation: redoing it with eval.batch_rows 8 -> 4" in err
    assert [r["memory/oom_retries"] for r in trainer_rows(run_dir)] == [1.0, 1.0, 0.0]
    # after the split, every step samples its 4 prompts in calls of 2: 2 calls a step
    assert len(draws) == 1 + 2 * 3
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rollout"]["prompts_per_call"] == 2 and saved["eval"]["batch_rows"] == 4
    assert saved["optim"]["microbatch_size"] == 8


def test_a_run_that_cannot_fit_one_row_saves_its_last_step_and_stops_in_one_line(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    real = loop_step.optimizer_step
    steps: list[int] = []

    def from_step_2(*args, **kwargs):
        steps.append(1)
        if len(steps) > 1:  # the first update succeeds, every later one runs out
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_step, "optimizer_step", from_step_2)
    run_dir = tmp_path / "run"
    with pytest.raises(oom.OutOfMemoryStop) as stopped:
        run(tiny_model_dir, data_file, run_dir, "run.steps=3")
    message = str(stopped.value)
    assert "\n" not in message
    assert "out of memory in the update" in message and "Tried to allocate 9.00 GiB" in message
    assert "step 1 is saved" in message and "run.resume=auto" in message
    assert checkpoint.read_state(checkpoint.latest_checkpoint(run_dir))["step"] == 1
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["optim"]["microbatch_size"] == 1 and saved["model"]["gradient_checkpointing"]


def test_a_resumed_run_starts_from_the_smaller_settings(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    calls: list[int] = []
    monkeypatch.setattr(
        loop_step, "optimizer_step", out_of_memory_once(loop_step.optimizer_step, calls)
    )
    run_dir = tmp_path / "run"
    run(tiny_model_dir, data_file, run_dir, "run.steps=1")
    monkeypatch.undo()
    resumed = make_config(
        tiny_model_dir, data_file, run_dir, *FAST, "run.steps=2", "run.resume=auto"
    )
    s = trainer.setup(resumed)
    assert s.start_step == 1
    assert s.config.optim.microbatch_size == 8 and s.policy.forward.microbatch_rows == 8
    assert "resuming with the settings the run made smaller" in capsys.readouterr().err


def test_with_several_ranks_the_rank_that_runs_out_stops_naming_the_setting(monkeypatch):
    """A redo on one rank would not match the collectives the others are in: no retry, one
    line naming the smaller setting to restart with."""
    monkeypatch.setattr(oom.distributed, "world", lambda: (1, 2))
    config = load_config(None, ["optim.microbatch_size=8"])
    with pytest.raises(oom.OutOfMemoryStop) as stopped:
        oom.next_settings(oom.UPDATE, config, "CUDA out of memory. Tried to allocate 1.00 GiB")
    message = str(stopped.value)
    assert "on rank 1" in message and message.endswith("restart with optim.microbatch_size=4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_capped_below_the_plan_a_run_with_too_large_a_microbatch_recovers(
    data_file, tmp_path, capsys
):
    """A 152k vocabulary makes the logits the peak: 64 rows of ~100 tokens in one microbatch
    and one logit chunk want ~4 GB of float32 logits, over a 3 GiB cap; halving the
    microbatch brings them under it."""
    tokenizer = char_tokenizer()
    model = tiny_qwen2(151_936)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    run_dir = tmp_path / "run"
    config = make_config(
        model_dir,
        data_file,
        run_dir,
        "run.device=cuda",
        "run.gpu_memory_gb=3",
        "data.prompts_per_step=8",
        "rollout.group_size=8",
        "rollout.max_new_tokens=96",
        "rollout.min_new_tokens=96",
        "optim.microbatch_size=64",
        "optim.microbatch_tokens=0",
        "model.logprob_chunk_size=8192",
        "eval.at_start_end=false",
        # the preflight recovers from running out of memory too, before step 1, where no
        # step's `memory/oom_retries` counts it; and its sampler-against-forward check would
        # judge a random 152k-vocabulary model, which this test is not about
        "run.preflight=false",
        "run.steps=2",
    )
    trainer.train(config, quiet=True)
    # what the run printed (each change of settings is a line) goes with a failure's report
    said = [line for line in capsys.readouterr().err.splitlines() if "memory" in line]
    assert sum(r["memory/oom_retries"] for r in trainer_rows(run_dir)) >= 1, said
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["optim"]["microbatch_size"] < 64, said


def test_a_sampling_round_split_after_running_out_samples_what_one_call_samples(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """With the cuda_graph sampler (eager here) a round redone in calls of half the prompts
    samples the very completions one call would have: the run trains as if nothing happened."""
    graph = ("rollout.backend=cuda_graph", "rollout.cuda_graphs=false")
    plain = tmp_path / "plain"
    run(tiny_model_dir, data_file, plain, *graph)
    draws: list[int] = []
    monkeypatch.setattr(collect, "draw", out_of_memory_once(collect.draw, draws))
    split = tmp_path / "split"
    run(tiny_model_dir, data_file, split, *graph)
    assert yaml.safe_load((split / "config.yaml").read_text())["rollout"]["prompts_per_call"] == 2
    for key in ("reward/mean", "length/mean", "adv/abs_mean"):
        assert [r[key] for r in metric_rows(split)] == [r[key] for r in metric_rows(plain)], key
    want, got = final_weights(plain), final_weights(split)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
