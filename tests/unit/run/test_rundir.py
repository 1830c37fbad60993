"""Which run directory a run claims, and what it refuses to write into."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncurve.config import load_config
from oncurve.errors import UserError
from oncurve.run.rundir import claim_run_dir, run_dirs_unlocked_after


def _complete_checkpoint(path: Path) -> Path:
    """A directory with a checkpoint's COMPLETE marker, as much as claiming a run dir reads."""
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text("2\n")
    return path


def test_a_checkpoint_outside_a_runs_checkpoints_never_resumes_into_its_non_empty_grandparent(
    tmp_path: Path,
) -> None:
    """A copied checkpoint (`project/saved/mine`) names no run: the folder two levels up is
    a directory of the user's, not the run's, so a run.dir there that is not empty is refused
    like any other, its files left as they are."""
    project = tmp_path / "project"
    copy = _complete_checkpoint(project / "saved" / "mine")
    (project / "config.yaml").write_text("my: notes\n")
    config = load_config(None, [f"run.resume={copy}", f"run.dir={project}"])
    with run_dirs_unlocked_after(), pytest.raises(UserError) as refused:
        claim_run_dir(config)
    assert "\n" not in str(refused.value)
    assert f"run.dir {project}" in str(refused.value)
    assert "empty run.dir" in str(refused.value)
    assert (project / "config.yaml").read_text() == "my: notes\n"
    assert sorted(p.name for p in project.iterdir()) == ["config.yaml", "saved"]


def test_a_checkpoint_outside_a_runs_checkpoints_resumes_into_an_empty_run_dir(
    tmp_path: Path,
) -> None:
    copy = _complete_checkpoint(tmp_path / "saved" / "mine")
    target = tmp_path / "new-run"
    config = load_config(None, [f"run.resume={copy}", f"run.dir={target}"])
    with run_dirs_unlocked_after():
        run_dir, resume_from, replaced = claim_run_dir(config)
    assert (run_dir, resume_from) == (target, copy)
    assert replaced.entries == [] and replaced.checkpoints == []


def test_resume_auto_refuses_a_run_whose_checkpoints_are_there_but_none_complete(
    tmp_path: Path,
) -> None:
    """A save never leaves a `step-NNNNNN` directory without its COMPLETE marker (it is renamed
    into place whole), so one there is a copy cut short or a damaged run, not a run killed
    before its first checkpoint: resume=auto says so in one line instead of deleting it and
    the run's metrics to start over."""
    run_dir = tmp_path / "run"
    partial = run_dir / "checkpoints" / "step-000004"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"weights")
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "kl": 0.5}\n')
    config = load_config(None, [f"run.dir={run_dir}", "run.resume=auto"])
    with run_dirs_unlocked_after(), pytest.raises(UserError) as refused:
        claim_run_dir(config)
    assert "\n" not in str(refused.value)
    assert "step-000004" in str(refused.value) and "run.overwrite=true" in str(refused.value)
    assert (partial / "model.safetensors").read_bytes() == b"weights"
    assert (run_dir / "metrics.jsonl").is_file()


