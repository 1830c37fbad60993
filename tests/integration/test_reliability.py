"""End to end: exact resume after SIGKILL, clean stop on SIGTERM/SIGINT, skipped
non-finite updates, failed saves, run-directory rules, one-line errors for bad input, and
memory that does not creep."""

from __future__ import annotations

import dataclasses
import errno
import gc
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from helpers.run_processes import finish, latest_step, wait_for
from helpers.runs import STEPS, cli_args, metric_rows, rewards_env, run_files, train_process
from safetensors.torch import load_file

from oncurve.algo import ppo_clip
from oncurve.algo.registry import POLICY_LOSSES
from oncurve.cli import main
from oncurve.config import load_config
from oncurve.errors import TrainingError, UserError
from oncurve.loop import trainer
from oncurve.loop.trainer import setup, train
from oncurve.loop.training_step import training_step
from oncurve.model.sources import load_model, load_tokenizer
from oncurve.run import checkpoint
from oncurve.run.checkpoint_model import checkpoint_config


def assert_same_run(run_dir: Path, reference: Path) -> None:
    got = load_file(run_dir / "final" / "model.safetensors")
    want = load_file(reference / "final" / "model.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows == metric_rows(reference)
    samples = (run_dir / "samples.jsonl").read_text()
    assert samples == (reference / "samples.jsonl").read_text()


# the pass-rate curriculum's state and the KL warmup through a kill and a resume
CURRICULUM = ("data.curriculum=pass_rate", "algo.beta_warmup_steps=4")


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, data_file, tmp_path_factory) -> Iterator[Callable[[], Path]]:
    """An uninterrupted run of STEPS steps through the CLI, the curriculum and KL warmup on,
    started at once so that it overlaps the interrupted runs; calling what it yields waits for
    it and returns its directory."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = train_process(*cli_args(tiny_model_dir, data_file, run_dir, *CURRICULUM))

    def finished() -> Path:
        if proc.returncode is None:
            code, err = finish(proc)
            assert code == 0, err
        return run_dir

    yield finished
    proc.kill()
    proc.wait()


def test_sigterm_then_sigkill_each_resumed_from_is_bit_identical_to_an_uninterrupted_run(
    tiny_model_dir, data_file, reference_run, tmp_path
):
    """SIGTERM finishes the step, saves it and exits 0, and the run resumes; SIGKILL that
    resumed run once it has saved a step of its own, and `run.resume=auto` ends it as the run
    never interrupted, the pass-rate curriculum's state and the KL warmup included (one test,
    so that the resumed run is also the one killed: a process start fewer)."""
    run_dir = tmp_path / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir, *CURRICULUM)
    proc = train_process(*args)
    wait_for(lambda: (run_dir / "metrics.jsonl").is_file(), proc, "the first step")
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err
    stopped_at = latest_step(run_dir)
    assert 1 <= stopped_at < STEPS
    # what tests/integration/test_stopping.py checks of SIGINT, SIGHUP and SIGUSR1 mid-loop
    assert "SIGTERM: stopping after step" in err and "signal again to abort" in err
    assert f"stopped at step {stopped_at} on request" in err
    assert "Traceback" not in err
    assert [r["step"] for r in metric_rows(run_dir)] == list(range(1, stopped_at + 1))
    assert not (run_dir / "final").exists()

    # resumed with a checkpoint every step (only the newest kept), killed once it has its own
    args = [*args, "run.save_every=1", "run.keep_last=1", "run.resume=auto"]
    proc = train_process(*args)
    later = max(stopped_at + 1, STEPS // 2)
    wait_for(lambda: latest_step(run_dir) >= later, proc, f"checkpoint {later}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = latest_step(run_dir)
    assert killed_at < STEPS and not (run_dir / "final").exists()

    code, err = finish(train_process(*args))
    assert code == 0, err
    assert_same_run(run_dir, reference_run())
    rows = metric_rows(run_dir)
    assert [row["kl/beta"] for row in rows] == [0.01, 0.02, 0.03, 0.04, 0.04, 0.04]
    assert all("curriculum/skipped" in row for row in rows)


def make_config(model_dir: Path, data_file: Path, run_dir: Path, *extra: str):
    return load_config(None, cli_args(model_dir, data_file, run_dir, "run.steps=3", *extra))


def test_sigint_in_process_stops_after_the_current_step_with_a_checkpoint(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capfd
):
    run_dir = tmp_path / "run"
    real_step = trainer.training_step

    def step_then_interrupt(s, step):
        metrics = real_step(s, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(trainer, "training_step", step_then_interrupt)
    # the handler the process started with: a job started in the background has SIGINT ignored
    handler_before = signal.getsignal(signal.SIGINT)
    result = train(make_config(tiny_model_dir, data_file, run_dir, "run.steps=5"), quiet=True)
    assert (result.steps, result.completed) == (2, False)
    assert checkpoint.latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step-000002"
    assert not (run_dir / "final").exists()
    err = capfd.readouterr().err
    assert "SIGINT: stopping after step" in err and "signal again to abort" in err
    assert "stopped at step 2 on request" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is handler_before


def test_non_finite_updates_are_skipped_counted_and_stop_the_run_after_k_in_a_row(
    tiny_model_dir, data_file, tmp_path
):
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", "run.max_skipped_steps=3"))
    finite_loss = s.loss_fns

    def nan_policy_loss(*args, **kwargs):
        per_token, stats = finite_loss.policy_loss(*args, **kwargs)
        return per_token * float("nan"), stats

    def weights():
        return {n: p.detach().clone() for n, p in s.policy.model.named_parameters()}

    nan_loss = dataclasses.replace(finite_loss, policy_loss=nan_policy_loss)
    before = weights()
    s.loss_fns = nan_loss
    assert training_step(s, 1)["updates/skipped"] == 1.0
    # A finite loss whose gradient is not: one parameter's gradient becomes infinite.
    s.loss_fns = finite_loss
    hook = s.policy.model.get_output_embeddings().weight.register_hook(lambda g: g * float("inf"))
    metrics = training_step(s, 2)
    hook.remove()
    assert metrics["updates/skipped"] == 1.0 and metrics["grad_norm"] == float("inf")
    assert s.counts.skipped_in_a_row == 2
    for name, value in weights().items():
        assert torch.equal(value, before[name]), name
    assert not s.optimizer.state  # AdamW never stepped: no moments were built

    metrics = training_step(s, 3)
    assert metrics["updates/skipped"] == 0.0 and s.counts.skipped_in_a_row == 0
    assert any(not torch.equal(v, before[n]) for n, v in weights().items())

    s.loss_fns = nan_loss
    training_step(s, 4)
    training_step(s, 5)
    with pytest.raises(TrainingError, match="3 consecutive updates had a non-finite loss"):
        training_step(s, 6)


def test_the_cli_stops_a_run_of_non_finite_updates_with_one_line_and_exit_1(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    def nan_policy_loss(*args, **kwargs):
        per_token, stats = ppo_clip(*args, **kwargs)
        return per_token * float("nan"), stats

    monkeypatch.setitem(POLICY_LOSSES, "ppo_clip", nan_policy_loss)
    run_dir = tmp_path / "run"
    # the preflight would stop the NaN loss first, with its own message
    args = cli_args(
        tiny_model_dir, data_file, run_dir, "run.max_skipped_steps=2", "run.preflight=false"
    )
    assert main(["train", "--quiet", *args]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "oncurve: error: 2 consecutive updates had a non-finite loss or gradient norm; stopping "
        "(lower optim.lr, check the rewards, or raise run.max_skipped_steps)"
    ]
    assert [r["updates/skipped"] for r in metric_rows(run_dir)] == [1.0]
    assert not (run_dir / "final").exists()


def test_a_save_that_hits_a_full_disk_keeps_the_previous_checkpoint_and_exits_1(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(
        tiny_model_dir, data_file, run_dir, "run.steps=3", "run.save_every=1", "run.preflight=false"
    )
    real_write = checkpoint.write_file

    def disk_full_at_step_2(path: Path, dump) -> None:
        if path.name == "optimizer.pt" and "step-000002" in path.parent.name:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, dump)

    monkeypatch.setattr(checkpoint, "write_file", disk_full_at_step_2)
    assert main(["train", "--quiet", *args, "run.keep_last=1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "cannot save checkpoint" in err[0] and "No space left on device" in err[0]
    assert "the previous checkpoint is kept" in err[0]
    checkpoints = run_dir / "checkpoints"
    assert checkpoint.latest_checkpoint(run_dir) == checkpoints / "step-000001"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-000001"]

    monkeypatch.setattr(checkpoint, "write_file", real_write)
    assert main(["train", "--quiet", *args, "run.resume=auto"]) == 0
    assert [r["step"] for r in metric_rows(run_dir)] == [1, 2, 3]


def test_a_non_empty_run_dir_is_refused_without_resume_or_overwrite(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')  # a run's
    assert main(["train", *cli_args(tiny_model_dir, data_file, run_dir)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"oncurve: error: run.dir {run_dir} is not empty; pass run.resume=auto to continue it "
        "or run.overwrite=true to start over"
    ]
    (run_dir / "notes.txt").write_text("mine")  # not a run's: neither would take it
    assert main(["train", *cli_args(tiny_model_dir, data_file, run_dir)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"oncurve: error: run.dir {run_dir} holds files no run wrote (notes.txt); neither "
        "run.resume=auto nor run.overwrite=true takes it, pick another run.dir"
    ]
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_resume_auto_without_a_checkpoint_starts_fresh_but_never_deletes_foreign_files(
    tiny_model_dir, data_file, tmp_path, capsys
):
    # What a run killed before its first checkpoint leaves behind: it is started over.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')
    (run_dir / "checkpoints").mkdir()
    s = setup(make_config(tiny_model_dir, data_file, run_dir, "run.resume=auto"))
    assert s.start_step == 0
    assert f"note: no checkpoint in {run_dir}; starting a new run" in capsys.readouterr().err
    assert not (run_dir / "metrics.jsonl").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        setup(make_config(tiny_model_dir, data_file, other, "run.resume=auto"))
    assert (other / "notes.txt").read_text() == "mine"


def test_a_refused_start_removes_only_a_run_dir_it_made_that_holds_no_file(
    tiny_model_dir, data_file, tmp_path
):
    def refuse(s: trainer.Session) -> None:  # a refused preflight, after empty folders
        (s.run_dir / "checkpoints" / "step-000001").mkdir(parents=True)
        raise UserError("refused")

    made = tmp_path / "made" / "run"
    with pytest.raises(UserError, match="refused"):
        setup(make_config(tiny_model_dir, data_file, made), refuse)
    assert not (tmp_path / "made").exists()
    # the next start into it is a new run's: no lock or run left to refuse it
    assert setup(make_config(tiny_model_dir, data_file, made)).run_dir == made

    def write_and_refuse(s: trainer.Session) -> None:
        (s.run_dir / "notes.txt").write_text("a file")
        refuse(s)

    written = tmp_path / "written"
    with pytest.raises(UserError, match="refused"):
        setup(make_config(tiny_model_dir, data_file, written), write_and_refuse)
    assert (written / "notes.txt").read_text() == "a file"
    assert (written / "checkpoints" / "step-000001").is_dir()
    # a directory that was there before is left, empty or holding a previous run
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="refused"):
        setup(make_config(tiny_model_dir, data_file, empty), refuse)
    assert (empty / "checkpoints" / "step-000001").is_dir()
    previous = tmp_path / "previous"
    (previous / "tensorboard").mkdir(parents=True)
    (previous / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')
    files = run_files(previous)
    with pytest.raises(UserError, match="refused"):
        setup(make_config(tiny_model_dir, data_file, previous, "run.overwrite=true"), refuse)
    assert run_files(previous) == files and (previous / "tensorboard").is_dir()


def test_resume_from_a_given_checkpoint_and_refuse_another_world_size(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    train(make_config(tiny_model_dir, data_file, run_dir, "run.save_every=1", "run.keep_last=3"))
    first = run_dir / "checkpoints" / "step-000001"
    later = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[1:]
    with pytest.raises(UserError, match="older than the run's newest checkpoints") as refused:
        setup(make_config(tiny_model_dir, data_file, run_dir, f"run.resume={first}"))
    assert later and all(name in str(refused.value) for name in later[:3])
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[1:] == later
    overwrite = "run.overwrite=true"
    # a resume refused for a changed setting deletes nothing
    with pytest.raises(UserError, match="cannot resume .* run.seed was 0 and is now 1"):
        setup(make_config(tiny_model_dir, data_file, run_dir, f"run.resume={first}", overwrite,
                          "run.seed=1"))  # fmt: skip
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))[1:] == later
    # resume=auto with overwrite: the checkpoint wins, and the run says so
    capsys.readouterr()
    assert setup(make_config(tiny_model_dir, data_file, run_dir, "run.resume=auto", overwrite,
                             "run.steps=4")).start_step == 3  # fmt: skip
    assert "note: run.resume=auto continues" in capsys.readouterr().err
    assert (run_dir / "final" / "model.safetensors").is_file()  # refused: left as it was
    s = setup(make_config(tiny_model_dir, data_file, run_dir, f"run.resume={first}", overwrite))
    assert s.start_step == 1
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000001"]
    # the final model of the later steps goes with them: `oncurve eval --run` would score it
    assert not (run_dir / "final").exists()
    assert [r["step"] for r in metric_rows(run_dir)] == [1]
    saved = load_file(first / "model.safetensors")
    for name, value in s.policy.model.state_dict().items():
        if name in saved:
            assert torch.equal(value, saved[name]), name

    other = tmp_path / "two-ranks"
    checkpoint.save_checkpoint(
        other, 1, s.policy.model, s.optimizer, s.scheduler, {"step": 1, "world_size": 2}
    )
    with pytest.raises(UserError, match="written by 2 ranks; resume it with the same number"):
        setup(make_config(tiny_model_dir, data_file, other, "run.resume=auto"))
    # two ranks asked of a one-rank run: refused before torchrun starts, in one line
    two = cli_args(tiny_model_dir, data_file, run_dir, "dist.nproc=2", "run.resume=auto")
    capsys.readouterr()
    assert main(["train", *two, "run.steps=3"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "written by 1 ranks; resume it with the same number, not 2" in err
    )


def test_a_bad_input_on_every_rank_is_one_line_from_the_launcher(tiny_model_dir, tmp_path):
    """Every rank of a 2-rank job meets the same bad input: the launcher says it once, with
    the ranks' exit status (2), and no traceback of torchrun's."""
    missing = tmp_path / "missing.jsonl"
    command = [sys.executable, "-m", "oncurve", "train", "dist.nproc=2", "run.device=cpu",
               f"model.path={tiny_model_dir}", f"data.path={missing}", "run.steps=1",
               f"run.dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    line = f"oncurve: error: {missing}: no such file or directory"
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count(line) == 1 and done.stderr.rstrip().endswith(line)
    assert "Traceback" not in done.stderr and "OMP_NUM_THREADS" not in done.stderr


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_synced_reference_is_checkpointed_and_restored(tiny_model_dir, data_file, tmp_path):
    run_dir = tmp_path / "run"
    sync = ("run.save_every=1", "run.keep_last=3", "algo.ref_sync_every=1")
    train(make_config(tiny_model_dir, data_file, run_dir, "run.steps=2", *sync))
    first, second = (run_dir / "checkpoints" / f"step-00000{k}" for k in (1, 2))
    reference = load_file(first / "reference.safetensors")
    # synced after each update: the reference of step k is the policy of step k
    assert same_weights(reference, load_file(first / "model.safetensors"))
    assert same_weights(
        load_file(second / "reference.safetensors"), load_file(second / "model.safetensors")
    )
    assert not same_weights(reference, load_file(second / "model.safetensors"))

    s = setup(
        make_config(tiny_model_dir, data_file, tmp_path / "branch", f"run.resume={first}", *sync)
    )
    restored = s.policy.reference.state_dict()
    for name, value in reference.items():
        assert torch.equal(restored[name], value), name

    # never synced: the reference is the initial model, which the run rebuilds from model.path
    plain = tmp_path / "plain"
    train(make_config(tiny_model_dir, data_file, plain, "run.steps=1"))
    assert not (plain / "checkpoints" / "step-000001" / "reference.safetensors").exists()


def test_a_resume_that_starts_or_stops_syncing_the_reference_keeps_the_runs_reference(
    tiny_model_dir, data_file, tmp_path, capsys
):
    """A reference the checkpoint does not hold (never synced, or none at algo.beta=0) is the
    initial model; one it holds is restored and kept by later checkpoints, synced or not."""
    run_dir = tmp_path / "run"
    base = ("run.save_every=1", "run.keep_last=4")
    train(make_config(tiny_model_dir, data_file, run_dir, *base, "run.steps=1"))
    capsys.readouterr()
    steps = [run_dir / "checkpoints" / f"step-00000{k}" for k in range(5)]
    syncing = (*base, "run.resume=auto", "algo.ref_sync_every=2")
    s = setup(make_config(tiny_model_dir, data_file, run_dir, *syncing, "run.steps=2"))
    initial = load_file(tiny_model_dir / "model.safetensors")
    restored = s.policy.reference.state_dict()
    assert all(torch.equal(restored[name], value) for name, value in initial.items())
    train(make_config(tiny_model_dir, data_file, run_dir, *syncing, "run.steps=3"))
    assert "algo.ref_sync_every 0 -> 2" in capsys.readouterr().err
    synced = load_file(steps[2] / "reference.safetensors")  # synced after step 2's update
    assert same_weights(synced, load_file(steps[2] / "model.safetensors"))
    assert same_weights(load_file(steps[3] / "reference.safetensors"), synced)
    # syncing stopped: the synced reference stays, in this checkpoint and the next
    stopped = (*base, "run.resume=auto", "algo.ref_sync_every=0", "run.steps=4")
    train(make_config(tiny_model_dir, data_file, run_dir, *stopped))
    assert same_weights(load_file(steps[4] / "reference.safetensors"), synced)
    assert not same_weights(synced, load_file(steps[4] / "model.safetensors"))

    # a checkpoint of algo.beta=0 holds no reference: a KL term added on resume starts one
    no_kl = tmp_path / "no-kl"
    train(make_config(tiny_model_dir, data_file, no_kl, *base, "run.steps=1", "algo.beta=0"))
    kl = ("run.resume=auto", "algo.beta=0.04", "algo.ref_sync_every=1", "run.steps=2")
    train(make_config(tiny_model_dir, data_file, no_kl, *base, *kl))
    second = no_kl / "checkpoints" / "step-000002"
    assert same_weights(
        load_file(second / "reference.safetensors"), load_file(second / "model.safetensors")
    )
    # and a resume without a KL term says it does not keep the synced reference it drops
    capsys.readouterr()
    without = ("run.resume=auto", "algo.beta=0", "algo.ref_sync_every=0", "run.steps=3")
    train(make_config(tiny_model_dir, data_file, no_kl, *base, *without))
    assert "holds a synced reference, which this run, without a KL term, does not keep" in (
        capsys.readouterr().err
    )


def test_a_resume_refuses_to_add_or_drop_a_critic(tiny_model_dir, data_file, tmp_path):
    """`algo.estimator` may change between group estimators, not to or from gae: the value
    model a critic trains is in the checkpoint or it is not."""
    grpo, gae = tmp_path / "grpo", tmp_path / "gae"
    base = ("run.save_every=1", "run.steps=1")
    train(make_config(tiny_model_dir, data_file, grpo, *base))
    train(make_config(tiny_model_dir, data_file, gae, *base, "algo.estimator=gae"))
    resume = ("run.save_every=1", "run.steps=2", "run.resume=auto")
    for run_dir, old, new in ((grpo, "grpo", "gae"), (gae, "gae", "grpo")):
        config = make_config(tiny_model_dir, data_file, run_dir, *resume, f"algo.estimator={new}")
        named = f"algo.estimator was '{old}' and is now '{new}'.*algo.estimator={old}"
        with pytest.raises(UserError, match=f"cannot resume .*step-000001: {named}"):
            setup(config)
    s = setup(make_config(tiny_model_dir, data_file, grpo, *resume, "algo.estimator=rloo"))
    assert "algo.estimator" in s.config_history[-1]["changed"]


def without_token(model_dir: Path, out: Path, *keys: str) -> Path:
    shutil.copytree(model_dir, out)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    for key in keys:
        config.pop(key)
    config_file.write_text(json.dumps(config))
    return out


def test_a_tokenizer_without_pad_falls_back_to_eos_with_a_notice_and_trains(
    tiny_model_dir, data_file, tmp_path, capsys
):
    model_dir = without_token(tiny_model_dir, tmp_path / "model", "pad_token")
    args = cli_args(model_dir, data_file, tmp_path / "run", "run.steps=1")
    assert main(["train", "--quiet", *args]) == 0
    err = capsys.readouterr().err
    assert f"note: tokenizer in {model_dir} has no pad token; using EOS for padding" in err
    assert [r["step"] for r in metric_rows(tmp_path / "run")] == [1]


def bad_model(kind: str, model_dir: Path, tmp_path: Path) -> Path:
    if kind == "missing":
        return tmp_path / "missing"
    if kind == "no config.json":
        shutil.copytree(model_dir, tmp_path / "model")
        (tmp_path / "model" / "config.json").unlink()
        return tmp_path / "model"
    if kind == "no tokenizer files":
        shutil.copytree(model_dir, tmp_path / "model")
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (tmp_path / "model" / name).unlink(missing_ok=True)
        return tmp_path / "model"
    return without_token(model_dir, tmp_path / "model", "pad_token", "eos_token")


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "is not a directory (a local Hugging Face model)"),
        ("no config.json", "has no config.json"),
        ("no EOS", "has no EOS token; completions could never end"),
        ("no tokenizer files", "encodes text to no tokens: no tokenizer files there?"),
    ],
)
def test_a_bad_model_dir_exits_2_with_one_line(
    tiny_model_dir, data_file, tmp_path, capsys, kind, message
):
    model_dir = bad_model(kind, tiny_model_dir, tmp_path)
    assert main(["train", *cli_args(model_dir, data_file, tmp_path / "run")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("oncurve: error: ") and message in err[0], err
    assert str(model_dir) in err[0]


def test_model_and_tokenizer_load_from_a_str_path_as_from_a_path(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert tokenizer("12+3=")["input_ids"] == load_tokenizer(tiny_model_dir)("12+3=")["input_ids"]
    assert tokenizer.padding_side == "left"
    model = load_model(str(tiny_model_dir))
    reference = load_model(tiny_model_dir)
    assert not model.training
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True)
    )
    with pytest.raises(UserError, match="cannot load a tokenizer from /no/such/dir"):
        load_tokenizer("/no/such/dir")


@pytest.mark.parametrize(
    ("data", "override", "message"),
    [
        (None, "rollout.group_size=0", "rollout.group_size must be in [2, inf), got 0"),
        (None, "optim.lr=fast", "optim.lr must be float, got str 'fast'"),
        ("", None, "data.jsonl: empty, no rows"),
        ('{"question": "1+1=", "answer": "2"}\n', None, "line 1: missing field 'prompt'"),
        ('{"prompt": "1+1="', None, "line 1: invalid JSON"),
        (
            None,
            "reward.functions=[no_such_module_xyz:fn]",
            "reward 'no_such_module_xyz:fn': cannot import module 'no_such_module_xyz'",
        ),
        (
            None,
            "reward.functions=[helpers.rewards_for_tests:no_such_fn]",
            "module 'helpers.rewards_for_tests' has no attribute 'no_such_fn'",
        ),
    ],
)
def test_bad_config_data_or_reward_path_exits_2_with_one_line(
    tiny_model_dir, data_file, tmp_path, capsys, data, override, message
):
    if data is not None:
        data_file = tmp_path / "data.jsonl"
        data_file.write_text(data)
    run_dir = tmp_path / "runs" / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir, *filter(None, [override]))
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("oncurve: error: ") and message in err[0], err
    # the bad data and rewards are found after the run directory was made and locked: it goes
    # again, with the folder made for it, rather than pass for a run
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_device_without_cuda_exits_2_with_one_line(
    tiny_model_dir, data_file, tmp_path, capsys
):
    args = cli_args(tiny_model_dir, data_file, tmp_path / "run", "run.device=cuda")
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "oncurve: error: run.device=cuda, but this torch ("
    ), err
    assert err[0].endswith(") sees no CUDA device; use run.device=cpu or auto")


def test_resident_memory_and_live_objects_hold_steady_after_warm_up(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    # Fixed completion length: every step allocates the same shapes, so the allocator reuses
    # its blocks and anything kept per step (graphs, tensors, rows) shows as growth.
    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", "run.steps=40", "rollout.min_new_tokens=8"
    )
    page = os.sysconf("SC_PAGE_SIZE")
    rss_mb: list[float] = []
    live_objects: dict[int, int] = {}
    real_step = trainer.training_step

    def measured_step(s, step):
        metrics = real_step(s, step)
        rss_mb.append(int(Path("/proc/self/statm").read_text().split()[1]) * page / 2**20)
        # The list of every live object (several MB) stays with the allocator once made, so it
        # is first made at step 5, before both windows: later lists reuse its memory instead of
        # raising the RSS of the second window alone.
        if step in (5, 20, 30, 40):
            gc.collect()
            live_objects[step] = len(gc.get_objects())
        return metrics

    monkeypatch.setattr(trainer, "training_step", measured_step)
    train(config, quiet=True)
    # A steady run stays far under the bound; keeping one step's autograd graph a step passes
    # it many times over. As with the objects below, a one-off rise (a library's lazy buffer,
    # once in the run) lifts one 10-step span over the one before, while a leak lifts both.
    spans = [sum(rss_mb[first : first + 10]) / 10 for first in (10, 20, 30)]
    growth = min(spans[1] - spans[0], spans[2] - spans[1])
    assert growth < 2.0, rss_mb
    # Once in a run, at a step that moves with the machine's load, a batch of objects appears
    # for good, in one span or the other: the smaller span ignores it, while a leak of even one
    # object a step grows both 10-step spans.
    assert min(live_objects[30] - live_objects[20], live_objects[40] - live_objects[30]) < 5


def test_overwrite_replaces_a_previous_run_but_never_deletes_foreign_files(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir)
    assert main(["train", "--quiet", *args, "run.steps=1"]) == 0
    first = (run_dir / "metrics.jsonl").read_text()
    assert main(["train", "--quiet", *args, "run.steps=2", "run.overwrite=true"]) == 0
    assert [r["step"] for r in metric_rows(run_dir)] == [1, 2]
    assert (run_dir / "metrics.jsonl").read_text() != first
    # an overwrite refused for a bad setting leaves the previous run as it was
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    capsys.readouterr()
    assert main(["train", "--quiet", *args, "run.overwrite=true", "reward.functions=[corect]"]) == 2
    assert "corect" in capsys.readouterr().err
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    # so does one refused once the session is built: references `correct` cannot pay
    config_before = (run_dir / "config.yaml").read_text()
    solutions = tmp_path / "solutions.jsonl"
    solution = "She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    solutions.write_text(json.dumps({"prompt": "How many clips?", "answer": solution}) + "\n")
    refused = [f"data.path={solutions}", "data.answer_format=raw", "reward.functions=[correct]"]
    assert main(["train", "--quiet", *args, "run.overwrite=true", *refused]) == 2
    assert "correct" in capsys.readouterr().err
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before
    assert (run_dir / "config.yaml").read_text() == config_before

    (run_dir / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["train", "--quiet", *args, "run.overwrite=true"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"oncurve: error: run.dir {run_dir} holds files no run wrote (notes.txt); "
        "run.overwrite only replaces a previous run, pick another run.dir"
    ]
    assert (run_dir / "notes.txt").read_text() == "mine"
    assert (run_dir / "final").is_dir()
    # nor files kept inside the run's checkpoints or final model
    (run_dir / "notes.txt").unlink()
    mine = (
        "final/notes.txt",
        "checkpoints/step-000002/my-eval.csv",
        "report/chapter1.tex",
        "tensorboard/other_project/events.out",
        "wandb/notes.md",
    )
    for nested in mine:
        (run_dir / nested).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / nested).write_text("mine")
        assert main(["train", "--quiet", *args, "run.overwrite=true"]) == 2
        assert f"holds files no run wrote ({nested})" in capsys.readouterr().err
        assert (run_dir / nested).read_text() == "mine"
        (run_dir / nested).unlink()
    # what a run, its trackers and `oncurve report` write there is replaced
    runs_own = (
        "report/report.html",
        "report/reward.png",
        "tensorboard/events.out.tfevents.1764450000.host.4242.0",
        "wandb/offline-run-20261129_220151-wmd0gjas/files/requirements.txt",
        "wandb/debug.log",
    )
    for written in runs_own:
        (run_dir / written).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / written).write_text("a run's")
    assert main(["train", "--quiet", *args, "run.steps=2", "run.overwrite=true"]) == 0
    assert not any((run_dir / written).exists() for written in runs_own)
    capsys.readouterr()
    # a config of yours kept in an empty run.dir is not a run's config.yaml
    own = tmp_path / "own"
    own.mkdir()
    (own / "config.yaml").write_text("# my experiment\nrun:\n  steps: 2\n")
    own_args = cli_args(tiny_model_dir, data_file, own)
    for how in ("run.resume=auto", "run.overwrite=true"):
        assert main(["train", "--quiet", str(own / "config.yaml"), *own_args, how]) == 2
        assert "holds files no run wrote (config.yaml)" in capsys.readouterr().err
    assert (own / "config.yaml").read_text() == "# my experiment\nrun:\n  steps: 2\n"
    # a resume writes final/ again at its end, keeping a file of yours there
    (run_dir / "final" / "NOTES.md").write_text("mine")
    resume = [*args, "run.steps=3", "run.resume=auto"]
    assert main(["train", "--quiet", *resume]) == 0
    assert (run_dir / "final" / "NOTES.md").read_text() == "mine"
    assert [r["step"] for r in metric_rows(run_dir)] == [1, 2, 3]
    capsys.readouterr()
    # a file of yours named as a run's folder is none of the run's
    shutil.rmtree(run_dir / "final")
    (run_dir / "final").write_text("mine")
    assert main(["train", "--quiet", *resume]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"oncurve: error: {run_dir / 'final'} is a file no run wrote, and the resumed run "
        "writes its final model there when it ends: move it out first"
    ]
    assert main(["train", "--quiet", *args, "run.overwrite=true"]) == 2
    assert "holds files no run wrote (final)" in capsys.readouterr().err
    assert (run_dir / "final").read_text() == "mine"


def test_a_killed_rewrite_is_cleaned_at_the_next_start_and_modes_follow_the_umask(
    tiny_model_dir, data_file, tmp_path
):
    run_dir = tmp_path / "run"
    train(make_config(tiny_model_dir, data_file, run_dir, "run.save_every=1", "run.steps=2"))
    leftovers = [run_dir / ".samples.jsonl.x1y2.tmp", run_dir / ".metrics.jsonl.ab_c.tmp"]
    for path in leftovers:
        path.write_text("half a rewrite")
    before = {name: os.stat(run_dir / name).st_mode for name in ("metrics.jsonl", "samples.jsonl")}
    step_1 = run_dir / "checkpoints" / "step-000001"
    branch = f"run.resume={step_1}", "run.overwrite=true"
    assert setup(make_config(tiny_model_dir, data_file, run_dir, *branch)).start_step == 1
    assert not any(path.exists() for path in leftovers)
    after = {name: os.stat(run_dir / name).st_mode for name in before}
    assert after == before and all(mode & 0o044 for mode in after.values())  # not mkstemp's 0600
    for path in leftovers:  # they no longer block run.overwrite either
        path.write_text("half a rewrite")
    train(make_config(tiny_model_dir, data_file, run_dir, "run.overwrite=true", "run.steps=1"))
    assert [r["step"] for r in metric_rows(run_dir)] == [1]


def test_one_trainer_per_run_dir_and_a_killed_one_leaves_no_stale_lock(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir, "run.steps=1000", "run.save_every=1")
    first = train_process(*args)
    wait_for(lambda: latest_step(run_dir) >= 1, first, "the first trainer's checkpoint")
    # paused, still holding its lock: its own saves and pruning no longer move the folder, so
    # anything gone from it below is what the second trainer did
    first.send_signal(signal.SIGSTOP)
    # a second trainer, new or resuming, is refused before it reads or deletes anything
    for extra in ((), ("run.resume=auto",), ("run.overwrite=true",)):
        before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        assert main(["train", *args, *extra]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"oncurve: error: run.dir {run_dir} is in use by another trainer")
        assert f"pid {first.pid} on " in line
        assert (run_dir / "metrics.jsonl").exists() and (run_dir / "checkpoints").is_dir()
        assert sorted(os.listdir(run_dir / "checkpoints")) == before
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    # the OS released the lock with the process: the run resumes (in this process)
    assert main(["train", "--quiet", *args[:-2], "run.steps=3", "run.resume=auto"]) == 0
    assert [r["step"] for r in metric_rows(run_dir)][-1] == 3


def locked_elsewhere(run_dir: Path) -> bool:
    """Whether an open file of `run_dir`'s lock, other than one this call opens, holds its lock."""
    import fcntl

    with open(run_dir / ".lock") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file, fcntl.LOCK_UN)
        return False


