"""The GRPO loop: sample groups, score them, turn rewards into advantages, update the policy.

`training_step` is the algorithm, one line per stage; `train` runs it with evaluation,
checkpoints, logging and clean stops. What a step simplifies: one sampler and the trainer share
the weights (no weight sync), rewards are scored on the CPU, and the advantage source (group
statistics, or PPO's critic) is the only place the algorithms differ outside the loss.
Building a run is `oncurve.run.setup`; the run directory `oncurve.run.rundir`; stop signals
`oncurve.run.stopping`; stage timing `oncurve.loop.timer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch

from oncurve import distributed
from oncurve.algo.kl import warmup_beta
from oncurve.config import Config, build_config, to_dict
from oncurve.errors import TrainingError
from oncurve.loop.collect import (
    Sampled,
    group_rows,
    sample_groups,
    sampling_params,
)
from oncurve.loop.evaluate import evaluate
from oncurve.loop.preflight import run_preflight
from oncurve.loop.progress import Progress, guarded_output
from oncurve.loop.reward_signal import DeadStepWatch, check_gold_answers
from oncurve.loop.timer import Timer, cuda_peak_reader
from oncurve.model.devices import resolve_device
from oncurve.model.saving import save_final, save_lora_final, trained_generation
from oncurve.rewards.registry import ANSWER_MATCH_REWARDS
from oncurve.rewards.runner import runner_settings
from oncurve.run import checkpoint, oom
from oncurve.run.metrics import log_samples
from oncurve.run.oom import OutOfMemoryStop
from oncurve.run.session import Session
from oncurve.run.settle import memory_settings
from oncurve.run.setup import setup
from oncurve.run.stopping import StopRequest, stop_on_signals
from oncurve.types import RolloutBatch, TrainBatch
from oncurve.update.determinism import deterministic_kernels
from oncurve.update.step import LossFns, masked_mean, optimizer_step, releasing_gradients

__all__ = ["Session", "TrainResult", "setup", "train", "training_step"]

T = TypeVar("T")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None


def training_step(s: Session, step: int) -> dict[str, float]:
    """One GRPO step (PPO when the advantage source is a critic); returns its metrics."""
    cfg = s.config
    s.counts.begin_step()
    lr = s.scheduler.get_last_lr()[0]  # this step's: `update_policy` steps the schedule
    timer = _step_timer(s.device)
    # a sampler's cache not kept between steps is freed here, before the update's peak
    with s.policy.whole(), s.sampler.scratch() if not cfg.rollout.keep_cache else nullcontext():
        sampled = sample_groups(s, step, timer)  # sample and score
    batch = train_batch(sampled.rollout)
    if cfg.algo.beta > 0:
        with timer("reference"):
            frozen_copy = s.policy.reference is not None
            reference = partial(s.policy.reference_logprobs, batch)
            batch.ref_logprobs = s.recovering(oom.reference_forward(frozen_copy), reference)
    with timer("train"):
        if cfg.algo.mu * cfg.algo.minibatches > 1:
            old = partial(s.policy.logprobs, batch)
            batch.old_logprobs = s.recovering(oom.OLD_POLICY_FORWARD, old)
        batch.advantages, advantage_metrics = s.advantage.advantages(batch, sampled.rewards)
        minibatches = minibatch_rows(s, batch)
        beta = warmup_beta(step, s.loss_fns.beta, cfg.algo.beta_warmup_steps)
        update = update_policy(s, batch, minibatches, dataclasses.replace(s.loss_fns, beta=beta))
        if cfg.algo.ref_sync_every and step % cfg.algo.ref_sync_every == 0:
            s.policy.sync_reference()
        if s.advantage.trains:
            # the policy's gradients (kept after the update off CUDA, `releasing_gradients`)
            # would be dead weight at the source's backward, which is PPO's peak
            s.optimizer.zero_grad(set_to_none=True)
        advantage_metrics |= s.advantage.update(batch, minibatches)
    s.settle_settings()
    s.counts.completion_tokens += int(distributed.all_sum([float(sampled.tokens)])[0])
    log_samples(
        s.logger,
        step,
        sampled.rollout,
        sampled.rewards,
        sampled.rows,
        cfg.log.samples_per_step,
        s.tokenizer.decode,
    )
    return step_metrics(s, sampled, batch.advantages, update | advantage_metrics, lr, beta, timer)


def _step_timer(device: torch.device) -> Timer:
    """A step's phase timer; on CUDA it waits for the device and reads each phase's peak,
    counted from here."""
    if device.type != "cuda":
        return Timer(None, None)
    torch.cuda.reset_peak_memory_stats(device)
    return Timer(partial(torch.cuda.synchronize, device), cuda_peak_reader(device))


def step_metrics(
    s: Session,
    sampled: Sampled,
    advantages: torch.Tensor,
    update: dict[str, float],
    lr: float,
    beta: float,
    timer: Timer,
) -> dict[str, float]:
    """A step's metrics: the sampling's and the rollout's, the update's, the step's learning
    rate (and KL weight, while it warms up), the sampler's and memory's, times and tokens."""
    cfg = s.config
    metrics = {
        **sampled.metrics,
        **rollout_metrics(sampled.rollout, advantages),
        **update,
        "lr": lr,
        **{f"time/{k}": v for k, v in timer.seconds.items()},
    }
    if cfg.algo.beta_warmup_steps:
        metrics["kl/beta"] = beta
    metrics["rollout/graphs"] = float(cfg.rollout.cuda_graphs)
    metrics["rollout/compiled"] = float(cfg.rollout.compile)
    metrics |= s.sampler.metrics()  # this process's totals: what a run pays up front
    metrics["memory/oom_retries"] = float(s.counts.oom_retries)
    metrics["time/step"] = sum(timer.seconds.values())
    if s.device.type == "cuda":
        metrics["memory/gpu_peak_gb"] = timer.overall_peak() / 2**30
        # which phase peaks, to hold against the memory plan's sampling, reference and update
        metrics |= {f"memory/{k}_peak_gb": v / 2**30 for k, v in timer.peak_bytes.items()}
    metrics["tokens_per_s"] = sampled.tokens / metrics["time/step"]
    metrics["tokens/total"] = float(s.counts.completion_tokens)
    return metrics


def train_batch(rollout: RolloutBatch) -> TrainBatch:
    """The rollout as the update reads it; advantages are filled in once known. Each row's
    group is its prompt's index (`ForwardSettings.share_prompt` says whether the forward runs
    a group's prompt once)."""
    rows = torch.arange(rollout.num_rows, device=rollout.input_ids.device)
    return TrainBatch(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        completion_mask=rollout.loss_mask,
        advantages=torch.zeros(rollout.num_rows, device=rollout.input_ids.device),
        sample_logprobs=rollout.logprobs,
        prompt_index=rows // rollout.group_size,
    )


