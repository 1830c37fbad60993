"""A GRPO run: `train` runs `training_step` (`oncurve.loop.training_step`) once a step, with
the preflight, evaluation, checkpoints, logging, clean stops and the final save.

Building a run is `oncurve.run.setup`; the run directory `oncurve.run.rundir`; stop signals
`oncurve.run.stopping`; stage timing `oncurve.loop.timer`.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from oncurve import distributed
from oncurve.config import (
    Config,
    RewardFnConfig,
    build_config,
    check_preset_applied,
    load_config,
    to_dict,
    with_model_path,
)
from oncurve.data.given import SETTINGS, check_dataset, first_rows, given_path, holding, streams
from oncurve.errors import TrainingError, UserError
from oncurve.loop.collect import sampling_params, trainer_state
from oncurve.loop.evaluate import evaluate
from oncurve.loop.preflight import run_preflight
from oncurve.loop.progress import Progress, guarded_output
from oncurve.loop.reward_signal import DeadStepWatch, check_gold_answers
from oncurve.loop.training_step import training_step
from oncurve.model.devices import resolve_device
from oncurve.model.saving import save_final, save_lora_final, trained_generation
from oncurve.rewards.registry import ANSWER_MATCH_REWARDS, GIVEN_PREFIX, give_rewards
from oncurve.rewards.runner import runner_settings
from oncurve.run import checkpoint, oom
from oncurve.run.oom import OutOfMemoryStop
from oncurve.run.rundir import run_dirs_unlocked_after
from oncurve.run.session import Session
from oncurve.run.settle import memory_settings
from oncurve.run.setup import setup
from oncurve.run.stopping import StopRequest, stop_on_signals
from oncurve.update.determinism import deterministic_kernels

__all__ = ["Session", "TrainResult", "setup", "train"]


# A step's metrics that count or time something on each rank: summed or maxed over ranks.
SUMMED = frozenset(
    ("reward/errors", "reward/timeouts", "episode/errors", "episode/timeouts", "groups/dropped")
    + ("episode/truncated", "episode/max_turns", "tokens_per_s")
)
MAXED = frozenset(("reward/slowest_row_s",))
# What TRL's `reward_funcs` holds: a reward function, or a reward model's directory or Hub id.
RewardFunc = Callable[..., Any] | str


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None
    # the run reached its last step and wrote final/ (else a signal stopped it, resumable)
    completed: bool = True


def train(
    config: Config | str | os.PathLike[str] | None = None,
    *,
    model: str | os.PathLike[str] | None = None,
    quiet: bool = False,
    reward_funcs: RewardFunc | Sequence[RewardFunc] = (),
    reward_weights: Sequence[float] | None = None,
    train_dataset: Iterable[Mapping[str, Any]] | None = None,
    eval_dataset: Iterable[Mapping[str, Any]] | None = None,
) -> TrainResult:
    """Run GRPO as configured; returns the run directory and held-out accuracy before/after.
    `config` is a `Config`, or a YAML file's path loaded as `load_config(path)` loads it (None:
    the defaults). `model` is TRL's `model=` as a string: a directory or Hub id, in place of
    `model.path` (a config that names another is refused); a config loaded for the bundled
    model (a YAML path) takes a real model's defaults where it sets nothing, a `Config` that
    holds the bundled model's is refused (`with_model_path`). A loaded model object is
    refused: oncurve loads the model itself, again to resume.
    `reward_funcs` (one or a list, weighted by `reward_weights`, else 1 each) are TRL's: reward
    functions, called with TRL's keywords, named `given:<name>` in `reward.functions`, and
    reward models' directories or Hub ids, named `model:<path>` there; they come after the
    config's (a config that names them already, a resumed run's config.yaml, has them
    replaced); a resumed run is given them again.

    `train_dataset` and `eval_dataset` are TRL's too: a `datasets.Dataset` or a list of dict
    rows, read and checked as a file's rows are (`oncurve.data.files.load_rows`: the prompt
    column or a list of messages, the answer column, every column reaching the rewards by
    name), in place of `data.path` and `eval.path`, which name them `given:train_dataset` and
    `given:eval_dataset` (a config whose path names a file or Hub id is refused); a resumed run
    is given them again: given other training rows it is refused as for an edited file, other
    held-out rows are said as the changed setting `eval.rows`. A dataset that streams its rows
    (an `IterableDataset`) is read as far as the run needs: `data.prompts_per_step` x
    `run.steps` training rows (then shuffled as a `Dataset`'s), `eval.num_prompts` held-out
    ones (which it must set), so an endless stream trains."""
    given_config = config
    if config is None or isinstance(config, str | os.PathLike):
        config = load_config(config)
    model = None if model is None else _model_path(config, model)
    if model is not None and model != config.model.path:
        if isinstance(given_config, Config):
            config = with_model_path(config, model)
        else:  # loaded again with the path: where the file sets nothing, a real model's defaults
            config = load_config(given_config, [f"model.path={model}"])
    if callable(reward_funcs) or isinstance(reward_funcs, str):
        reward_funcs = [reward_funcs]
    if reward_funcs:
        config = replace(
            config,
            reward=replace(
                config.reward, functions=_with_given(config, reward_funcs, reward_weights)
            ),
        )
    elif reward_weights is not None:
        raise UserError("reward_weights: no reward_funcs to weigh")
    datasets = {
        argument: dataset
        for argument, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset))
        if dataset is not None
    }
    config = _with_datasets(config, datasets)
    # a Config made or changed in Python has not had its preset applied, nor its fields checked:
    # rebuilt from its dict form, each field is coerced and checked as loading does (the
    # rebuilt algo section is marked as loaded, so the preset is checked on the one given)
    check_preset_applied(config)
    config = build_config(to_dict(config))
    datasets = {
        argument: first_rows(dataset, _rows_to_read(config, argument, dataset))
        if streams(dataset)
        else dataset
        for argument, dataset in datasets.items()
    }
    cuda = resolve_device(config.run.device).type == "cuda"
    with (
        run_dirs_unlocked_after(),
        deterministic_kernels(cuda and config.run.deterministic),
        holding(datasets),
    ):
        return _train(config, quiet)


def _model_path(config: Config, model: Any) -> str:
    """`model` as the directory or Hub id it names; a one-line error for a model object, or
    where the config names another model."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str):
        name = getattr(model, "name_or_path", "")
        unchanged = f"model={name!r} if it is unchanged since loading, else " if name else "or "
        raise UserError(
            f"model: a {type(model).__name__} object; oncurve loads the model itself, at the "
            f"start and again to resume: pass its directory or Hub id, {unchanged}save it "
            "(model.save_pretrained(directory)) and pass the directory"
        )
    if config.model.path not in (model, type(config.model)().path):
        raise UserError(
            f"model: the config's model.path names {config.model.path} as well; give the "
            "model one way: unset model.path, or pass no model"
        )
    return model


def _rows_to_read(config: Config, argument: str, dataset: Any) -> int:
    """How many rows the run reads of a dataset that streams them, passed as `argument`: a
    step's prompts for each step, or the held-out rows an evaluation scores (a one-line error
    where eval.num_prompts does not say how many)."""
    if argument == "train_dataset":
        return config.data.prompts_per_step * config.run.steps
    if not config.eval.num_prompts:
        raise UserError(
            f"{argument} streams its rows ({type(dataset).__name__}, no length), which may "
            "not end: set eval.num_prompts, the held-out rows to read from it"
        )
    return config.eval.num_prompts


def _with_datasets(config: Config, datasets: dict[str, Any]) -> Config:
    """`config` with `data.path` and `eval.path` naming the datasets given to `train` (by
    argument), each checked (`check_dataset`); a one-line error where the config names a file
    or Hub id there, or an `eval_dataset` beside a built-in task, which evaluates on its own."""
    for argument, dataset in datasets.items():
        setting = SETTINGS[argument]
        name, key = setting.split(".")
        section = getattr(config, name)
        if section.path not in (None, given_path(argument)):
            raise UserError(
                f"{argument}: the config's {setting} names {section.path} as well; give the "
                f"rows one way: unset {setting}, or pass no {argument}"
            )
        if section.split != type(section)().split:
            raise UserError(
                f"{argument}: {name}.split picks a split of a Hub dataset, not of given rows; "
                "unset it"
            )
        check_dataset(argument, dataset)
        config = replace(config, **{name: replace(section, **{key: given_path(argument)})})
    if "eval_dataset" in datasets and config.data.path is None:
        raise UserError(
            f"eval_dataset: the run trains on the built-in task {config.data.task}, which "
            "evaluates on its own held-out problems; pass train_dataset (or set data.path) too"
        )
    return config


def _with_given(
    config: Config, fns: Sequence[RewardFunc], weights: Sequence[float] | None
) -> list[RewardFnConfig]:
    """`reward.functions` with the functions given to `train` in place of any named before."""
    weights = [1.0] * len(fns) if weights is None else list(weights)
    if len(weights) != len(fns):
        raise UserError(f"reward_weights: {len(weights)} weights for {len(fns)} reward_funcs")
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise UserError(f"reward_weights: numbers are needed, got {weights!r}") from None
    if not all(math.isfinite(w) for w in weights):
        raise UserError(f"reward_weights: finite numbers are needed, got {weights}")
    specs = give_rewards(fns)
    named = [
        f
        for f in config.reward.functions
        if not f.name.startswith(GIVEN_PREFIX) and f.name not in specs
    ]
    given = zip(specs, weights, strict=True)
    return [*named, *(RewardFnConfig(spec, weight) for spec, weight in given)]


def _train(config: Config, quiet: bool) -> TrainResult:
    """The run, from setup to the final save, under `stop_on_signals` and `guarded_output`.

    A stop signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1) never cuts a phase short: the step,
    evaluation or save under way finishes, then every rank stops at the same point. Within the
    loop the step is checkpointed and `train` returns (exit 0); before step 1 (setup, preflight,
    the first evaluation) there is nothing to save and `SystemExit(128 + signum)` ends the run;
    during the final evaluation the run stops with its last step's checkpoint (a resume
    evaluates and writes `final/`); during the final save the run completes. A second signal
    aborts at once (`stop_on_signals`). A closed stdout or stderr silences the run's output.
    """
    first = "before the first step" if config.run.resume else "before step 1"
    announce = os.environ.get("RANK", "0") == "0"  # one acknowledgment for a torchrun job
    with guarded_output(), stop_on_signals(announce=announce) as stop:
        stop.where = first

        def checks(s: Session) -> None:
            # before the run replaces anything: a refused or stopped run leaves a previous one
            stop.where = f"before step {s.start_step + 1}"
            _stop_before_the_loop(s, stop)
            if s.start_step == 0:
                _check_gold(s)  # the data's check, whatever run.preflight says
            if s.config.run.preflight and s.start_step == 0:
                _preflight(s)
                _stop_before_the_loop(s, stop)

        s = setup(config, checks)
        cfg = s.config
        _stop_before_the_loop(s, stop)
        eval_before = eval_after = None
        if s.eval_data is not None and cfg.eval.at_start_end and s.start_step == 0:
            eval_before = _evaluate(s, step=0)
            _stop_before_the_loop(s, stop)
        progress = Progress(cfg.run.steps, s.start_step, quiet, enabled=s.rank == 0)
        dead_steps = DeadStepWatch(cfg.run.dead_steps if s.rank == 0 else 0)

        with s.rewards, progress, _saved_on_giving_up(s) as where:
            for step in range(s.start_step + 1, cfg.run.steps + 1):
                stop.where = f"after step {step}"
                where.in_step = True
                metrics = distributed.across_ranks(training_step(s, step), SUMMED, MAXED)
                where.in_step, where.finished = False, step
                s.logger.log(step, metrics)
                progress.update(step, metrics)
                dead_steps.update(metrics)
                # Every rank must agree to stop at the same step, or the next collective hangs.
                stopping = _agreed_stop(stop) > 0
                if (
                    s.eval_data is not None
                    and cfg.eval.every
                    and step % cfg.eval.every == 0
                    # the last step's evaluation is at_start_end's, when that is on
                    and (step < cfg.run.steps or not cfg.eval.at_start_end)
                ):
                    _evaluate(s, step)
                    # a signal during the evaluation: stop after it (every rank evaluates)
                    stopping = stopping or _agreed_stop(stop) > 0
                if (
                    step == cfg.run.steps
                    or stopping
                    or (cfg.run.save_every and step % cfg.run.save_every == 0)
                ):
                    _save(s, step)
                    where.saved = step
                    if step < cfg.run.steps:  # a signal during the save: stop after it
                        stopping = stopping or _agreed_stop(stop) > 0
                if stopping:
                    _say_stopped(s, step)
                    s.logger.close()
                    return TrainResult(s.run_dir, step, eval_before, None, completed=False)
        # a signal during the last step's save, or the final evaluation: the last step's
        # checkpoint stands, and a resume evaluates and writes final/
        stop.where = "after the final evaluation"
        if _agreed_stop(stop):
            _say_stopped(s, cfg.run.steps)
            s.logger.close()
            return TrainResult(s.run_dir, cfg.run.steps, eval_before, None, completed=False)
        if s.eval_data is not None and cfg.eval.at_start_end:
            eval_after = _evaluate(s, step=cfg.run.steps)
            if _agreed_stop(stop):
                _say_stopped(s, cfg.run.steps)
                s.logger.close()
                return TrainResult(
                    s.run_dir, cfg.run.steps, eval_before, eval_after, completed=False
                )
        stop.where = "after the final save, the run complete"
        r = cfg.rollout
        sampling = dict(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            min_p=r.min_p,
        )
        if s.policy.peft_model is None:
            with s.policy.whole() as policy:
                if s.rank == 0:
                    generation = trained_generation(policy, s.tokenizer, **sampling)
                    save_final(policy, s.tokenizer, s.run_dir / "final", generation)
        elif s.rank == 0:
            peft_model = s.policy.peft_model
            save_lora_final(
                peft_model,
                s.tokenizer,
                s.run_dir / "final",
                cfg.model.lora.save_adapter,
                trained_generation(peft_model, s.tokenizer, **sampling),
            )
        s.logger.close()
        if eval_before and eval_after and s.rank == 0:
            print(
                f"held-out greedy accuracy: {eval_before['accuracy']:.1%} before, "
                f"{eval_after['accuracy']:.1%} after {cfg.run.steps} steps",
                file=sys.stderr,
            )
        return TrainResult(s.run_dir, cfg.run.steps, eval_before, eval_after)


def _agreed_stop(stop: StopRequest) -> int:
    """The stop signal any rank received (the largest number), 0 for none: a collective, so
    every rank calls it at the same points and every rank stops at the same one."""
    return int(distributed.all_max([float(stop.signum or 0)])[0])


def _stop_before_the_loop(s: Session, stop: StopRequest) -> None:
    """Before step 1 (setup, preflight, the first evaluation) a stop has nothing to save: one
    line, and the run ends with status 128 + the signal's number."""
    signum = _agreed_stop(stop)
    if not signum:
        return
    s.logger.close()
    if s.rank == 0:
        resume = f" (resume with run.resume=auto run.dir={s.run_dir})" if s.start_step else ""
        print(
            f"stopped before step {s.start_step + 1} on request; nothing to save{resume}",
            file=sys.stderr,
        )
    raise SystemExit(128 + signum)


def _say_stopped(s: Session, step: int) -> None:
    if s.rank == 0:
        print(
            f"stopped at step {step} on request; resume with run.resume=auto run.dir={s.run_dir}",
            file=sys.stderr,
        )


def _preflight(s: Session) -> None:
    """`oncurve.loop.preflight` on this rank's first two prompts of step 1; a failure stops the run
    before anything is trained."""
    cfg = s.config
    # the config as settled (auto and null filled in) passes every check of a loaded one
    build_config(to_dict(cfg))
    mine = distributed.shard(cfg.data.prompts_per_step, s.rank, s.world_size)

    def check() -> list[str]:
        return run_preflight(
            policy=s.policy.train_forward,
            sampler=s.sampler,
            rows=s.data.batch(1, cfg.data.prompts_per_step)[mine][:2],
            group_size=cfg.rollout.group_size,
            params=sampling_params(cfg, seed=0),
            fns=s.loss_fns,
            forward=s.policy.forward,
            trainable=[p for group in s.optimizer.param_groups for p in group["params"]],
            chat_template=cfg.data.chat_template,
            dtype=next(s.policy.model.parameters()).dtype,
        )

    # the preflight's workspace (two prompts' rows) is freed after it, not kept all run long
    # beside the steps' one
    with s.policy.whole(), s.sampler.scratch():
        lines = s.recovering(oom.PREFLIGHT, check)
    s.settle_settings()
    lines.insert(0, "preflight: settings valid, none of them a known silent no-op")
    if s.rank == 0:
        for line in lines:
            print(line, file=sys.stderr)


def _check_gold(s: Session) -> None:
    """`oncurve.loop.reward_signal.check_gold_answers` on a dataset run whose evaluation reads
    the `correct` reward (a built-in task's rows are made with their answers): a reference that
    reward cannot pay stops a run it trains, and is a note where `correct` is none of the run's
    rewards (TRL's code recipes pass a `solution` column that is a whole program). It runs
    whatever `run.preflight` says; its line on passing is printed with the preflight's."""
    cfg = s.config
    if cfg.data.path is None or s.correct not in ANSWER_MATCH_REWARDS:
        return
    try:
        line = check_gold_answers(s.data.rows, s.correct, s.data.rows[0].answer_field)
        if not cfg.run.preflight:  # passing, it is one of the preflight's lines
            return
    except UserError as error:
        if s.rewards.verifier is not None:
            raise
        line = (
            f"note: gold answers: {error}; training goes on, as `correct` is none of "
            "reward.functions, but held-out accuracy (eval/accuracy) reads them this way, and "
            "a reward of reward.functions that compares with `answer` reads them as they are"
        )
    if s.rank == 0:
        print(line, file=sys.stderr)


@dataclass
class _Position:
    """Where the training loop stands."""

    finished: int  # the last step whose update is done
    saved: int  # the last step checkpointed
    in_step: bool = False  # a step's phases are under way


@contextmanager
def _saved_on_giving_up(s: Session) -> Iterator[_Position]:
    """The loop's position; when a phase gives up after running out of memory
    (`OutOfMemoryStop`), the last finished step is saved, unless the step under way already
    changed the weights (an update of several optimizer steps), and the one-line error says
    where a resumed run starts. An OS fault in the loop (a full disk or a file-size limit while
    metrics or samples are appended) saves nothing more, since the disk is what failed: one
    line names the file and the last checkpoint kept."""
    where = _Position(finished=s.start_step, saved=s.start_step)
    try:
        yield where
    except OutOfMemoryStop as stop:
        if (not where.in_step or s.counts.updates_this_step == 0) and where.finished > where.saved:
            _save(s, where.finished)
            where.saved = where.finished
        s.record_settings()  # the settings made smaller before it gave up
        s.logger.close()
        raise OutOfMemoryStop(f"{stop}; {_kept(s, where.saved)}") from None
    except OSError as err:
        with contextlib.suppress(OSError):
            s.logger.close()
        path = f"{err.filename}: " if err.filename else ""  # a read's or a write's
        raise TrainingError(f"{path}{err.strerror or err}; {_kept(s, where.saved)}") from None


def _kept(s: Session, saved: int) -> str:
    """What a run that stops on a fault keeps, and how to go on."""
    if not saved:
        return "no step was saved"
    return f"step {saved} is saved: resume with run.resume=auto run.dir={s.run_dir}"


def _save(s: Session, step: int) -> None:
    modules, optimizers = s.checkpoint_extras()
    with s.policy.whole() as policy:
        checkpoint.save_checkpoint(
            s.run_dir,
            step,
            policy,
            s.optimizer,
            s.scheduler,
            {
                "step": step,
                "completion_tokens": s.counts.completion_tokens,
                "world_size": s.world_size,
                "memory": memory_settings(s.config),
                "oom_settings": s.shrunk,
                # what a resume compares its settings with (`oncurve.config.resume_settings`)
                "config": to_dict(s.config),
                "config_history": s.config_history,
                "data_fingerprint": s.data_fingerprint,
                "eval_fingerprint": s.eval_fingerprint,
                **({} if s.curriculum is None else {"curriculum": s.curriculum.state_dict()}),
            },
            keep_last=s.config.run.keep_last,
            modules=modules,
            optimizers=optimizers,
            trainable_only=s.config.model.lora.r > 0,
        )


def _evaluate(s: Session, step: int) -> dict[str, float]:
    # the sampler's workspace for an evaluation is freed after it, not held through the update
    with s.policy.whole(), s.sampler.scratch():
        result = s.recovering(
            oom.EVALUATION, partial(_evaluation, s, step), on_retry=s.sampler.release
        )
    s.settle_settings()
    s.logger.log(step, {f"eval/{k}": v for k, v in result.items()})
    return result


def _evaluation(s: Session, step: int) -> dict[str, float]:
    cfg = s.config
    return evaluate(
        s.sampler,
        s.eval_data.rows[: cfg.eval.num_prompts],
        s.correct,
        sampling_params(cfg, cfg.run.seed),
        samples=cfg.eval.samples,
        batch_size=cfg.eval.batch_rows,
        episodes=s.episodes,
        state=trainer_state(cfg, step),
        **runner_settings(cfg.reward),
        name=s.correct_name,
    )