def test_the_lock_ends_when_train_returns_and_no_forked_worker_keeps_it(
    tiny_model_dir, data_file, tmp_path
):
    """`train()` unlocks its run directory as it returns (a notebook that trained blocked every
    other process's resume); a process it forked (a reward worker, which may outlive a killed
    trainer by a hung reward's duration) never held the lock: a flock is the open file's, which
    a fork shares."""
    import multiprocessing
    import time

    from oncurve.run.rundir import claim_run_dir, run_dirs_unlocked_after

    run_dir, other = tmp_path / "run", tmp_path / "other"
    with run_dirs_unlocked_after():
        claim_run_dir(make_config(tiny_model_dir, data_file, other))
        # a train() returning unlocks its own run directory, not one locked before it began
        train(make_config(tiny_model_dir, data_file, run_dir, "run.save_every=1"))
        assert not locked_elsewhere(run_dir) and locked_elsewhere(other)
    assert not locked_elsewhere(other)
    context = multiprocessing.get_context("fork")
    running = context.Event()

    def outlive_the_trainer() -> None:
        running.set()
        time.sleep(60)

    child = context.Process(target=outlive_the_trainer, daemon=True)
    try:
        with run_dirs_unlocked_after():
            claim_run_dir(make_config(tiny_model_dir, data_file, run_dir, "run.resume=auto"))
            assert locked_elsewhere(run_dir)
            child.start()
            assert running.wait(30)
        assert not locked_elsewhere(run_dir)
    finally:
        if child.is_alive():
            child.kill()