def test_resume_auto_restarts_a_run_killed_before_its_first_checkpoint(tmp_path: Path) -> None:
    """What a kill before the first checkpoint leaves (metrics, a save's hidden temp dir) is
    the run's to start over."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".tmp-step-000001-123").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "kl": 0.5}\n')
    config = load_config(None, [f"run.dir={run_dir}", "run.resume=auto"])
    with run_dirs_unlocked_after():
        _, resume_from, replaced = claim_run_dir(config)
    assert resume_from is None
    assert sorted(p.name for p in replaced.entries) == ["checkpoints", "metrics.jsonl"]


def test_resume_auto_with_overwrite_starts_over_past_an_incomplete_checkpoint(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000004").mkdir(parents=True)
    config = load_config(None, [f"run.dir={run_dir}", "run.resume=auto", "run.overwrite=true"])
    with run_dirs_unlocked_after():
        _, resume_from, replaced = claim_run_dir(config)
    assert resume_from is None and [p.name for p in replaced.entries] == ["checkpoints"]


@pytest.mark.parametrize("resume", [None, "auto"])
def test_a_run_dir_that_is_a_file_is_one_line_saying_so(tmp_path: Path, resume) -> None:
    file = tmp_path / "notes"
    file.write_text("mine")
    extra = [f"run.resume={resume}"] if resume else []
    with run_dirs_unlocked_after(), pytest.raises(UserError) as refused:
        claim_run_dir(load_config(None, [f"run.dir={file}", *extra]))
    assert str(refused.value) == f"run.dir {file} is a file, not a directory; pick another run.dir"
    assert file.read_text() == "mine"


def test_overwrite_replaces_a_previous_run_past_step_999999(tmp_path: Path) -> None:
    """A checkpoint's directory takes as many digits as its step needs (`step-1000000`):
    still the run's own, which run.overwrite replaces."""
    run_dir = tmp_path / "run"
    step = run_dir / "checkpoints" / "step-1000000"
    step.mkdir(parents=True)
    for name in ("COMPLETE", "model.safetensors", "state.json"):
        (step / name).write_text("x")
    (run_dir / "checkpoints" / "latest").write_text("step-1000000\n")
    config = load_config(None, [f"run.dir={run_dir}", "run.overwrite=true"])
    with run_dirs_unlocked_after():
        _, resume_from, replaced = claim_run_dir(config)
    assert resume_from is None and [p.name for p in replaced.entries] == ["checkpoints"]


def test_resume_of_a_step_in_a_checkpoints_folder_linked_elsewhere_continues_its_run(
    tmp_path: Path,
) -> None:
    """`RUN/checkpoints` a link to a larger disk: `RUN/checkpoints/step-000002` is RUN's
    checkpoint, resumed into RUN (whose other files are its own)."""
    run_dir, scratch = tmp_path / "run", tmp_path / "scratch" / "run-ckpts"
    _complete_checkpoint(scratch / "step-000002")
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(scratch)
    (run_dir / "metrics.jsonl").write_text('{"step": 2, "kl": 0.5}\n')
    step = run_dir / "checkpoints" / "step-000002"
    with run_dirs_unlocked_after():
        resumed, resume_from, replaced = claim_run_dir(load_config(None, [f"run.resume={step}"]))
    assert (resumed.resolve(), resume_from) == (run_dir.resolve(), step)
    assert replaced.entries == [] and replaced.checkpoints == []


def test_resume_of_a_runs_latest_pointer_continues_its_newest_complete_checkpoint(
    tmp_path: Path,
) -> None:
    """`run.resume=RUN/checkpoints/latest` (the path `oncurve eval` takes too) is the run's
    newest complete checkpoint; a run with none is one line naming the pointer."""
    run_dir = tmp_path / "run"
    for step in ("step-000002", "step-000004"):
        _complete_checkpoint(run_dir / "checkpoints" / step)
    (run_dir / "checkpoints" / "latest").write_text("step-000004\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 4, "kl": 0.5}\n')
    pointer = run_dir / "checkpoints" / "latest"
    with run_dirs_unlocked_after():
        resumed, resume_from, _ = claim_run_dir(load_config(None, [f"run.resume={pointer}"]))
    assert (resumed, resume_from) == (run_dir.resolve(), run_dir / "checkpoints" / "step-000004")

    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "checkpoints" / "latest").write_text("step-000001\n")
    config = load_config(None, [f"run.resume={empty / 'checkpoints' / 'latest'}"])
    with run_dirs_unlocked_after(), pytest.raises(UserError, match="no complete checkpoint"):
        claim_run_dir(config)


def _refusal(*overrides: str) -> str:
    """The one line claiming a run directory with `overrides` is refused with."""
    with run_dirs_unlocked_after(), pytest.raises(UserError) as refused:
        claim_run_dir(load_config(None, list(overrides)))
    return str(refused.value)


