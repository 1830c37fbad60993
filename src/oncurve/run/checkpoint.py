"""Checkpoints that survive crashes: atomic save, exact resume, keep-last-N.

One checkpoint is a directory `run_dir/checkpoints/step-000010/` holding
  model.safetensors    the policy weights (tied weights stored once, under one of their names);
                       with `trainable_only` (LoRA) only the trainable tensors: the frozen base
                       weights are the same in every checkpoint and come from the model path
  <name>.safetensors   each extra module, e.g. `reference` (once synced) or `value` (PPO critic)
  optimizer.pt         {"optimizer": state_dict, "scheduler": state_dict | None,
                        "optimizers": {name: state_dict}}: tensors and plain data only, read back
                        with `torch.load(weights_only=True)`, so a crafted file cannot run code;
                        whole tensors also under FSDP2 (gathered to save, sharded again on load)
  rng-rank{R}.json     the python, numpy and torch CPU (+ CUDA) generator states of rank R
  state.json           the trainer's counters (step, completion tokens, world size; the data
                       position follows from the step)
  COMPLETE             written last; a directory without it is never loaded
and `run_dir/checkpoints/latest` names the newest complete one.

Save protocol: every file goes into `checkpoints/.tmp-step-000010-<pid>/` and is fsynced; the
directory is fsynced and renamed to its final name; `latest` is replaced atomically; only then
are checkpoints beyond `keep_last` removed. A process killed anywhere in between leaves `latest`
on a complete checkpoint. Leftover `.tmp-*` / `.trash-*` entries of a killed save are ignored by
`latest_checkpoint` and removed by the next save. One process saves into a run directory at a
time (rank 0 in a distributed run).

The files are written through durable_files.py, the weights by checkpoint_weights.py, the
generator states by rng_state.py.
"""

import json
import os
import pickle
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from oncurve import distributed
from oncurve.errors import CheckpointError, UserError
from oncurve.run.checkpoint_weights import (
    load_trainable,
    load_weights,
    save_weights,
    trainable_tensors,
)
from oncurve.run.durable_files import fsync, replace_file, sha256, write_file, write_text
from oncurve.run.rng_state import get_rng_state, set_rng_state