def test_resume_from_another_runs_checkpoint_never_writes_into_a_third_run(
    tiny_model_dir, data_file, tmp_path
):
    source, finished = tmp_path / "a", tmp_path / "b"
    train(make_config(tiny_model_dir, data_file, source, "run.save_every=1", "run.keep_last=3"))
    train(make_config(tiny_model_dir, data_file, finished, "run.save_every=1", "run.keep_last=3"))
    files = run_files(finished)
    step_1 = source / "checkpoints" / "step-000001"
    with pytest.raises(UserError, match=rf"run.resume {step_1} is a checkpoint of the run in"):
        setup(make_config(tiny_model_dir, data_file, finished, f"run.resume={step_1}"))
    assert run_files(finished) == files
    # into an empty directory (a branch of the run), or its own run, it resumes
    branch = tmp_path / "branch"
    assert (
        setup(make_config(tiny_model_dir, data_file, branch, f"run.resume={step_1}")).start_step
        == 1
    )
    resumed = setup(
        make_config(tiny_model_dir, data_file, source, f"run.resume={step_1}", "run.overwrite=true")
    )
    assert resumed.start_step == 1


def test_a_checkpoint_outside_a_runs_checkpoints_needs_run_dir_and_never_writes_beside_it(
    tiny_model_dir, data_file, tmp_path
):
    source = tmp_path / "a"
    train(make_config(tiny_model_dir, data_file, source, "run.save_every=1"))
    project = tmp_path / "project"
    copy = project / "saved" / "mine"
    shutil.copytree(checkpoint.latest_checkpoint(source), copy)
    (project / "config.yaml").write_text("my: notes\n")
    files = run_files(project)
    config = make_config(tiny_model_dir, data_file, source, f"run.resume={copy}")
    with pytest.raises(UserError, match="names no run to continue; pass run.dir"):
        setup(dataclasses.replace(config, run=dataclasses.replace(config.run, dir=None)))
    assert run_files(project) == files
    # through a link, the checkpoint's own run is the one the link points into
    link = tmp_path / "elsewhere" / "ck"
    link.parent.mkdir()
    link.symlink_to(checkpoint.latest_checkpoint(source))
    linked = make_config(tiny_model_dir, data_file, source, f"run.resume={link}")
    s = setup(dataclasses.replace(linked, run=dataclasses.replace(linked.run, dir=None)))
    assert s.run_dir.resolve() == source.resolve()
    assert not any((tmp_path / "elsewhere").glob("*.yaml"))


