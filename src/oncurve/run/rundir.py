"""The run directory: which one a run writes to, whether it resumes, and what it may delete.

One trainer per run directory: rank 0 holds an exclusive lock on its `.lock` file (`flock`, which
the OS releases when the process ends, however it ends) from before it reads or deletes anything
there until the process exits; a second trainer on the directory is refused in one line naming
the holder. A run never deletes a file it did not write: `run.overwrite` replaces only a
previous run's files (`RUN_FILES`), and `run.resume=auto` on a directory without a checkpoint
restarts only when nothing foreign is there, nor (without `run.overwrite`) a checkpoint that
lacks its COMPLETE marker, which a save never leaves. `run.resume=PATH` writes into PATH's own
run (a `step-NNNNNN` directory in its `checkpoints/`; its later checkpoints, and a final model
written after them, deleted only with `run.overwrite`), or into an empty directory, never into
another run's.
A run refused at start-up removes the directory it created while that holds no file but the
lock (`removed_if_not_started`), so that it does not pass for a run.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TextIO

import torch
import yaml

from oncurve import distributed
from oncurve.config import Config
from oncurve.errors import UserError
from oncurve.model.saving import SAVED_FILES, recover_interrupted_save
from oncurve.run import checkpoint

LOCK_FILE = ".lock"
# What a killed rewrite of metrics, samples (`metrics.truncate_after`) or config.yaml, or a killed
# write of the final model (`saving.save_final`) leaves: the run's own.
_LEFTOVER = re.compile(
    r"\.(?:metrics\.jsonl|samples\.jsonl|config\.yaml)\..+\.tmp$|\.final\.(?:partial|trash)-\d+$"
)
# What a run writes inside its folders (checkpoints, final model, TensorBoard events, W&B's
# offline runs, `oncurve report`'s page): `run.overwrite` deletes nothing else there.
_RUN_WRITTEN = {
    "checkpoints": re.compile(
        r"(?:step-\d{6,}|latest|\.(?:tmp|trash)-.+)"
        r"(?:/(?:[\w.-]+\.safetensors|[\w.-]+\.pt|state\.json|checksums\.json"
        r"|rng-rank\d+\.json|COMPLETE))?"
    ),
    "final": SAVED_FILES,
    "tensorboard": re.compile(r"events\.out\.tfevents\.[^/]+"),
    "wandb": re.compile(
        r"(?:(?:offline-)?run-[\w.-]+|latest-run)(?:/.+)?"
        r"|debug(?:-internal|-core|-cli\.[\w.-]+)?\.log"
    ),
    "report": re.compile(r"[\w.-]+\.png|report\.html"),
}
# Sections every config.yaml a run writes holds, older versions' too (`config_yaml`: the whole
# settled config)
_CONFIG_SECTIONS = {"model", "data", "run"}
# What a run (and `oncurve report` on it) writes: the only names a new run may delete.
RUN_FILES = {
    LOCK_FILE,
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "checkpoints",
    "tensorboard",
    "wandb",
    "final",
    "report",
}
# The folders among them (the others are files).
_RUN_FOLDERS = set(_RUN_WRITTEN)


@dataclass
class Replaced:
    """What the new run replaces, deleted only once the rest of its setup has passed (a run
    refused later, a typo in a setting or a resume's changed seed, leaves them): a previous
    run's entries (`run.overwrite`), or a resumed run's checkpoints after the one it resumes."""

    entries: list[Path] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    # What the entries (and an entry directory's own entries, one level in) were when the run
    # claimed the directory: what appears there later is the new run's (a tracker's files:
    # trackers start before anything is deleted, so that one that cannot start deletes nothing).
    claimed: dict[Path, tuple[int, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        for path in self.entries:
            inner = list(path.iterdir()) if path.is_dir() else []
            for found in (path, *inner):
                self.claimed[found] = _identity(found)

    def remove(self) -> None:
        checkpoint.remove_checkpoints(self.checkpoints)
        for path in self.entries:  # the lock stays: it is this trainer's
            if path.is_dir():  # a folder linked to another disk stays linked, emptied
                for inner in list(path.iterdir()):
                    if self.claimed.get(inner) == _identity(inner):
                        _delete(inner)
                if not path.is_symlink() and not any(path.iterdir()):
                    path.rmdir()
            elif self.claimed.get(path) == _identity(path):
                _delete(path)
        self.entries, self.checkpoints, self.claimed = [], [], {}


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file `path` is (inode and change time: a file put in the place of one deleted may
    reuse its inode), None when there is none."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_ctime_ns


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def prepare_run_dir(config: Config, rank: int) -> tuple[Path, Path | None, Replaced]:
    """The run directory, the checkpoint to resume from and what the run replaces there (for
    the caller to `remove` once the run is set up). Rank 0 checks and creates it; the other
    ranks wait for that (a barrier) and then only read."""
    run_dir, resume_from, replaced = (
        claim_run_dir(config) if rank == 0 else (None, None, Replaced())
    )
    if distributed.world()[1] > 1:
        shared = [str(run_dir), str(resume_from) if resume_from else ""]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir, resume_from = Path(shared[0]), Path(shared[1]) if shared[1] else None
    return run_dir, resume_from, replaced


def claim_run_dir(config: Config) -> tuple[Path, Path | None, Replaced]:
    """Rank 0's side of `prepare_run_dir`: lock the run directory (creating it), then check
    `run.dir`, `run.resume` and `run.overwrite`; what a previous run left that this one
    replaces comes back, not deleted yet."""
    resume = config.run.resume
    if resume not in (None, "auto"):
        path = checkpoint.named_checkpoint(Path(resume))
        if not (path / "COMPLETE").is_file():
            raise UserError(f"run.resume {resume} is not a complete checkpoint directory")
        own, step = _checkpoint_run(path)
        if step is None and config.run.dir is None:
            raise UserError(
                f"run.resume {resume} is not a step-NNNNNN directory in a run's checkpoints/, so "
                "it names no run to continue; pass run.dir (that run, or an empty directory)"
            )
        run_dir = Path(config.run.dir) if config.run.dir else own
        with _locked(run_dir) as contents:
            same = run_dir.resolve() == own
            if contents and own is None:
                raise UserError(
                    f"run.resume {resume} is a checkpoint outside a run's checkpoints/, and "
                    f"run.dir {run_dir} is not empty; resume it into an empty run.dir"
                )
            if contents and not same:
                raise UserError(
                    f"run.resume {resume} is a checkpoint of the run in {own}, and run.dir "
                    f"{run_dir} holds another run; resume into {own} or into an empty run.dir"
                )
            later = checkpoint.later_checkpoints(own, step) if same else []
            if same:
                _refuse_foreign_final(run_dir, deleted=bool(later))
            if later and not config.run.overwrite:
                names = ", ".join(d.name for d in later[:3]) + (", ..." if len(later) > 3 else "")
                raise UserError(
                    f"run.resume {resume} is older than the run's newest checkpoints ({names}); "
                    "pass run.overwrite=true to continue from it and delete them, or resume "
                    "into an empty run.dir"
                )
        # the final model is of the later steps' run: it goes with them
        final = [run_dir / "final"] if later and (run_dir / "final").exists() else []
        return run_dir, path, Replaced(entries=final, checkpoints=later)
    if config.run.dir is None:
        if resume == "auto":
            raise UserError("run.resume=auto needs run.dir (the run to continue)")
        run_dir = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    else:
        run_dir = Path(config.run.dir)
    with _locked(run_dir) as contents:
        if resume == "auto":
            found = checkpoint.latest_checkpoint(run_dir)
            if found is not None:
                _refuse_foreign_final(run_dir, deleted=False)
                if config.run.overwrite:  # the two ask for opposite things: say which is done
                    print(
                        f"note: run.resume=auto continues {run_dir} from {found.name}; "
                        "run.overwrite=true starts a run over only where it has no checkpoint",
                        file=sys.stderr,
                    )
                return run_dir, found, Replaced()
            incomplete = checkpoint.incomplete_checkpoints(run_dir)
            if incomplete and not config.run.overwrite:
                raise UserError(
                    f"run.dir {run_dir} has no complete checkpoint to resume: "
                    f"{incomplete[-1].relative_to(run_dir)} lacks the {checkpoint.COMPLETE} "
                    "marker a save writes last (a copy cut short?); restore it, or pass "
                    "run.overwrite=true to start over"
                )
        if contents:
            # Neither resume=auto (restarting a run killed before its first checkpoint) nor
            # run.overwrite deletes files that no run wrote: run.dir may point at the wrong one.
            foreign = sorted(p.name for p in contents if not _run_entry(p))
            foreign += [str(p.relative_to(run_dir)) for p in _foreign_inside(run_dir)][:3]
            if foreign:
                raise UserError(
                    f"run.dir {run_dir} "
                    + ("is not empty, has no checkpoint and " if resume == "auto" else "")
                    + f"holds files no run wrote ({', '.join(foreign[:3])}); "
                    + (
                        "run.overwrite only replaces a previous run"
                        if config.run.overwrite
                        else "run.resume=auto only continues or restarts a run"
                        if resume == "auto"
                        else "neither run.resume=auto nor run.overwrite=true takes it"
                    )
                    + ", pick another run.dir"
                )
            if not (config.run.overwrite or resume == "auto"):
                raise UserError(
                    f"run.dir {run_dir} is not empty; pass run.resume=auto to continue it or "
                    "run.overwrite=true to start over"
                )
    if resume == "auto":
        print(f"note: no checkpoint in {run_dir}; starting a new run", file=sys.stderr)
    return run_dir, None, Replaced(entries=contents)


def _checkpoint_run(path: Path) -> tuple[Path | None, int | None]:
    """The run (resolved) a checkpoint directory belongs to and its step: a `step-NNNNNN`
    directory in a run's checkpoints/, as named (a `checkpoints` linked to another disk is
    still the run's) or where a link to it points; (None, None) for any other (two levels up
    from a copy is a folder of the user's, not a run)."""
    for candidate in (Path(os.path.abspath(path)), path.resolve()):
        step = checkpoint.checkpoint_step(candidate)
        if step is not None:
            return candidate.parent.parent.resolve(), step
    return None, None


def _run_entry(path: Path) -> bool:
    """Whether `path`, an entry of a run directory, is what a run writes there: one of its
    names, of the kind a run writes under it (a user's file named `final` is no final model),
    and a config.yaml as a run writes it."""
    if _LEFTOVER.match(path.name):
        return True
    if path.name not in RUN_FILES:
        return False
    if path.name == "config.yaml":
        return _run_config(path)
    return path.is_dir() == (path.name in _RUN_FOLDERS)


def _refuse_foreign_final(run_dir: Path, deleted: bool) -> None:
    """UserError when the run's final/ is a file (a resumed run writes its final model there
    when it ends), or holds files no run wrote where the resume deletes final/ (`deleted`);
    otherwise the final model a resumed run writes keeps them (`saving.save_final`)."""
    final = run_dir / "final"
    if final.exists() and not final.is_dir():
        raise UserError(
            f"{final} is a file no run wrote, and the resumed run writes its final model "
            "there when it ends: move it out first"
        )
    if not deleted:
        return
    foreign = [
        p.relative_to(final).as_posix() for p in _foreign_inside(run_dir) if final in p.parents
    ]
    if foreign:
        raise UserError(
            f"{final} holds files no run wrote ({', '.join(foreign[:3])}), and resuming from an "
            "older checkpoint deletes final/: move them out first"
        )


def _run_config(path: Path) -> bool:
    """Whether `path` is a config.yaml as a run writes it (every section, as `save_config`
    dumps it), not a config of the user's kept in the directory (its comments and layout would
    be lost to the run's)."""
    try:
        text = path.read_text()
        loaded = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return (
        isinstance(loaded, dict)
        and _CONFIG_SECTIONS.issubset(loaded)
        and text == yaml.safe_dump(loaded, sort_keys=False)
    )


def _foreign_inside(run_dir: Path) -> list[Path]:
    """Files in the run's folders (`_RUN_WRITTEN`) that no run writes (a user's notes kept
    there), which `run.overwrite` must not delete."""
    found = []
    for name, written in _RUN_WRITTEN.items():
        top = run_dir / name
        if not top.is_dir():
            continue
        for path in sorted(top.rglob("*")):
            relative = path.relative_to(top).as_posix()
            if (path.is_file() or path.is_symlink()) and not written.fullmatch(relative):
                found.append(path)
    return found


def clean_leftovers(run_dir: Path) -> None:
    """Remove what a killed rewrite of metrics or samples, or a killed write of the final model,
    left in `run_dir` (the lock held, no other trainer can be writing them); a final model the
    killed write had moved aside is put back (`saving.recover_interrupted_save`)."""
    recover_interrupted_save(run_dir / "final")
    for path in run_dir.iterdir():
        if not _LEFTOVER.match(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# The lock files this process holds, by directory: open until `run_dirs_unlocked_after` or the
# process's end, when the OS releases their locks. A later run of the same process on the same
# directory reuses its lock.
_HELD: dict[str, TextIO] = {}
# The held run directories this process created, by directory: the folders `mkdir` made for
# it, the run directory first, each absolute.
_CREATED: dict[str, list[Path]] = {}


@contextlib.contextmanager
def run_dirs_unlocked_after() -> Iterator[None]:
    """The run directories locked within stay locked until it ends, then are unlocked (`train`
    has returned: another process may resume or overwrite the run); one this process held
    before stays locked."""
    before = set(_HELD)
    try:
        yield
    finally:
        for key in set(_HELD) - before:
            _HELD.pop(key).close()
            _CREATED.pop(key, None)  # unlocked: another process's to claim now


def _forget_locks_in_child() -> None:
    # A flock belongs to the open file, which a fork shares: a forked child (a reward worker)
    # closes its copies, so that the lock ends with the trainer, not with its longest-lived child
    for file in _HELD.values():
        file.close()
    _HELD.clear()
    _CREATED.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[list[Path]]:
    """Lock `run_dir` for this process (creating it) and give its entries but the lock file;
    UserError naming the holder when another process holds it. On a UserError inside, a lock
    file this call created is removed again, and a directory it created (`_remove_if_new`), so
    a refused directory is left as it was."""
    absolute = run_dir.absolute()
    missing = [p for p in (absolute, *absolute.parents) if not p.exists()]
    if run_dir.exists() and not run_dir.is_dir():  # mkdir would say only "File exists"
        raise UserError(f"run.dir {run_dir} is a file, not a directory; pick another run.dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"run.dir {run_dir} cannot be created: {err.strerror}") from None
    path = run_dir / LOCK_FILE
    key = str(run_dir.resolve())
    created = False
    held = _HELD.get(key)
    if held is None or not path.exists() or os.fstat(held.fileno()).st_ino != path.stat().st_ino:
        created = not path.exists()
        _HELD[key] = _lock(path)
        _CREATED.pop(key, None)
        if missing:
            _CREATED[key] = missing
    clean_leftovers(run_dir)
    try:
        yield sorted(p for p in run_dir.iterdir() if p.name != LOCK_FILE)
    except UserError:
        _remove_if_new(run_dir)
        if created and key in _HELD:
            path.unlink(missing_ok=True)
            _HELD.pop(key).close()
            _CREATED.pop(key, None)
        raise


@contextlib.contextmanager
def removed_if_not_started(run_dir: Path) -> Iterator[None]:
    """A run's start-up in `run_dir`: should it fail (raise anything), `run_dir` is removed
    when this process created it and it holds no file but its lock (`_remove_if_new`)."""
    try:
        yield
    except BaseException:
        _remove_if_new(run_dir)
        raise


def _remove_if_new(run_dir: Path) -> None:
    """Remove `run_dir` when this process created it, holds its lock still, and it holds
    nothing but the lock file and empty folders (what a run refused at start-up leaves), with
    the folders created above it for it while they are empty. A directory that existed before,
    or that holds any other file, is left as it is, locked."""
    key = str(run_dir.resolve())
    lock = run_dir / LOCK_FILE
    if key not in _CREATED or key not in _HELD:
        return
    inside = [p for p in run_dir.rglob("*") if p != lock]
    if any(p.is_symlink() or not p.is_dir() for p in inside):
        return
    # unlinked before the lock is released: a trainer that comes later makes a lock of its own
    lock.unlink(missing_ok=True)
    _HELD.pop(key).close()
    created = _CREATED.pop(key)
    # deepest first; rmdir removes no folder that is not empty, whatever appeared meanwhile
    for folder in [*sorted(inside, key=lambda p: len(p.parts), reverse=True), *created]:
        try:
            folder.rmdir()
        except OSError:
            return


def _lock(path: Path) -> TextIO:
    """`path` opened and locked exclusively, with this process named in it."""
    try:
        file = open(path, "a+")  # noqa: SIM115 (held open for the process's life)
    except OSError as err:
        raise UserError(f"run.dir {path.parent} cannot be locked: {err.strerror}") from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise UserError(
            f"run.dir {path.parent} is in use by another trainer ({holder}); wait for it to end "
            "or pick another run.dir"
        ) from None
    file.seek(0)
    file.truncate()
    now = datetime.now().isoformat(timespec="seconds")
    file.write(f"pid {os.getpid()} on {socket.gethostname()} since {now}\n")
    file.flush()
    atexit.register(file.close)  # released as the process ends, as the OS would
    return file
