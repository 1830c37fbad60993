"""The run directory: which one a run writes to, whether it resumes, and what it may delete.

A run never deletes a file it did not write: `run.overwrite` replaces only a previous run's
files (`RUN_FILES`), and `run.resume=auto` on a directory without a checkpoint restarts only
when nothing foreign is there.
"""

from __future__ import annotations

import shutil
import sys
from datetime import datetime
from pathlib import Path

import torch

from oncurve import checkpoint, distributed
from oncurve.config import Config
from oncurve.errors import UserError

# What a run (and `oncurve report` on it) writes: the only names a new run may delete.
RUN_FILES = {
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "checkpoints",
    "tensorboard",
    "wandb",
    "final",
    "report",
}


def prepare_run_dir(config: Config, rank: int) -> tuple[Path, Path | None]:
    """The run directory and the checkpoint to resume from. Rank 0 checks and creates it; the
    other ranks wait for that (a barrier) and then only read."""
    run_dir, resume_from = claim_run_dir(config) if rank == 0 else (None, None)
    if distributed.world()[1] > 1:
        shared = [str(run_dir), str(resume_from) if resume_from else ""]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir, resume_from = Path(shared[0]), Path(shared[1]) if shared[1] else None
    return run_dir, resume_from


def claim_run_dir(config: Config) -> tuple[Path, Path | None]:
    """Rank 0's side of `prepare_run_dir`: check `run.dir`, `run.resume` and `run.overwrite`,
    delete a previous run's files when asked, create the directory."""
    resume = config.run.resume
    if resume not in (None, "auto"):
        path = Path(resume)
        if not (path / "COMPLETE").is_file():
            raise UserError(f"run.resume {resume} is not a complete checkpoint directory")
        run_dir = Path(config.run.dir) if config.run.dir else path.parent.parent
        return run_dir, path
    if config.run.dir is None:
        if resume == "auto":
            raise UserError("run.resume=auto needs run.dir (the run to continue)")
        run_dir = Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    else:
        run_dir = Path(config.run.dir)
    if resume == "auto":
        found = checkpoint.latest_checkpoint(run_dir) if run_dir.exists() else None
        if found is not None:
            return run_dir, found
    if run_dir.exists() and any(run_dir.iterdir()):
        # Neither resume=auto (restarting a run killed before its first checkpoint) nor
        # run.overwrite deletes files that no run wrote: run.dir may point at the wrong directory.
        foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in RUN_FILES)
        restart = resume == "auto" and not foreign
        if config.run.overwrite and foreign:
            raise UserError(
                f"run.dir {run_dir} holds files no run wrote ({', '.join(foreign[:3])}); "
                "run.overwrite only replaces a previous run, pick another run.dir"
            )
        if not (config.run.overwrite or restart):
            raise UserError(
                f"run.dir {run_dir} is not empty; "
                + (
                    "it has no checkpoint and holds files no run wrote; pass run.overwrite=true "
                    "to start over"
                    if resume == "auto"
                    else "pass run.resume=auto to continue it or run.overwrite=true to start over"
                )
            )
        shutil.rmtree(run_dir)
    if resume == "auto":
        print(f"note: no checkpoint in {run_dir}; starting a new run", file=sys.stderr)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"run.dir {run_dir} cannot be created: {err.strerror}") from None
    return run_dir, None