CHECKPOINTS = "checkpoints"
LATEST = "latest"
COMPLETE = "COMPLETE"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.json"
CHECKSUMS_FILE = "checksums.json"  # sha256 of each file, written before COMPLETE
_STEP_DIR = re.compile(r"step-(\d+)")
_LEFTOVER_PREFIXES = (".tmp-", ".trash-")


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: Optimizer,
    scheduler: LRScheduler | None,
    state: dict,
    *,
    keep_last: int = 2,
    modules: dict[str, nn.Module] | None = None,
    optimizers: dict[str, Optimizer] | None = None,
    trainable_only: bool = False,
) -> Path:
    """Write the checkpoint of `step` atomically and return its directory.

    `state` must be JSON-able. `modules` / `optimizers` are extra models and optimizers saved
    under their names. `trainable_only` stores only the policy's parameters that require grad
    (a LoRA adapter: megabytes instead of the base model); load with the same flag into a model
    rebuilt from the same base. Keeps the new checkpoint plus the `keep_last - 1` newest ones of earlier
    steps; later steps (an abandoned run resumed from an older checkpoint) are removed too.
    Pass an unwrapped model with whole weights (not the DDP wrapper, not FSDP2 shards; the
    optimizer's state may be sharded). In a distributed run every rank must call
    this (the RNG states of all ranks are gathered); rank 0 writes. Raises `CheckpointError`
    on an OS error, leaving the previous checkpoint intact.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    modules, optimizers = modules or {}, optimizers or {}
    if "model" in modules:
        raise ValueError("modules: the name 'model' is taken by the policy model")
    state_text = json.dumps(state)  # not JSON-able -> fail before anything touches the disk
    rank, world = distributed.world()
    rng_states = [get_rng_state()]
    if world > 1:
        local_rng, rng_states = rng_states[0], [None] * world
        dist.all_gather_object(rng_states, local_rng)
    # whole tensors, also of FSDP2's sharded state, so the file is the same for every layout
    opt_state = {
        "optimizer": distributed.whole_state(optimizer.state_dict()),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "optimizers": {
            name: distributed.whole_state(opt.state_dict()) for name, opt in optimizers.items()
        },
    }
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step-{step:06d}"
    error = None
    if rank == 0:
        try:
            policy_dump = (
                partial(save_file, trainable_tensors(model))
                if trainable_only
                else partial(save_weights, model)
            )
            dumps = {
                "model": policy_dump,
                **{n: partial(save_weights, m) for n, m in modules.items()},
            }
            _write_checkpoint(final, step, dumps, opt_state, rng_states, state_text)
        except (OSError, SafetensorError) as err:
            reason = str(err).replace("\n", " ")
            error = f"cannot save checkpoint {final}: {reason}; the previous checkpoint is kept"
    if world > 1:
        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise CheckpointError(error)
    if rank == 0:
        _prune(root, final, keep_last)
    return final


def check_saved_ranks(path: Path, state: dict, world_size: int) -> None:
    """UserError unless checkpoint `path` (its `state`) was written by `world_size` ranks: its
    optimizer shards and RNG states are one per rank."""
    saved = state.get("world_size", 1)
    if saved != world_size:
        raise UserError(
            f"checkpoint {path} was written by {saved} ranks; resume it with the same number, "
            f"not {world_size}"
        )


def resume_point(resume: str | None, run_dir: str | None) -> Path | None:
    """The checkpoint `run.resume` names (`auto`: `run_dir`'s newest complete one), None for a
    fresh run; nothing is locked or checked (`oncurve.run.rundir` does that when the run
    starts)."""
    if resume is None:
        return None
    if resume != "auto":
        return named_checkpoint(Path(resume))
    return latest_checkpoint(Path(run_dir)) if run_dir is not None else None


def named_checkpoint(path: Path) -> Path:
    """The checkpoint `path` names: `path` itself, or for a run's `checkpoints/latest` pointer
    the run's newest complete checkpoint (UserError naming the pointer when it has none)."""
    if path.name == LATEST and path.is_file() and path.parent.name == CHECKPOINTS:
        newest = latest_checkpoint(path.parent.parent)
        if newest is None:
            raise UserError(f"{path}: the run has no complete checkpoint")
        return newest
    return path


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of `run_dir`, or None when there is none.

    Follows the `latest` pointer; when it is missing or names a directory that is not complete,
    falls back to the complete `step-*` directory with the highest step.
    """
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_bytes().decode("utf-8", errors="replace").strip()
        if _STEP_DIR.fullmatch(name) and (root / name / COMPLETE).is_file():
            return root / name
    complete = _complete_checkpoints(root)
    return complete[-1] if complete else None


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: Optimizer,
    scheduler: LRScheduler | None,
    *,
    modules: dict[str, nn.Module] | None = None,
    optimizers: dict[str, Optimizer] | None = None,
    trainable_only: bool = False,
) -> dict:
    """Restore weights, optimizer, scheduler and this rank's RNG states; return `state`.

    Raises `UserError` naming the file when the checkpoint is incomplete, a file is missing or
    does not match the model/optimizer, or `optimizer.pt` holds anything but tensors and plain
    data (it is never unpickled beyond what `weights_only=True` allows).
    """
    path = Path(path)
    state = read_state(path)
    verify_checksums(path)
    if trainable_only:
        load_trainable(path / MODEL_FILE, model)
    else:
        load_weights(path / MODEL_FILE, model)
    for name, module in (modules or {}).items():
        load_weights(path / f"{name}.safetensors", module)
    opt_file = path / OPTIMIZER_FILE
    saved = _load_torch_file(opt_file)
    try:
        optimizer.load_state_dict(saved["optimizer"])
        distributed.shard_optimizer_state(optimizer)
        for name, extra in (optimizers or {}).items():
            extra.load_state_dict(saved["optimizers"][name])
            distributed.shard_optimizer_state(extra)
        if scheduler is not None:
            scheduler.load_state_dict(saved["scheduler"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        what = f"missing entry {err}" if isinstance(err, KeyError) else str(err)
        raise UserError(
            f"checkpoint file {opt_file} does not match the optimizer: {what}"
        ) from None
    rank, _ = distributed.world()
    rng_file = path / f"rng-rank{rank}.json"
    try:
        set_rng_state(_read_json(rng_file))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise UserError(
            f"checkpoint file {rng_file} is not a random generators' state ({type(err).__name__})"
        ) from None
    return state


def saved_modules(path: Path) -> set[str]:
    """The names of the extra modules checkpoint `path` holds: its `<name>.safetensors` files
    besides the policy's."""
    files = Path(path).glob("*.safetensors")
    return {file.name.removesuffix(".safetensors") for file in files if file.name != MODEL_FILE}


def read_state(path: Path) -> dict:
    """The trainer's counters of a complete checkpoint (`state.json`), without loading it;
    UserError naming the checkpoint when it is not complete, or the file when it is not a JSON
    object with the step."""
    if not (Path(path) / COMPLETE).is_file():
        raise UserError(f"checkpoint {path} is not complete (no {COMPLETE} marker); not loaded")
    verify_checksums(path, (STATE_FILE,))
    file = Path(path) / STATE_FILE
    state = _read_json(file)
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise UserError(f"checkpoint file {file} holds no step (not a state this trainer wrote)")
    return state


# -- saving ----------------------------------------------------------------------------------


def _write_checkpoint(
    final: Path,
    step: int,
    weights: dict[str, Callable[[Path], Any]],
    opt_state: dict,
    rng_states: list[dict],
    state_text: str,
) -> None:
    """Write every file into a temp dir, rename it to `final`, then point `latest` at it."""
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(root)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    trash = root / f".trash-{final.name}-{os.getpid()}"
    try:
        tmp.mkdir()
        for name, dump in weights.items():
            write_file(tmp / f"{name}.safetensors", dump)
        write_file(tmp / OPTIMIZER_FILE, partial(torch.save, opt_state))
        for rank, rng in enumerate(rng_states):
            write_file(tmp / f"rng-rank{rank}.json", partial(write_text, json.dumps(rng)))
        write_file(tmp / STATE_FILE, partial(write_text, state_text))
        sums = {f.name: sha256(f) for f in sorted(tmp.iterdir())}
        write_file(tmp / CHECKSUMS_FILE, partial(write_text, json.dumps(sums, indent=1)))
        write_file(tmp / COMPLETE, partial(write_text, f"{step}\n"))
        fsync(tmp)
        # Saving a step again (e.g. after resuming from it): a directory cannot be renamed onto
        # a non-empty one, so the old copy steps aside for the two renames.
        if final.exists():
            replace_file(final, trash)
        replace_file(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if trash.exists() and not final.exists():
            os.replace(trash, final)
        raise
    pointer_tmp = root / f".tmp-{LATEST}-{os.getpid()}"
    try:
        write_file(pointer_tmp, partial(write_text, f"{final.name}\n"))
        replace_file(pointer_tmp, root / LATEST)
    except BaseException:
        pointer_tmp.unlink(missing_ok=True)
        raise
    shutil.rmtree(trash, ignore_errors=True)


def checkpoint_step(path: Path) -> int | None:
    """The step of a `step-000010` checkpoint directory in a run's `checkpoints/`, else None."""
    found = _STEP_DIR.fullmatch(path.name)
    return int(found.group(1)) if found and path.parent.name == CHECKPOINTS else None


def later_checkpoints(run_dir: Path, step: int) -> list[Path]:
    """The complete checkpoints of `run_dir` after `step`, oldest first."""
    return [d for d in _complete_checkpoints(Path(run_dir) / CHECKPOINTS) if _step_of(d) > step]


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """The `step-*` directories of `run_dir`'s checkpoints without their COMPLETE marker, oldest
    first: never what a save leaves (it renames a whole checkpoint into place), so a copy cut
    short or a damaged run."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if _STEP_DIR.fullmatch(d.name) and d.is_dir()]
    return sorted((d for d in found if not (d / COMPLETE).is_file()), key=_step_of)


def remove_checkpoints(directories: list[Path]) -> None:
    """Delete checkpoint directories, each renamed first so that a kill mid-deletion cannot
    leave a half-deleted one; failures only warn."""
    for directory in directories:
        trash = directory.parent / f".trash-{directory.name}-{os.getpid()}"
        try:
            os.replace(directory, trash)
            shutil.rmtree(trash)
        except OSError as err:
            print(f"warning: could not remove old checkpoint {directory}: {err}", file=sys.stderr)


def _prune(root: Path, newest: Path, keep_last: int) -> None:
    """Remove complete checkpoints beyond `keep_last`, never `newest` (nor any later one: a
    resume from an older checkpoint removed those before it trained, `rundir.Replaced`)."""
    older = [d for d in _complete_checkpoints(root) if _step_of(d) < _step_of(newest)]
    remove_checkpoints(older[: max(0, len(older) - (keep_last - 1))])


def _remove_leftovers(root: Path) -> None:
    for entry in root.iterdir():
        if entry.name.startswith(_LEFTOVER_PREFIXES):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def verify_checksums(path: Path, names: Iterable[str] | None = None) -> None:
    """UserError naming the first file of checkpoint `path` (of `names`, every file when None)
    that is missing or whose bytes are not those saved (flipped bits, a truncated copy), and the
    previous complete checkpoint to resume from; a checkpoint saved without checksums passes."""
    path = Path(path)
    sums_file = path / CHECKSUMS_FILE
    if not sums_file.is_file():
        return
    sums = _read_json(sums_file)
    for name, expected in sums.items() if isinstance(sums, dict) else []:
        if names is not None and name not in names:
            continue
        file = path / name
        if file.is_file() and sha256(file) == expected:
            continue
        step = _step_of(path) if _STEP_DIR.fullmatch(path.name) else 0
        earlier = [d for d in _complete_checkpoints(path.parent) if _step_of(d) < step]
        where = (
            f"resume from the previous complete one: run.resume={earlier[-1]} "
            "run.overwrite=true (which deletes this one)"
            if earlier
            else "no earlier complete checkpoint is kept"
        )
        what = "is damaged (its checksum differs)" if file.is_file() else "is missing"
        raise UserError(f"checkpoint file {file} {what}; {where}")


# -- loading ---------------------------------------------------------------------------------


def _load_torch_file(file: Path) -> dict:
    if not file.is_file():
        raise UserError(f"checkpoint file {file} is missing")
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(
            f"checkpoint file {file} holds objects other than tensors and plain data; "
            "refused to load it (it could run code)"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        reason = " ".join(str(err).split())
        raise UserError(f"checkpoint file {file} is not a readable torch file: {reason}") from None
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint file {file} must hold a dict, got {type(saved).__name__}")
    return saved


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"checkpoint file {file} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"checkpoint file {file} is not valid JSON: {err}") from None


# -- helpers ---------------------------------------------------------------------------------


def _complete_checkpoints(root: Path) -> list[Path]:
    """The complete `step-*` directories of `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if _STEP_DIR.fullmatch(d.name) and (d / COMPLETE).is_file()]
    return sorted(found, key=_step_of)


def _step_of(directory: Path) -> int:
    return int(_STEP_DIR.fullmatch(directory.name).group(1))