def test_a_resume_applies_what_can_change_and_refuses_what_cannot(
    tiny_model_dir, data_file, tmp_path, capsys
):
    own_data = tmp_path / "data.jsonl"
    shutil.copy(data_file, own_data)
    run_dir = tmp_path / "run"
    base = ("run.save_every=1", "run.keep_last=3", "run.steps=2", "optim.warmup_steps=0",
            "log.tensorboard=true")  # fmt: skip
    train(make_config(tiny_model_dir, own_data, run_dir, *base))
    capsys.readouterr()
    # changes a run cannot take: one line naming the setting, nothing touched, no tracker run
    copy = shutil.copytree(tiny_model_dir, tmp_path / "model-copy")
    refused = {
        f"model.path={copy}": "model.path was",
        "rollout.group_size=2": "rollout.group_size was 4 and is now 2",
        "data.prompts_per_step=1": "data.prompts_per_step was 2",
        "run.seed=7": "run.seed was",
        "model.lora.r=4": "model.lora.r was 0 and is now 4",
        "model.dtype=bfloat16": "model.dtype was",
        "run.steps=1": "run.steps=1 is below the 2 steps the checkpoint has done",
    }
    files = run_files(run_dir)
    for override, named in refused.items():
        config = make_config(tiny_model_dir, own_data, run_dir, *base, "run.resume=auto", override)
        with pytest.raises(UserError, match=f"cannot resume .*step-000002: {named}"):
            setup(config)
    lines = own_data.read_text().splitlines()
    own_data.write_text("\n".join(reversed(lines)) + "\n")  # the same rows, shuffled
    with pytest.raises(UserError, match="the training rows differ from the ones the run started"):
        setup(make_config(tiny_model_dir, own_data, run_dir, *base, "run.resume=auto"))
    # a column of their own edited (a hint, a program's tests): what the rewards read changed
    hinted = [json.dumps({**json.loads(line), "hint": "think"}) for line in lines]
    own_data.write_text("\n".join(hinted) + "\n")
    with pytest.raises(UserError, match="the training rows differ from the ones the run started"):
        setup(make_config(tiny_model_dir, own_data, run_dir, *base, "run.resume=auto"))
    own_data.write_text("\n".join(lines) + "\n")
    assert run_files(run_dir) == files
    # what can change is put in effect, said, recorded in config.yaml and the checkpoints
    changed = ("run.resume=auto", "optim.lr=0.5", "optim.weight_decay=0.25", "run.steps=4")
    train(make_config(tiny_model_dir, own_data, run_dir, *base, *changed))
    err = capsys.readouterr().err
    assert "resuming at step 2 with changed settings: optim.lr 0.01 -> 0.5" in err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["lr"] == pytest.approx(0.01) and rows[2]["lr"] == pytest.approx(0.5)
    assert "lr: 0.5" in (run_dir / "config.yaml").read_text()
    state = checkpoint.read_state(run_dir / "checkpoints" / "step-000004")
    (entry,) = state["config_history"]
    assert entry["step"] == 2 and entry["changed"]["optim.lr"] == [0.01, 0.5]
    assert (
        entry["changed"]["optim.weight_decay"][1] == 0.25 and state["config"]["run"]["steps"] == 4
    )


