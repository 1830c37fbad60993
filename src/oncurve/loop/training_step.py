"""One GRPO step (PPO when the advantage source is a critic): sample groups, score them, turn
rewards into advantages, update the policy, and the step's metrics.

`training_step` is the algorithm, one line per stage; `update_policy` its update: mu passes of
`algo.minibatches` optimizer steps over the global batch. What a step simplifies: one sampler
and the trainer share the weights (no weight sync), rewards are scored on the CPU, and the
advantage source (group statistics, or PPO's critic) is the only place the algorithms differ
outside the loss. The run around the steps is `oncurve.loop.trainer`; stage timing
`oncurve.loop.timer`.
"""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import nullcontext
from functools import partial

import torch

from oncurve import distributed
from oncurve.algo.kl import warmup_beta
from oncurve.errors import TrainingError
from oncurve.loop.collect import Sampled, group_rows, sample_groups
from oncurve.loop.timer import Timer, cuda_peak_reader
from oncurve.rewards.runner import logged_metrics
from oncurve.run import oom
from oncurve.run.metrics import log_samples
from oncurve.run.session import Session
from oncurve.types import RolloutBatch, TrainBatch
from oncurve.update.step import LossFns, masked_mean, optimizer_step, releasing_gradients


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
        sampled.extra,
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
    rate (and KL weight, while it warms up), the sampler's and memory's, times and tokens, and
    the metrics the rewards logged, each under a name of its own (`logged_metrics`)."""
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
    return metrics | logged_metrics(sampled.scores, metrics)


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
    a critic, `[N, T]` (then averaged over the tokens with a loss)."""
    if advantages.dim() == 2:
        # over the tokens that have a loss: a multi-turn episode's observations have none
        adv_abs_mean = float(masked_mean(advantages.abs(), rollout.loss_mask))
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