def update_policy(
    s: Session, batch: TrainBatch, minibatches: list[torch.Tensor], fns: LossFns
) -> dict[str, float]:
    """mu passes over the batch, each `algo.minibatches` (m) optimizer steps of the objective
    `fns` (the session's, with this step's KL weight), each redone in smaller microbatches
    after running out of memory (`oom.UPDATE`). Non-finite updates are skipped and counted.

    The minibatches split the global batch, not each rank's part of it: with every rank holding
    g groups, rank r's group j is global group i = r * g + j, and group i goes to minibatch
    i mod m. Every rank thus takes the same m steps, each on its share of the minibatch, and the
    updates are those of one process for any number of ranks (when they sample alike). Sizes
    differ by at most one group. A rank with no rows in a minibatch would skip the backward whose
    gradient all-reduce the others wait in, so `setup` requires m <= B / W; only dynamic sampling
    short of groups (g < m, `sample_groups`) is left, and then a pass is g steps of one group a
    rank.
    """
    cfg = s.config
    results: list[dict[str, float]] = []
    # the failed attempt's gradients are discarded
    discard_gradients = partial(s.optimizer.zero_grad, set_to_none=False)
    with releasing_gradients(s.policy.trainable()):
        for _ in range(cfg.algo.mu):
            for rows in minibatches:
                step = partial(_optimizer_step, s, batch.rows(rows), fns)
                stats = s.recovering(oom.UPDATE, step, on_retry=discard_gradients)
                counts = s.counts
                counts.updates_this_step += 1
                counts.skipped_in_a_row = (
                    counts.skipped_in_a_row + 1 if stats["updates/skipped"] else 0
                )
                results.append(stats)
    with warnings.catch_warnings():
        # The schedule counts training steps, skipped updates included, so that a resumed run
        # and an uninterrupted one agree; torch warns when the first optimizer step was skipped.
        warnings.filterwarnings(
            "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
        )
        s.scheduler.step()
    if s.counts.skipped_in_a_row >= cfg.run.max_skipped_steps:
        raise TrainingError(
            f"{s.counts.skipped_in_a_row} consecutive updates had a non-finite loss or gradient norm; "
            "stopping (lower optim.lr, check the rewards, or raise run.max_skipped_steps)"
        )
    return _merged_updates(results)


def _optimizer_step(s: Session, minibatch: TrainBatch, fns: LossFns) -> dict[str, float]:
    """`optimizer_step` with the session's policy and its forward settings as they are now
    (smaller after running out of memory)."""
    return optimizer_step(
        s.policy.train_forward,
        s.optimizer,
        minibatch,
        fns,
        s.policy.forward,
        grad_clip=s.config.optim.grad_clip,
    )