def test_local_paths_are_recorded_whole_and_a_relative_one_resumes_as_the_same(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """A run started with relative model and data paths records them whole, so that its
    checkpoints load from any directory; a resume that gives them relative again (or a run
    that recorded them relative) is no change."""
    shutil.copytree(tiny_model_dir, tmp_path / "model")
    shutil.copy(data_file, tmp_path / "data.jsonl")
    monkeypatch.chdir(tmp_path)
    relative = ("model.path=model", "data.path=data.jsonl", "run.save_every=1")
    train(make_config(tiny_model_dir, data_file, tmp_path / "run", *relative, "run.steps=1"))
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (saved["model"]["path"], saved["data"]["path"]) == (
        str(tmp_path / "model"),
        str(tmp_path / "data.jsonl"),
    )
    monkeypatch.chdir(tmp_path / "run")
    config = checkpoint_config(checkpoint.latest_checkpoint(tmp_path / "run"))
    assert config.model.path == str(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    resume = (*relative, "run.resume=auto", "run.steps=2")
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *resume))
    assert s.start_step == 1 and [list(e["changed"]) for e in s.config_history] == [["run.steps"]]


def test_a_forced_change_resumes_says_it_and_keeps_it_in_the_history(
    tiny_model_dir, data_file, tmp_path, capsys
):
    own_data = tmp_path / "data.jsonl"
    shutil.copy(data_file, own_data)
    run_dir = tmp_path / "run"
    base = ("run.save_every=1", "run.steps=2")
    train(make_config(tiny_model_dir, own_data, run_dir, *base))
    moved = shutil.copytree(tiny_model_dir, tmp_path / "moved-model")
    lines = own_data.read_text().splitlines()
    own_data.write_text("\n".join(reversed(lines)) + "\n")  # rows reordered on purpose
    resume = (*base, "run.resume=auto", "run.steps=3", f"model.path={moved}")
    with pytest.raises(UserError, match=r"force it with run.force_changes=\[model.path\]"):
        setup(make_config(tiny_model_dir, own_data, run_dir, *resume))
    with pytest.raises(UserError, match=r"force it with run.force_changes=\[data.rows\]"):
        setup(
            make_config(
                tiny_model_dir, own_data, run_dir, *resume, "run.force_changes=[model.path]"
            )
        )
    with pytest.raises(UserError, match=r"^run.force_changes: 'model.dtype' cannot be forced"):
        make_config(tiny_model_dir, own_data, run_dir, "run.force_changes=[model.dtype]")
    capsys.readouterr()
    forced = "run.force_changes=[model.path,data.rows]"
    train(make_config(tiny_model_dir, own_data, run_dir, *resume, forced))
    said = capsys.readouterr().err
    assert f"model.path '{tiny_model_dir}' -> '{moved}'" in said and "data.rows" in said
    (entry,) = checkpoint.read_state(run_dir / "checkpoints" / "step-000003")["config_history"]
    assert entry["step"] == 2 and sorted(entry["changed"]) == [
        "data.rows",
        "model.path",
        "run.steps",
    ]


