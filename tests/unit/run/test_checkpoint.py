"""Checkpoints: bit-exact round trip, atomic saves under SIGKILL and OS errors, safe loading."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.paths import TESTS
from helpers.tied_lm import make_setup, train
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from oncurve.errors import UserError
from oncurve.run import checkpoint
from oncurve.run.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    read_state,
    save_checkpoint,
)
from oncurve.run.checkpoint_weights import load_weights, save_weights
from oncurve.run.rng_state import get_rng_state, set_rng_state


def draw() -> list:
    return [
        random.random(),
        random.gauss(0, 1),
        np.random.rand(2).tolist(),
        float(np.random.randn()),
        torch.rand(3).tolist(),
    ]


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def saved_run(tmp_path: Path, steps: tuple[int, ...] = (1,), keep_last: int = 2) -> Path:
    model, optimizer, scheduler = make_setup(0)
    for step in steps:
        train(model, optimizer, scheduler, 1)
        save_checkpoint(
            tmp_path, step, model, optimizer, scheduler, {"step": step}, keep_last=keep_last
        )
    return tmp_path


def step_dirs(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_setup(0)
    value = nn.Linear(4, 1)
    value_opt = torch.optim.SGD(value.parameters(), lr=0.1, momentum=0.9)
    train(model, optimizer, scheduler, 3)
    value(torch.randn(2, 4)).sum().backward()
    value_opt.step()
    random.gauss(0, 1)  # leaves a cached gaussian in the python and numpy states
    np.random.randn()
    state = {"step": 3, "data_position": [2, 17], "tokens": 1234, "world_size": 1}
    extra = {"modules": {"value": value}, "optimizers": {"value": value_opt}}
    path = save_checkpoint(tmp_path, 3, model, optimizer, scheduler, state, **extra)
    at_save = draw()

    model2, optimizer2, scheduler2 = make_setup(1)
    value2 = nn.Linear(4, 1)
    value_opt2 = torch.optim.SGD(value2.parameters(), lr=0.1, momentum=0.9)
    train(model2, optimizer2, scheduler2, 1)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    extra2 = {"modules": {"value": value2}, "optimizers": {"value": value_opt2}}
    loaded = load_checkpoint(path, model2, optimizer2, scheduler2, **extra2)

    assert loaded == state
    assert draw() == at_save
    assert model2.head.weight is model2.embed.weight
    assert_same_tensors(model.state_dict(), model2.state_dict())
    assert_same_tensors(value.state_dict(), value2.state_dict())
    assert_same_tensors(optimizer.state_dict(), optimizer2.state_dict())
    assert_same_tensors(value_opt.state_dict(), value_opt2.state_dict())
    assert scheduler2.state_dict() == scheduler.state_dict()
    # Continuing both on the same data gives the same weights: moments and LR schedule match.
    data_rng = torch.get_rng_state()
    train(model, optimizer, scheduler, 2)
    torch.set_rng_state(data_rng)
    train(model2, optimizer2, scheduler2, 2)
    assert_same_tensors(model.state_dict(), model2.state_dict())
    with safe_open(path / "model.safetensors", "pt") as f:  # the tied weight is stored once
        assert sorted(f.keys()) == ["embed.weight", "mid.bias", "mid.weight"]


def test_projections_laid_out_in_one_storage_round_trip_and_stay_so(tmp_path: Path) -> None:
    """The `cuda_graph` sampler's layout (parameters that are views into one tensor, which
    safetensors' `save_model` refuses to store) saves, and loads in place, keeping it."""
    from helpers.models import make_model

    from oncurve.rollout.cuda_graph import lay_out_projections

    def laid_out(seed: int):
        torch.manual_seed(seed)
        model = make_model("qwen2")
        with torch.no_grad():
            for param in model.parameters():
                param.normal_()
        assert lay_out_projections(model) == 4
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    model, optimizer = laid_out(0)
    path = save_checkpoint(tmp_path, 1, model, optimizer, None, {"step": 1})
    model2, optimizer2 = laid_out(1)
    load_checkpoint(path, model2, optimizer2, None)
    assert_same_tensors(model.state_dict(), model2.state_dict())
    attention = model2.model.layers[0].self_attn
    assert attention.k_proj.weight.data_ptr() == (
        attention.q_proj.weight.data_ptr() + attention.q_proj.weight.nbytes
    )


def reseal(path: Path) -> None:
    """Give checkpoint `path` the checksums of its files as they are now (a checkpoint written
    by another tool, or crafted, that is consistent with itself)."""
    names = [f for f in sorted(path.iterdir()) if f.name not in ("checksums.json", "COMPLETE")]
    sums = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in names}
    (path / "checksums.json").write_text(json.dumps(sums))