def _merged_updates(results: list[dict[str, float]]) -> dict[str, float]:
    """The optimizer steps' statistics as one: means, the ratio's extremes, skips counted."""
    merged = {key: sum(r[key] for r in results) / len(results) for key in results[0]}
    merged["ratio/min"] = min(r["ratio/min"] for r in results)
    merged["ratio/max"] = max(r["ratio/max"] for r in results)
    merged["updates/skipped"] = sum(r["updates/skipped"] for r in results)
    return merged


def minibatch_groups(
    groups: int, minibatches: int, rank: int, device: torch.device | None = None
) -> list[torch.Tensor]:
    """This rank's group indices (each `[<= ceil(groups / parts)]`, ascending) in each of the
    parts = min(minibatches, groups) minibatches of a pass, every rank holding `groups` groups:
    global group i = rank * groups + j goes to minibatch i mod parts (see `update_policy`)."""
    parts = min(minibatches, groups)
    first = rank * groups
    return [torch.arange((k - first) % parts, groups, parts, device=device) for k in range(parts)]


def minibatch_rows(s: Session, batch: TrainBatch) -> list[torch.Tensor]:
    """`[rows]` indices of this rank's rows in each minibatch of a pass (`minibatch_groups`)."""
    group_size = s.config.rollout.group_size
    parts = minibatch_groups(
        batch.num_rows // group_size, s.config.algo.minibatches, s.rank, batch.input_ids.device
    )
    return [group_rows(groups, group_size) for groups in parts]


def rollout_metrics(rollout: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
    """Advantage and length statistics of the batch trained on; `advantages` is `[N]` or, from
    a critic, `[N, T]` (then averaged over completion tokens)."""
    if advantages.dim() == 2:
        adv_abs_mean = float(masked_mean(advantages.abs(), rollout.completion_mask))
    else:
        adv_abs_mean = float(advantages.abs().mean())
    lengths = rollout.completion_lengths.float()
    return {
        "adv/abs_mean": adv_abs_mean,
        "length/mean": float(lengths.mean()),
        "length/max": float(lengths.max()),
        "length/truncated_frac": sum(r == "length" for r in rollout.finish_reasons)
        / rollout.num_rows,
    }


def train(config: Config, *, quiet: bool = False) -> TrainResult:
    """Run GRPO as configured; returns the run directory and held-out accuracy before/after."""
    cuda = resolve_device(config.run.device).type == "cuda"
    with deterministic_kernels(cuda and config.run.deterministic):
        return _train(config, quiet)


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
        s = setup(config)
        cfg = s.config
        stop.where = f"before step {s.start_step + 1}"
        _stop_before_the_loop(s, stop)
        if cfg.run.preflight and s.start_step == 0:
            _check_gold(s)
            _preflight(s)
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
                metrics = distributed.all_mean(training_step(s, step))
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
                    return TrainResult(s.run_dir, step, eval_before, None)
        # a signal during the last step's save, or the final evaluation: the last step's
        # checkpoint stands, and a resume evaluates and writes final/
        stop.where = "after the final evaluation"
        if _agreed_stop(stop):
            _say_stopped(s, cfg.run.steps)
            s.logger.close()
            return TrainResult(s.run_dir, cfg.run.steps, eval_before, None)
        if s.eval_data is not None and cfg.eval.at_start_end:
            eval_after = _evaluate(s, step=cfg.run.steps)
            if _agreed_stop(stop):
                _say_stopped(s, cfg.run.steps)
                s.logger.close()
                return TrainResult(s.run_dir, cfg.run.steps, eval_before, eval_after)
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
                    generation = trained_generation(policy, **sampling)
                    save_final(policy, s.tokenizer, s.run_dir / "final", generation)
        elif s.rank == 0:
            peft_model = s.policy.peft_model
            save_lora_final(
                peft_model,
                s.tokenizer,
                s.run_dir / "final",
                cfg.model.lora.save_adapter,
                trained_generation(peft_model, **sampling),
            )
        s.logger.close()
        if eval_before and eval_after:
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
    """`oncurve.loop.reward_signal.check_gold_answers` on a dataset run scored by the `correct`
    reward (a built-in task's rows are made with their answers)."""
    cfg = s.config
    if cfg.data.path is None or s.correct not in ANSWER_MATCH_REWARDS:
        return
    line = check_gold_answers(s.data.rows, s.correct, cfg.data.answer_field)
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
        result = s.recovering(oom.EVALUATION, partial(_evaluation, s), on_retry=s.sampler.release)
    s.settle_settings()
    s.logger.log(step, {f"eval/{k}": v for k, v in result.items()})
    return result


def _evaluation(s: Session) -> dict[str, float]:
    cfg = s.config
    return evaluate(
        s.sampler,
        s.eval_data.rows[: cfg.eval.num_prompts],
        s.correct,
        max_new_tokens=cfg.rollout.max_new_tokens,
        samples=cfg.eval.samples,
        temperature=cfg.rollout.temperature,
        seed=cfg.run.seed,
        batch_size=cfg.eval.batch_rows,
        episodes=s.episodes,
        **runner_settings(cfg.reward),
    )