def test_a_file_size_limit_at_a_checkpoint_is_one_line_and_keeps_what_was_saved(
    tiny_model_dir, data_file, tmp_path
):
    run_dir = tmp_path / "run"
    args = cli_args(
        tiny_model_dir, data_file, run_dir, "run.steps=3", "run.save_every=1", "run.preflight=false"
    )
    # the weights (~90 KB) fit, the optimizer's two moments (~200 KB) do not: torch.save's
    # writer fails in C++ as it does on a full disk
    limit = 150 * 1024
    proc = subprocess.Popen(
        [sys.executable, "-m", "oncurve", "train", "--quiet", *args],
        env=rewards_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    code, err = finish(proc)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert (
        lines[0].startswith("oncurve: error: cannot save checkpoint") and "optimizer.pt" in lines[0]
    )
    assert "the previous checkpoint is kept" in lines[0]
    assert checkpoint.latest_checkpoint(run_dir) is None
    assert not [p for p in (run_dir / "checkpoints").iterdir()]  # no partial checkpoint left


def test_a_full_disk_at_the_final_model_is_one_line_and_leaves_no_partial_model(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir, "run.steps=2", "run.preflight=false")
    real_save = transformers.PreTrainedModel.save_pretrained

    def full_disk(model, directory, *a, **k):
        (Path(directory) / "config.json").write_text("{}")  # a first file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full_disk)
    assert main(["train", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert line.startswith(f"oncurve: error: cannot write the final model {run_dir / 'final'}")
    assert "No space left on device" in line and "the run's checkpoints are kept" in line
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith((".final", "final"))) == []
    assert checkpoint.latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step-000002"
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", real_save)
    assert main(["train", "--quiet", *args, "run.resume=auto"]) == 0
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_a_full_disk_while_metrics_are_appended_is_one_line_naming_the_file_and_the_kept_step(
    tiny_model_dir, data_file, tmp_path, monkeypatch, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(
        tiny_model_dir, data_file, run_dir, "run.steps=4", "run.save_every=2", "run.preflight=false"
    )
    real_open = Path.open
    appends = []

    def disk_full_at_step_3(path, mode="r", *a, **k):
        if path.name == "metrics.jsonl" and mode.startswith("a"):
            appends.append(path)
            if len(appends) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(Path, "open", disk_full_at_step_3)
    assert main(["train", "--quiet", *args]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (
        f"oncurve: error: {run_dir / 'metrics.jsonl'}: No space left on device; "
        f"step 2 is saved: resume with run.resume=auto run.dir={run_dir}"
    )
    assert checkpoint.latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step-000002"
    monkeypatch.setattr(Path, "open", real_open)
    assert main(["train", "--quiet", *args, "run.resume=auto"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


def test_unreadable_run_files_are_one_line_naming_the_file(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(
        tiny_model_dir, data_file, run_dir, "run.steps=2", "run.save_every=1", "run.preflight=false"
    )
    assert main(["train", "--quiet", *args]) == 0
    capsys.readouterr()
    latest = run_dir / "checkpoints" / "step-000002"
    faults = {
        # non-UTF-8 bytes in metrics: a resume reads them to drop later steps
        run_dir / "metrics.jsonl": (b'{"step": 1}\n\xff\xfe\n', "not UTF-8 text"),
        # a state without its step
        latest / "state.json": (b"{}", "holds no step"),
    }
    for path, (content, said) in faults.items():
        original = path.read_bytes()
        path.write_bytes(content)
        if path.name == "state.json":
            checkpoint_dir = path.parent
            sums = json.loads((checkpoint_dir / "checksums.json").read_text())
            sums["state.json"] = hashlib.sha256(content).hexdigest()
            (checkpoint_dir / "checksums.json").write_text(json.dumps(sums))
        assert main(["train", "--quiet", *args, "run.steps=3", "run.resume=auto"]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("oncurve: error: ") and str(path) in line and said in line, line
        path.write_bytes(original)
    # a truncated config.yaml: `oncurve eval --run` and `oncurve report` say so in one line
    (run_dir / "config.yaml").write_text("model:\n  path: [unclosed\n")
    assert main(["eval", "--run", str(run_dir), "--data", str(data_file)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"config file {run_dir / 'config.yaml'}" in line and "not valid YAML" in line


def test_eval_of_a_run_with_a_cut_short_final_model_says_so_and_a_resume_writes_it_again(
    tiny_model_dir, data_file, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = cli_args(tiny_model_dir, data_file, run_dir, "run.steps=2", "run.preflight=false")
    assert main(["train", "--quiet", *args]) == 0
    weights = run_dir / "final" / "model.safetensors"
    whole = weights.read_bytes()
    capsys.readouterr()
    for cut in (lambda: weights.write_bytes(whole[:100]), weights.unlink):
        cut()  # a final/ written by a version that wrote it in place, stopped mid-save
        assert main(["eval", "--run", str(run_dir), "--data", str(data_file)]) == 2
        line = capsys.readouterr().err.strip()
        assert line == (
            f"oncurve: error: --run {run_dir}: final/ is incomplete (no readable "
            "model.safetensors; its save was cut short): write it again with oncurve train "
            f"run.resume=auto run.dir={run_dir}"
        )
    assert main(["train", "--quiet", *args, "run.resume=auto"]) == 0
    assert weights.read_bytes() == whole
    capsys.readouterr()
    assert main(["eval", "--run", str(run_dir), "--data", str(data_file)]) == 0