def test_a_damaged_file_is_refused_naming_the_previous_complete_checkpoint(tmp_path: Path) -> None:
    run = saved_run(tmp_path)
    model, optimizer, scheduler = make_setup(0)
    save_checkpoint(run, 2, model, optimizer, scheduler, {"step": 2})
    newest = run / "checkpoints/step-000002"
    for name in ("model.safetensors", "optimizer.pt", "state.json"):
        original = (newest / name).read_bytes()
        damaged = bytearray(original)
        damaged[len(damaged) // 2] ^= 0x10  # one flipped bit
        (newest / name).write_bytes(bytes(damaged))
        with pytest.raises(UserError) as info:
            load_checkpoint(newest, *make_setup(1))
        assert str(info.value) == (
            f"checkpoint file {newest / name} is damaged (its checksum differs); resume from "
            f"the previous complete one: run.resume={run / 'checkpoints/step-000001'} "
            "run.overwrite=true (which deletes this one)"
        )
        (newest / name).write_bytes(original)
    load_checkpoint(newest, *make_setup(1))  # whole again, it loads
    (run / "checkpoints/step-000001/optimizer.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(UserError, match=r"step-000001/optimizer.pt is damaged .* no earlier"):
        load_checkpoint(run / "checkpoints/step-000001", *make_setup(1))


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng-rank0.json"])
def test_a_file_gone_from_a_complete_checkpoint_is_named_missing(tmp_path: Path, name) -> None:
    """A file the checksums list that is not there (a copy that skipped it) is called missing,
    not damaged, with the previous complete checkpoint to resume from."""
    run = saved_run(tmp_path, steps=(1, 2))
    newest = run / "checkpoints/step-000002"
    (newest / name).unlink()
    with pytest.raises(UserError) as info:
        load_checkpoint(newest, *make_setup(1))
    assert str(info.value) == (
        f"checkpoint file {newest / name} is missing; resume from the previous complete one: "
        f"run.resume={run / 'checkpoints/step-000001'} run.overwrite=true (which deletes this one)"
    )


@pytest.mark.parametrize("saved", ["{}", '{"python": 3}', "[1, 2]"])
def test_a_malformed_generator_state_is_one_line_naming_its_file(tmp_path: Path, saved) -> None:
    """A checkpoint without checksums (an older one) whose RNG file was edited."""
    run = saved_run(tmp_path)
    path = run / "checkpoints/step-000001"
    (path / "checksums.json").unlink()
    (path / "rng-rank0.json").write_text(saved)
    with pytest.raises(UserError, match=r"^checkpoint file .*rng-rank0.json is not a random "):
        load_checkpoint(path, *make_setup(1))


def test_a_tied_weight_stored_under_its_other_name_loads(tmp_path: Path) -> None:
    """safetensors' `save_model`, which wrote earlier checkpoints, may keep either name."""
    path = saved_run(tmp_path) / "checkpoints/step-000001"
    model, _, _ = make_setup(0)
    state = {k: v for k, v in model.state_dict().items() if k != "embed.weight"}
    save_file(state, path / "model.safetensors")
    reseal(path)
    loaded, optimizer, scheduler = make_setup(1)
    load_checkpoint(path, loaded, optimizer, scheduler)
    assert loaded.head.weight is loaded.embed.weight
    assert_same_tensors(model.state_dict(), loaded.state_dict())


@pytest.mark.parametrize("keep_last", [1, 2, 3, 4, 6])
def test_keep_last_keeps_the_newest_n_while_fewer_exist(tmp_path: Path, keep_last: int) -> None:
    model, optimizer, _ = make_setup(0)
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, model, optimizer, None, {"step": step}, keep_last=keep_last)
        kept = range(max(1, step - keep_last + 1), step + 1)
        assert step_dirs(tmp_path) == ["latest", *(f"step-{k:06d}" for k in kept)], step


def test_latest_pointer_and_keep_last(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_setup(0)
    save_checkpoint(tmp_path, 1, model, optimizer, None, {"step": 1})
    save_checkpoint(tmp_path, 2, model, optimizer, None, {"step": 2})
    seen = []
    original = checkpoint.write_file

    def watching(path, dump):
        seen.append((path.name, (tmp_path / "checkpoints/step-000001").is_dir()))
        original(path, dump)

    checkpoint.write_file = watching
    try:
        save_checkpoint(tmp_path, 3, model, optimizer, None, {"step": 3}, keep_last=2)
    finally:
        checkpoint.write_file = original
    # step 1 survived every write of step 3, including the `latest` pointer, and went after.
    assert [name for name, _ in seen][-2:] == ["COMPLETE", f".tmp-latest-{os.getpid()}"]
    assert all(exists for _, exists in seen)
    assert step_dirs(tmp_path) == ["latest", "step-000002", "step-000003"]
    assert (tmp_path / "checkpoints/latest").read_text() == "step-000003\n"
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints/step-000003"


def test_latest_falls_back_to_newest_complete_and_ignores_partial(tmp_path: Path) -> None:
    saved_run(tmp_path, (1, 2, 3), keep_last=3)
    root = tmp_path / "checkpoints"
    (root / "step-000003/COMPLETE").unlink()  # as if a user copied a half checkpoint
    (root / ".tmp-step-000009-4242").mkdir()
    (root / ".tmp-step-000009-4242/COMPLETE").write_text("9\n")
    assert latest_checkpoint(tmp_path) == root / "step-000002"  # pointer names an incomplete one
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step-000002"
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_stale_temp_dirs_are_removed_by_next_save(tmp_path: Path) -> None:
    saved_run(tmp_path, (1,))
    root = tmp_path / "checkpoints"
    (root / ".tmp-step-000002-99999").mkdir()
    (root / ".tmp-step-000002-99999/model.safetensors").write_bytes(b"partial")
    (root / ".tmp-latest-99999").write_text("step-000002\n")
    assert latest_checkpoint(tmp_path) == root / "step-000001"
    saved_run(tmp_path, (2,))
    assert step_dirs(tmp_path) == ["latest", "step-000001", "step-000002"]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    saved_run(tmp_path, (1, 2), keep_last=1)
    model, optimizer, _ = make_setup(3)
    save_checkpoint(tmp_path, 2, model, optimizer, None, {"step": 2, "again": True}, keep_last=1)
    assert step_dirs(tmp_path) == ["latest", "step-000002"]
    state = json.loads((tmp_path / "checkpoints/step-000002/state.json").read_text())
    assert state == {"step": 2, "again": True}


def test_a_save_never_deletes_a_later_checkpoint(tmp_path: Path) -> None:
    saved_run(tmp_path, (1, 2, 3), keep_last=3)
    model, optimizer, _ = make_setup(0)
    save_checkpoint(tmp_path, 2, model, optimizer, None, {"step": 2}, keep_last=1)
    assert step_dirs(tmp_path) == ["latest", "step-000002", "step-000003"]


@pytest.mark.parametrize("failing", ["model.safetensors", "optimizer.pt", "COMPLETE", "latest"])
def test_disk_full_keeps_previous_checkpoint(tmp_path: Path, monkeypatch, failing: str) -> None:
    saved_run(tmp_path, (1,), keep_last=1)
    original = checkpoint.write_file

    def disk_full(path: Path, dump) -> None:
        if path.name == failing or path.name.startswith(f".tmp-{failing}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        original(path, dump)

    monkeypatch.setattr(checkpoint, "write_file", disk_full)
    model, optimizer, scheduler = make_setup(1)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, 2, model, optimizer, scheduler, {"step": 2}, keep_last=1)
    message = str(info.value)
    assert "\n" not in message
    assert "No space left on device" in message
    assert str(tmp_path / "checkpoints/step-000002") in message
    root = tmp_path / "checkpoints"
    assert latest_checkpoint(tmp_path) == root / "step-000001"
    assert (root / "latest").read_text() == "step-000001\n"
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    model, optimizer, scheduler = make_setup(1)
    assert load_checkpoint(root / "step-000001", model, optimizer, scheduler) == {"step": 1}


def test_unwritable_run_dir_raises_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    model, optimizer, _ = make_setup(0)
    with pytest.raises(
        CheckpointError, match=r"cannot save checkpoint .*step-000001: .*File exists"
    ):
        save_checkpoint(tmp_path, 1, model, optimizer, None, {"step": 1})


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_checkpoints_dir_keeps_previous(tmp_path: Path) -> None:
    saved_run(tmp_path, (1,), keep_last=1)
    root = tmp_path / "checkpoints"
    root.chmod(0o555)
    try:
        model, optimizer, _ = make_setup(0)
        with pytest.raises(CheckpointError, match="Permission denied"):
            save_checkpoint(tmp_path, 2, model, optimizer, None, {"step": 2}, keep_last=1)
    finally:
        root.chmod(0o755)
    assert step_dirs(tmp_path) == ["latest", "step-000001"]


# Saves step 2 over a copy of a run holding step 1 (keep_last=1), in a forked child that SIGKILLs
# itself right after its k-th file write or rename, for k = 1, 2, ... until a save completes.
KILL_SCRIPT = r"""
import json, os, shutil, signal, sys
from pathlib import Path
import torch
torch.set_num_threads(1)  # no thread pool exists when forking
sys.path.insert(0, sys.argv[1])
from helpers.tied_lm import make_setup, train
from oncurve.run import checkpoint
work = Path(sys.argv[2])
model, optimizer, scheduler = make_setup(0)
train(model, optimizer, scheduler, 1)
checkpoint.save_checkpoint(work / "base", 1, model, optimizer, scheduler, {"step": 1}, keep_last=1)
train(model, optimizer, scheduler, 1)
events, kill_at = [], 0
def hooked(kind, original):
    def run(*args):
        original(*args)
        events.append([kind, args[-1 if kind == "replace" else 0].name])
        if len(events) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return run
checkpoint.write_file = hooked("write", checkpoint.write_file)
checkpoint.replace_file = hooked("replace", checkpoint.replace_file)
outcomes = []
for kill_at in range(1, 30):
    run_dir = work / f"run-{kill_at}"
    shutil.copytree(work / "base", run_dir)
    pid = os.fork()
    if pid == 0:
        try:
            checkpoint.save_checkpoint(run_dir, 2, model, optimizer, scheduler, {"step": 2}, keep_last=1)
            (work / "events.json").write_text(json.dumps(events))
        finally:
            os._exit(0)
    status = os.waitpid(pid, 0)[1]
    outcomes.append(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status))
    if not os.WIFSIGNALED(status):
        break
(work / "outcomes.json").write_text(json.dumps(outcomes))
"""


def test_sigkill_at_every_write_leaves_latest_on_a_complete_checkpoint(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(TESTS), str(tmp_path)], check=True, timeout=120
    )
    events = json.loads((tmp_path / "events.json").read_text())
    outcomes = json.loads((tmp_path / "outcomes.json").read_text())
    names = [name.split("-")[0] if name.startswith(".tmp-") else name for _, name in events]
    assert names == [
        "model.safetensors",
        "optimizer.pt",
        "rng-rank0.json",
        "state.json",
        "checksums.json",
        "COMPLETE",
        "step-000002",
        ".tmp",
        "latest",
    ]
    assert outcomes == [signal.SIGKILL] * len(events) + [0]
    for kill_at in range(1, len(events) + 2):
        run = tmp_path / f"run-{kill_at}"
        expected = 2 if kill_at >= len(events) else 1  # once the `latest` rename has happened
        found = latest_checkpoint(run)
        assert found == run / f"checkpoints/step-{expected:06d}", kill_at
        assert (run / "checkpoints/latest").read_text() == f"step-{expected:06d}\n"
        model, optimizer, scheduler = make_setup(1)
        assert load_checkpoint(found, model, optimizer, scheduler) == {"step": expected}
        # The next save cleans whatever the killed one left behind.
        save_checkpoint(run, 3, model, optimizer, scheduler, {"step": 3}, keep_last=1)
        assert step_dirs(run) == ["latest", "step-000003"], kill_at


def test_incomplete_checkpoint_is_refused(tmp_path: Path) -> None:
    path = saved_run(tmp_path) / "checkpoints/step-000001"
    (path / "COMPLETE").unlink()
    model, optimizer, scheduler = make_setup(0)
    with pytest.raises(UserError, match=r"step-000001 is not complete \(no COMPLETE marker\)"):
        load_checkpoint(path, model, optimizer, scheduler)
    with pytest.raises(UserError, match=r"step-000001 is not complete \(no COMPLETE marker\)"):
        read_state(path)


def test_mismatched_model_is_refused_with_file_name(tmp_path: Path) -> None:
    path = saved_run(tmp_path) / "checkpoints/step-000001"
    other = nn.Linear(4, 4)
    with pytest.raises(UserError, match=r"model\.safetensors does not match the model"):
        load_checkpoint(path, other, torch.optim.SGD(other.parameters(), lr=0.1), None)


def test_a_model_of_other_names_is_refused_naming_a_few_and_counting_the_rest(
    tmp_path: Path,
) -> None:
    """A checkpoint of another architecture (a forced model.path) differs in every name: the
    line names the first few of each side and counts them, not hundreds of names."""
    file = tmp_path / "model.safetensors"
    save_weights(nn.Sequential(*(nn.Linear(2, 2) for _ in range(60))), str(file))
    other = nn.ModuleDict({f"layer{i}": nn.Linear(2, 2) for i in range(50)})
    with pytest.raises(UserError) as info:
        load_weights(file, other)
    line = str(info.value)
    assert line.startswith(f"checkpoint file {file} does not match the model: ")
    assert "100 missing (layer0.weight, layer0.bias, layer1.weight, ...)" in line
    assert "120 unexpected (0.bias, 0.weight, 1.bias, ...)" in line
    assert len(line) < 300


class Payload:
    """Unpickling this runs code that creates a file."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (exec, (f"open({str(self.sentinel)!r}, 'w').close()",))


@pytest.mark.parametrize("fmt", ["torch-zip", "raw-pickle"])
def test_pickle_payload_in_optimizer_file_is_refused(tmp_path: Path, fmt: str) -> None:
    path = saved_run(tmp_path / "run") / "checkpoints/step-000001"
    proof, sentinel = tmp_path / "payload-works", tmp_path / "payload-ran"

    def write(target: Path, sentinel_path: Path) -> None:
        crafted = {"optimizer": Payload(sentinel_path), "scheduler": None, "optimizers": {}}
        if fmt == "torch-zip":
            torch.save(crafted, target)
        else:
            target.write_bytes(pickle.dumps(crafted, protocol=2))

    write(tmp_path / "proof.pt", proof)  # the payload does run when unpickled unsafely
    if fmt == "torch-zip":
        torch.load(tmp_path / "proof.pt", weights_only=False)
    else:
        pickle.loads((tmp_path / "proof.pt").read_bytes())
    assert proof.exists()
    write(path / "optimizer.pt", sentinel)
    reseal(path)  # a crafted checkpoint comes with its own checksums
    model, optimizer, scheduler = make_setup(0)
    with pytest.raises(UserError, match=r"optimizer\.pt holds objects other than tensors") as info:
        load_checkpoint(path, model, optimizer, scheduler)
    assert "\n" not in str(info.value)
    assert not sentinel.exists()


# Two gloo ranks with different RNG streams save one checkpoint; each restores its own stream.
# Then rank 0 hits a full disk and both ranks raise the same CheckpointError.
def _rng_rank(rank: int, world_size: int, work: Path) -> dict:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model, optimizer, scheduler = make_setup(0)
    torch.manual_seed(100 + rank)
    path = checkpoint.save_checkpoint(work / "run", 1, model, optimizer, scheduler, {"step": 1})
    expected = torch.rand(4).tolist()
    torch.manual_seed(7)
    checkpoint.load_checkpoint(path, model, optimizer, scheduler)
    got = torch.rand(4).tolist()
    real_write = checkpoint.write_file
    if rank == 0:

        def disk_full(path, dump):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        checkpoint.write_file = disk_full
    try:
        checkpoint.save_checkpoint(work / "run", 2, model, optimizer, scheduler, {"step": 2})
        error = None
    except checkpoint.CheckpointError as err:
        error = str(err)
    finally:
        checkpoint.write_file = real_write  # the rank runs other tests' jobs next
    return {"expected": expected, "got": got, "error": error}


def test_distributed_ranks_save_and_restore_their_own_rng(tmp_path: Path, two_ranks) -> None:
    results = two_ranks.run(_rng_rank, tmp_path)
    for result in results:
        assert result["got"] == result["expected"]
        assert "No space left on device" in result["error"]
    assert results[0]["expected"] != results[1]["expected"]
    assert results[0]["error"] == results[1]["error"]
    files = sorted(p.name for p in (tmp_path / "run/checkpoints/step-000001").iterdir())
    assert files == [
        "COMPLETE",
        "checksums.json",
        "model.safetensors",
        "optimizer.pt",
        "rng-rank0.json",
        "rng-rank1.json",
        "state.json",
    ]
    assert latest_checkpoint(tmp_path / "run") == tmp_path / "run/checkpoints/step-000001"


def test_a_resume_seeing_fewer_cuda_devices_restores_the_states_of_those_it_sees(monkeypatch):
    """A checkpoint holds the CUDA generators of every device its process saw; a resume where
    fewer are visible (another node, CUDA_VISIBLE_DEVICES) restores the devices that exist,
    those a rank can use, and skips the rest."""
    saved = [torch.full((16,), device, dtype=torch.uint8) for device in range(4)]
    state = {**get_rng_state(), "cuda": [s.tolist() for s in saved]}
    restored: dict[int, list[int]] = {}

    def set_state(new_state: torch.Tensor, device: int | str = "cuda") -> None:
        index = torch.device(device).index if not isinstance(device, int) else device
        if index >= 2:
            raise IndexError(f"device {index} of 2")
        restored[index] = new_state.tolist()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_state)
    set_rng_state(state)
    assert restored == {0: saved[0].tolist(), 1: saved[1].tolist()}