def _previous_run(run_dir: Path) -> None:
    """A finished run's files, as much as claiming its directory reads."""
    _complete_checkpoint(run_dir / "checkpoints" / "step-000002")
    (run_dir / "final").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (run_dir / "final" / name).write_text("{}")


@pytest.mark.parametrize("name", ["README.md", "eval_results.json", "adapter/notes.json"])
def test_overwrite_refuses_a_model_card_or_eval_result_of_yours_in_final(
    tmp_path: Path, name: str
) -> None:
    """Only the files a save writes in final/ are a run's: a model card or an eval result kept
    there is yours, which run.overwrite refuses to delete, in one line naming it."""
    run_dir = tmp_path / "run"
    _previous_run(run_dir)
    (run_dir / "final" / name).parent.mkdir(exist_ok=True)
    (run_dir / "final" / name).write_text("mine")
    assert _refusal(f"run.dir={run_dir}", "run.overwrite=true") == (
        f"run.dir {run_dir} holds files no run wrote (final/{name}); run.overwrite only "
        "replaces a previous run, pick another run.dir"
    )


def test_a_resume_keeps_your_files_in_final_unless_it_deletes_final(tmp_path: Path) -> None:
    """A resumed run's final model keeps the files of yours in final/ (`saving.save_final`): it
    starts; one from an older checkpoint, which deletes final/ with the later checkpoints,
    is refused in one line naming them."""
    run_dir = tmp_path / "run"
    _previous_run(run_dir)
    (run_dir / "final" / "NOTES.md").write_text("mine")
    with run_dirs_unlocked_after():
        _, resume_from, replaced = claim_run_dir(
            load_config(None, [f"run.dir={run_dir}", "run.resume=auto"])
        )
    assert resume_from == run_dir / "checkpoints" / "step-000002" and replaced.entries == []
    older = _complete_checkpoint(run_dir / "checkpoints" / "step-000001")
    assert _refusal(f"run.resume={older}", "run.overwrite=true") == (
        f"{run_dir / 'final'} holds files no run wrote (NOTES.md), and resuming from an older "
        "checkpoint deletes final/: move them out first"
    )
    assert (run_dir / "final" / "NOTES.md").read_text() == "mine"


def test_overwrite_empties_run_folders_linked_to_another_disk_and_keeps_the_links(
    tmp_path: Path,
) -> None:
    """`checkpoints/` and `final/` linked to a larger disk: the previous run's files there are
    deleted and the links stay, so that the new run writes there too."""
    run_dir, disk = tmp_path / "run", tmp_path / "disk"
    _previous_run(disk)
    run_dir.mkdir()
    for name in ("checkpoints", "final"):
        (run_dir / name).symlink_to(disk / name)
    config = load_config(None, [f"run.dir={run_dir}", "run.overwrite=true"])
    with run_dirs_unlocked_after():
        _, _, replaced = claim_run_dir(config)
        replaced.remove()
    assert all((run_dir / name).is_symlink() for name in ("checkpoints", "final"))
    assert sorted(p.name for p in disk.rglob("*")) == ["checkpoints", "final"]


def test_a_final_model_a_killed_save_had_moved_aside_is_put_back(tmp_path: Path) -> None:
    """Killed between moving the previous final/ aside and renaming the new one into place, a
    save leaves both hidden: the next start puts the previous one back."""
    run_dir = tmp_path / "run"
    _previous_run(run_dir)
    (run_dir / "final").rename(run_dir / ".final.trash-4242")
    (run_dir / ".final.partial-4242").mkdir()
    config = load_config(None, [f"run.dir={run_dir}", "run.resume=auto"])
    with run_dirs_unlocked_after():
        claim_run_dir(config)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoints", "final"]
    assert (run_dir / "final" / "model.safetensors").read_text() == "{}"
