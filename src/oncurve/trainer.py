"""The GRPO loop: sample groups, score, standardise within groups, update with clipped ratios.

`training_step` is the algorithm, one call per stage; `train` wraps it with set-up, logging,
evaluation, checkpoints and signals. Everything it calls is testable alone.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import sys
import time
import warnings
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from oncurve import checkpoint, distributed, ppo
from oncurve.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    lookup,
)
from oncurve.config import Config, build_config, save_config, to_dict
from oncurve.errors import TrainingError, UserError
from oncurve.evaluate import evaluate
from oncurve.inputs import (
    PromptData,
    build_rewards,
    correctness_fn,
    group_columns,
    load_prompts,
)
from oncurve.memory import (
    CPU_MICROBATCH_ROWS,
    DEFAULT_LOGITS_CHUNK,
    MemoryPlan,
    ModelShape,
    device_budget,
    plan_memory,
)
from oncurve.metrics import MetricsLogger, truncate_after
from oncurve.models import (
    add_lora,
    cap_gpu_memory,
    enable_gradient_checkpointing,
    frozen_copy,
    load_model,
    load_tokenizer,
    microbatch_tokens,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
    save_final,
    save_lora_final,
)
from oncurve.optim import AdamW as StochasticRoundingAdamW
from oncurve.preflight import run_preflight
from oncurve.progress import Progress
from oncurve.rewards.runner import RewardResult, RewardRunner
from oncurve.rollout import SamplingParams, TorchSampler
from oncurve.rollout.base import check_room
from oncurve.train_step import (
    LossFns,
    PolicyLogprobs,
    batch_logprobs,
    masked_mean,
    optimizer_step,
)
from oncurve.types import RolloutBatch, TrainBatch


@dataclass
class Session:
    """Everything one run holds between steps."""

    config: Config
    run_dir: Path
    device: torch.device
    model: torch.nn.Module  # the trained HF model; under FSDP2 its parameters are shards
    # whole weights: `model` itself, or under FSDP2 a copy that holds them only inside `_whole`
    full_model: torch.nn.Module
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    peft_model: torch.nn.Module | None
    tokenizer: Any
    sampler: TorchSampler
    data: PromptData
    eval_data: PromptData | None
    rewards: RewardRunner
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_fns: LossFns
    logger: MetricsLogger
    start_step: int = 0
    completion_tokens: int = 0  # sampled so far, every rank's, checkpointed with the step
    skipped_in_a_row: int = 0
    stop_requested: bool = False
    rank: int = 0
    world_size: int = 1
    correct: Any = None
    critic: ppo.Critic | None = None
    microbatch_tokens: int = 0  # `optim.microbatch_tokens` resolved for the model; 0 no cap


@dataclass
class Sampled:
    """This rank's scored groups for one training step (see `sample_groups`).

    Attributes:
        rollout: the g kept groups, N = g*G rows; g is the same on every rank.
        rewards: `[N]` their total rewards, NaN where a row has none.
        rows: the g dataset rows, one per group, in the rollout's order.
        metrics: what was sampled and what was kept (see `sample_groups`).
        tokens: completion tokens sampled on this rank in every round, kept or not.
    """

    rollout: RolloutBatch
    rewards: torch.Tensor
    rows: list[dict]
    metrics: dict[str, float]
    tokens: int


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None


def training_step(s: Session, step: int) -> dict[str, float]:
    """One GRPO step (PPO when there is a critic); returns its metrics. The stages, in order,
    as in DESIGN.md."""
    cfg = s.config
    timer = _Timer()
    if s.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(s.device)
    with _whole(s):
        sampled = sample_groups(s, step, timer)
    rollout, rewards = sampled.rollout, sampled.rewards
    if s.critic is None:
        advantages = lookup(ADVANTAGE_ESTIMATORS, cfg.algo.estimator)(
            rewards,
            rollout.group_size,
            scale=cfg.algo.adv_scale,
            eps=cfg.algo.adv_eps,
            batch_std=distributed.batch_std(rewards) if s.world_size > 1 else None,
        )
    else:
        # Per token, set below from the critic's values once pi_ref's logprobs are known.
        advantages = torch.zeros_like(rollout.logprobs)
    batch = TrainBatch(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        completion_mask=rollout.completion_mask,
        advantages=advantages,
        sample_logprobs=rollout.logprobs,
        prompt_index=_prompt_index(cfg, rollout),
    )
    lr = s.scheduler.get_last_lr()[0]
    critic_metrics: dict[str, float] = {}
    if cfg.algo.beta > 0:
        with timer("reference"):
            batch.ref_logprobs = reference_logprobs(s, batch)
    with timer("train"):
        if cfg.algo.mu * cfg.algo.minibatches > 1:
            batch.old_logprobs = batch_logprobs(
                s.policy,
                batch,
                cfg.rollout.temperature,
                cfg.model.logprob_chunk_size,
                cfg.optim.microbatch_size,
                s.microbatch_tokens,
            )
        if s.critic is not None:
            batch.advantages, targets, critic_metrics = ppo.estimate_advantages(
                s.critic,
                batch,
                rewards,
                kl_coef=cfg.algo.beta if cfg.algo.kl_in_reward else 0.0,
                kl_fn=s.loss_fns.kl,
                rows=cfg.optim.microbatch_size,
                max_tokens=s.microbatch_tokens,
            )
        update = optimise(s, batch)
        if (
            s.reference is not None
            and cfg.algo.ref_sync_every
            and step % cfg.algo.ref_sync_every == 0
        ):
            with _whole(s) as policy:
                s.reference.load_state_dict(policy.state_dict())
        if s.critic is not None:
            # The policy's gradients (kept between its steps) would be dead weight at the
            # critic's backward, which is PPO's peak.
            s.optimizer.zero_grad(set_to_none=True)
            critic_metrics |= ppo.optimise_critic(
                s.critic,
                batch,
                targets,
                passes=cfg.algo.mu,
                minibatches=_minibatch_rows(s, batch),
                microbatch_size=cfg.optim.microbatch_size,
                microbatch_tokens=s.microbatch_tokens,
            )
    metrics = {
        **sampled.metrics,
        **rollout_metrics(rollout, batch.advantages),
        **update,
        **critic_metrics,
        "lr": lr,
        **{f"time/{k}": v for k, v in timer.seconds.items()},
    }
    metrics["time/step"] = sum(timer.seconds.values())
    if s.device.type == "cuda":
        metrics["memory/gpu_peak_gb"] = torch.cuda.max_memory_allocated(s.device) / 2**30
    metrics["tokens_per_s"] = sampled.tokens / metrics["time/step"]
    s.completion_tokens += int(distributed.all_sum([float(sampled.tokens)])[0])
    metrics["tokens/total"] = float(s.completion_tokens)
    _log_samples(s, step, rollout, rewards, sampled.rows)
    return metrics


def reference_logprobs(s: Session, batch: TrainBatch) -> torch.Tensor:
    """`[N, T]` logprobs under pi_ref: the frozen copy, or with LoRA the same weights with the
    adapter switched off."""
    cfg = s.config
    args = (
        batch,
        cfg.rollout.temperature,
        cfg.model.logprob_chunk_size,
        cfg.optim.microbatch_size,
        s.microbatch_tokens,
    )
    if s.peft_model is None:
        return batch_logprobs(PolicyLogprobs(s.reference), *args)
    with s.peft_model.disable_adapter():
        return batch_logprobs(s.policy, *args)


def sample_groups(s: Session, step: int, timer: _Timer) -> Sampled:
    """This rank's share of the step's groups, scored: B / W prompts x G completions (W ranks).

    With dynamic sampling (DAPO), a group is kept only when its filter scores differ: those of
    the runner's verifier (the correctness reward, as DAPO filters on accuracy) when the run has
    one, else the total reward. Rounds of fresh prompts follow, up to `algo.max_resample` more,
    while any rank holds fewer than its B / W groups: the decision is collective, so every rank
    leaves at the same round (a rank already full samples nothing meanwhile). A rank still short
    after the last round leaves every rank with the fewest groups any rank holds, so that all
    ranks run the same optimizer steps (`optimise`); none at all is an error on every rank.

    Metrics: `reward/*` and `groups/all_equal_frac` (groups whose finite total rewards are all
    equal) cover every group sampled, in every round. With dynamic sampling also
    `kept/reward_mean` and `kept/reward_std` (the rows kept for the update), `kept/groups` (every
    rank's), `groups/dropped` (by the filter, this rank) and `groups/sampling_rounds`.
    """
    cfg = s.config
    group_size, prompts = cfg.rollout.group_size, cfg.data.prompts_per_step
    mine = distributed.shard(prompts, s.rank, s.world_size)
    share = mine.stop - mine.start
    dynamic = cfg.algo.dynamic_sampling
    rounds_per_step = 1 + cfg.algo.max_resample if dynamic else 1
    results: list[RewardResult] = []
    kept: list[tuple[RolloutBatch, torch.Tensor, list[dict]]] = []
    kept_groups = dropped = tokens = fewest = rounds = 0
    while rounds < rounds_per_step and fewest < share:
        if kept_groups < share:
            rows = s.data.batch(step, prompts, rounds, rounds_per_step)[mine]
            params = _sampling_params(cfg, seed=_step_seed(cfg.run.seed, step, rounds, s.rank))
            with timer("rollout"):
                rollout = s.sampler.generate_ids(
                    [r["prompt_ids"] for r in rows], group_size, params
                )
            with timer("reward"):
                scored = s.rewards.score(*_reward_inputs(rows, rollout, group_size))
            results.append(scored)
            tokens += int(rollout.completion_mask.sum())
            # Rewards are scored on the CPU; the advantages they become index the rollout's rows.
            total = scored.total.to(rollout.completion_ids.device)
            if dynamic:
                verdicts = (
                    total
                    if scored.verifier_scores is None
                    else scored.verifier_scores.to(total.device)
                )
                informative = _informative_groups(verdicts, group_size)
                dropped += int((~informative).sum())
                keep = informative.nonzero().flatten()[: share - kept_groups]
                if len(keep):
                    index = _group_rows(keep, group_size)
                    kept.append(
                        (rollout.select(index), total[index], [rows[i] for i in keep.tolist()])
                    )
                    kept_groups += len(keep)
            else:
                kept.append((rollout, total, rows))
                kept_groups = share
        rounds += 1
        # Every rank learns the fewest groups any rank holds, in every round: ranks that stopped
        # sampling at different rounds would take their collectives out of step.
        fewest = int(distributed.all_min([float(kept_groups)])[0]) if dynamic else kept_groups
    if fewest == 0:
        raise TrainingError(
            f"dynamic sampling found no group whose {_filter_name(s.rewards)} rewards differ on "
            f"some rank in {rounds} rounds; raise algo.max_resample or check the reward"
        )
    rollout = RolloutBatch.concat([b for b, _, _ in kept], s.tokenizer.pad_token_id)
    rewards = torch.cat([r for _, r, _ in kept])
    rows = [row for _, _, rs in kept for row in rs][:fewest]
    if fewest < kept_groups:
        index = torch.arange(fewest * group_size, device=rewards.device)
        rollout, rewards = rollout.select(index), rewards[index]
    every_round = s.rewards.concat(results)
    metrics = {**every_round.metrics, **reward_metrics(every_round.total, group_size)}
    if dynamic:
        mean, std = _mean_std(rewards)
        metrics |= {
            "kept/reward_mean": mean,
            "kept/reward_std": std,
            "kept/groups": float(fewest * s.world_size),
            "groups/dropped": float(dropped),
            "groups/sampling_rounds": float(rounds),
        }
    return Sampled(rollout, rewards, rows, metrics, tokens)


def optimise(s: Session, batch: TrainBatch) -> dict[str, float]:
    """mu passes over the batch, each `algo.minibatches` (m) optimizer steps; gradient
    accumulation inside `accumulate_gradients`. Non-finite updates are skipped and counted.

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
    minibatches = _minibatch_rows(s, batch)
    results: list[dict[str, float]] = []
    for _ in range(cfg.algo.mu):
        for rows in minibatches:
            stats = optimizer_step(
                s.policy,
                s.optimizer,
                batch.rows(rows),
                s.loss_fns,
                microbatch_size=cfg.optim.microbatch_size,
                microbatch_tokens=s.microbatch_tokens,
                grad_clip=cfg.optim.grad_clip,
            )
            s.skipped_in_a_row = s.skipped_in_a_row + 1 if stats["updates/skipped"] else 0
            results.append(stats)
    with warnings.catch_warnings():
        # The schedule counts training steps, skipped updates included, so that a resumed run
        # and an uninterrupted one agree; torch warns when the first optimizer step was skipped.
        warnings.filterwarnings(
            "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
        )
        s.scheduler.step()
    merged = {key: sum(r[key] for r in results) / len(results) for key in results[0]}
    merged["ratio/min"] = min(r["ratio/min"] for r in results)
    merged["ratio/max"] = max(r["ratio/max"] for r in results)
    merged["updates/skipped"] = sum(r["updates/skipped"] for r in results)
    if s.skipped_in_a_row >= cfg.run.max_skipped_steps:
        raise TrainingError(
            f"{s.skipped_in_a_row} consecutive updates had a non-finite loss or gradient norm; "
            "stopping (lower optim.lr, check the rewards, or raise run.max_skipped_steps)"
        )
    return merged


def minibatch_groups(
    groups: int, minibatches: int, rank: int, device: torch.device | None = None
) -> list[torch.Tensor]:
    """This rank's group indices (each `[<= ceil(groups / parts)]`, ascending) in each of the
    parts = min(minibatches, groups) minibatches of a pass, every rank holding `groups` groups:
    global group i = rank * groups + j goes to minibatch i mod parts (see `optimise`)."""
    parts = min(minibatches, groups)
    first = rank * groups
    return [torch.arange((k - first) % parts, groups, parts, device=device) for k in range(parts)]


def _group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[len(groups) * G]` the rows of `groups` `[g]`, a group's G rows contiguous."""
    return (groups[:, None] * group_size + torch.arange(group_size, device=groups.device)).flatten()


def _minibatch_rows(s: Session, batch: TrainBatch) -> list[torch.Tensor]:
    """`[rows]` indices of this rank's rows in each minibatch of a pass (`minibatch_groups`)."""
    group_size = s.config.rollout.group_size
    parts = minibatch_groups(
        batch.num_rows // group_size, s.config.algo.minibatches, s.rank, batch.input_ids.device
    )
    return [_group_rows(groups, group_size) for groups in parts]


def reward_metrics(rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """Mean and std of the finite rewards `[N]` and the fraction of groups whose finite rewards
    are all equal (no gradient)."""
    mean, std = _mean_std(rewards)
    all_equal = ~_informative_groups(rewards, group_size)
    return {
        "reward/mean": mean,
        "reward/std": std,
        "groups/all_equal_frac": float(all_equal.float().mean()),
    }


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


def _mean_std(rewards: torch.Tensor) -> tuple[float, float]:
    """Mean and population std of the finite values of `rewards` `[N]`; NaN when none is."""
    finite = rewards[torch.isfinite(rewards)]
    if not len(finite):
        return math.nan, math.nan
    return float(finite.mean()), float(finite.std(unbiased=False))


def _filter_name(rewards: RewardRunner) -> str:
    """What dynamic sampling compares within a group: the verifier's name, or "total"."""
    return "total" if rewards.verifier is None else repr(rewards.verifier)


def train(config: Config, *, quiet: bool = False) -> TrainResult:
    """Run GRPO as configured; returns the run directory and held-out accuracy before/after."""
    cuda = resolve_device(config.run.device).type == "cuda"
    with _deterministic_kernels(cuda and config.run.deterministic):
        return _train(config, quiet)


@contextmanager
def _deterministic_kernels(enabled: bool):
    """Deterministic kernels for the duration, then torch's previous setting. Atomic-add
    kernels (attention's backward, scatters) sum in a varying order on CUDA, and cuBLAS needs a
    fixed workspace, set before its first call in the process, to repeat its sums."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _train(config: Config, quiet: bool) -> TrainResult:
    s = setup(config)
    cfg = s.config
    if cfg.run.preflight and s.start_step == 0:
        _preflight(s)
    eval_before = eval_after = None
    if s.eval_data is not None and cfg.eval.at_start_end and s.start_step == 0:
        eval_before = _evaluate(s, step=0)
    progress = Progress(cfg.run.steps, s.start_step, quiet, enabled=s.rank == 0)
    with s.rewards, _stop_on_signals(s), progress:
        for step in range(s.start_step + 1, cfg.run.steps + 1):
            metrics = distributed.all_mean(training_step(s, step))
            s.logger.log(step, metrics)
            progress.update(step, metrics)
            # Every rank must agree to stop at the same step, or the next collective hangs.
            s.stop_requested = distributed.all_sum([float(s.stop_requested)])[0] > 0
            if (
                s.eval_data is not None
                and cfg.eval.every
                and step % cfg.eval.every == 0
                # the last step's evaluation is at_start_end's, when that is on
                and (step < cfg.run.steps or not cfg.eval.at_start_end)
            ):
                _evaluate(s, step)
            if (
                step == cfg.run.steps
                or s.stop_requested
                or (cfg.run.save_every and step % cfg.run.save_every == 0)
            ):
                _save(s, step)
            if s.stop_requested:
                print(
                    f"stopped at step {step} on request; resume with run.resume=auto "
                    f"run.dir={s.run_dir}",
                    file=sys.stderr,
                )
                s.logger.close()
                return TrainResult(s.run_dir, step, eval_before, None)
    if s.eval_data is not None and cfg.eval.at_start_end:
        eval_after = _evaluate(s, step=cfg.run.steps)
    if s.peft_model is None:
        with _whole(s) as policy:
            if s.rank == 0:
                save_final(policy, s.tokenizer, s.run_dir / "final")
    elif s.rank == 0:
        save_lora_final(s.peft_model, s.tokenizer, s.run_dir / "final", cfg.model.lora.save_adapter)
    s.logger.close()
    if eval_before and eval_after:
        print(
            f"held-out greedy accuracy: {eval_before['accuracy']:.1%} before, "
            f"{eval_after['accuracy']:.1%} after {cfg.run.steps} steps",
            file=sys.stderr,
        )
    return TrainResult(s.run_dir, cfg.run.steps, eval_before, eval_after)


def setup(config: Config) -> Session:
    """Build the session: run directory, model(s), data, rewards, optimizer; resume if asked."""
    device = resolve_device(config.run.device)
    rank, world_size = distributed.init_distributed(device.type, config.dist.timeout_s)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # torchrun's LOCAL_RANK
        if config.run.gpu_memory_gb is not None:
            cap_gpu_memory(device, config.run.gpu_memory_gb)
    mine = distributed.shard(config.data.prompts_per_step, rank, world_size)
    if config.algo.minibatches > mine.stop - mine.start:
        raise UserError(
            f"algo.minibatches must be at most data.prompts_per_step per rank "
            f"({config.data.prompts_per_step} / {world_size} = {mine.stop - mine.start}), "
            f"got {config.algo.minibatches}"
        )
    run_dir, resume_from = _prepare_run_dir(config, rank)
    if config.run.threads:
        torch.set_num_threads(config.run.threads)
    torch.manual_seed(config.run.seed)
    model_path = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(model_path, config.model.trust_remote_code)
    train_rows, eval_rows, task = load_prompts(config)
    data = PromptData(train_rows, tokenizer, config.data, seed=config.run.seed)
    eval_data = (
        PromptData(eval_rows, tokenizer, config.data, seed=config.run.seed) if eval_rows else None
    )
    prompts = data.rows + (eval_data.rows if eval_data is not None else [])
    longest = max(len(row["prompt_ids"]) for row in prompts)
    # the run's config.yaml records what `auto` chose
    dtype = resolve_dtype(config.model.dtype, device)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype))
    model = load_model(model_path, dtype, device, config.model.trust_remote_code)
    check_room(longest, config.rollout.max_new_tokens, model.config)
    peft_model = add_lora(model, config.model.lora) if config.model.lora.r else None
    if peft_model is not None:
        model = peft_model.get_base_model()
    saved = checkpoint.read_state(resume_from).get("memory") if resume_from else None
    evaluates = eval_data is not None and (config.eval.at_start_end or config.eval.every > 0)
    seq_len = longest + config.rollout.max_new_tokens
    config, plan = _settle_memory(config, model, device, world_size, seq_len, saved, evaluates)
    if plan is not None and rank == 0:
        print(plan.describe(), file=sys.stderr)
        if not plan.fits:
            print(
                "warning: the predicted peak exceeds the memory budget; lower "
                "rollout.max_new_tokens or data.prompts_per_step, or train LoRA adapters",
                file=sys.stderr,
            )
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    reference = frozen_copy(model) if config.algo.beta > 0 and peft_model is None else None
    critic = (
        ppo.build_critic(model, config, device.type) if config.algo.estimator == "gae" else None
    )
    fsdp = config.dist.fsdp and world_size > 1
    # Under FSDP2 each rank holds shards of the trained weights; sampling, evaluation,
    # checkpoints and the final model read whole weights from a copy gathered for them and
    # emptied after (`_whole`), so the update's peak does not hold it.
    full_model = frozen_copy(model) if fsdp else model
    # before the optimizer: fully_shard replaces the parameters with sharded ones
    policy = distributed.wrap(PolicyLogprobs(model), device.type, fsdp=fsdp)
    trainable = [p for p in model.parameters() if p.requires_grad]
    # Gradients exist from the start, before any activation, and are zeroed in place after each
    # step (`train_step.optimizer_step`): made afresh amid each backward's activations they
    # fragment the heap. 30M model, 3 steps: peak RSS 1,337 -> 1,195 MB with checkpointing.
    for param in trainable:
        param.grad = torch.zeros_like(param)
    optimizer = _optimizer(trainable, config, sharded=fsdp)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config))
    loss_fns = LossFns(
        policy_loss=lookup(POLICY_LOSSES, config.algo.loss),
        aggregate=lookup(AGGREGATIONS, config.algo.loss_agg),
        kl=lookup(KL_ESTIMATORS, config.algo.kl_estimator),
        beta=0.0 if config.algo.kl_in_reward else config.algo.beta,
        eps_low=config.algo.epsilon,
        eps_high=config.epsilon_high,
        dual_clip=config.algo.dual_clip,
        temperature=config.rollout.temperature,
        norm_len=float(config.algo.norm_len or config.rollout.max_new_tokens),
        chunk_size=config.model.logprob_chunk_size,
    )
    s = Session(
        config=config,
        run_dir=run_dir,
        device=device,
        model=model,
        full_model=full_model,
        policy=policy,
        reference=reference,
        peft_model=peft_model,
        tokenizer=tokenizer,
        sampler=TorchSampler(full_model, tokenizer),
        data=data,
        eval_data=eval_data,
        rewards=build_rewards(config, task),
        optimizer=optimizer,
        scheduler=scheduler,
        loss_fns=loss_fns,
        logger=MetricsLogger(run_dir, tensorboard=config.log.tensorboard, enabled=rank == 0),
        correct=correctness_fn(config, task),
        rank=rank,
        world_size=world_size,
        critic=critic,
        microbatch_tokens=microbatch_tokens(model, config.optim.microbatch_tokens),
    )
    if config.algo.dynamic_sampling and rank == 0:
        print(
            f"dynamic sampling keeps the groups whose {_filter_name(s.rewards)} rewards differ"
            + ("" if s.rewards.verifier else " (no reward is the one evaluation calls correct)"),
            file=sys.stderr,
        )
    if resume_from is not None:
        state = checkpoint.load_checkpoint(
            resume_from,
            full_model,
            optimizer,
            scheduler,
            modules=_extra_modules(s),
            optimizers=_extra_optimizers(s),
            trainable_only=config.model.lora.r > 0,
        )
        if state.get("world_size", 1) != world_size:
            raise UserError(
                f"checkpoint {resume_from} was written by {state.get('world_size', 1)} ranks; "
                f"resume it with the same number, not {world_size}"
            )
        if fsdp:
            distributed.scatter_weights(full_model, model)
        s.start_step = int(state["step"])
        s.completion_tokens = int(state.get("completion_tokens", 0))
        if rank == 0:
            truncate_after(run_dir, s.start_step)
    if fsdp:
        distributed.release(full_model)
    if rank == 0:
        save_config(config, run_dir / "config.yaml")
    return s


def _optimizer(
    params: list[torch.nn.Parameter], config: Config, sharded: bool
) -> torch.optim.Optimizer:
    """AdamW: oncurve's, which rounds bfloat16 updates stochastically, where some weight is
    bfloat16 (and not an FSDP2 shard); torch's fused one otherwise."""
    o = config.optim
    settings = {"lr": o.lr, "betas": (o.beta1, o.beta2), "weight_decay": o.weight_decay}
    bf16 = any(p.dtype == torch.bfloat16 for p in params)
    if bf16 and o.stochastic_rounding and not sharded:
        return StochasticRoundingAdamW(params, seed=config.run.seed, **settings)
    # One kernel per parameter instead of a dozen elementwise passes: 4-5x faster steps on
    # CPU (1-3 s a step on a 30M model).
    return torch.optim.AdamW(params, fused=True, **settings)


def _settle_memory(
    config: Config,
    model: torch.nn.Module,
    device: torch.device,
    world_size: int,
    seq_len: int,
    saved: dict | None,
    evaluates: bool = False,
) -> tuple[Config, MemoryPlan | None]:
    """`config` with every memory setting the user left unset (null) filled in, and the plan
    that chose them on CUDA (None on the CPU, where the defaults are fixed). A resumed run takes
    the settings its checkpoint was written with (`saved`), so that it trains as the run did."""
    m, o = config.model, config.optim
    chosen = _memory_settings(config)
    for key, value in (saved or {}).items():
        if key in chosen and chosen[key] is None:
            chosen[key] = value
    plan = None
    if device.type == "cuda":
        rows_per_step = config.data.prompts_per_step * config.rollout.group_size // world_size
        # `evaluate` samples up to 256 rows at once
        eval_rows = min(256, config.eval.num_prompts * config.eval.samples) if evaluates else 0
        plan = plan_memory(
            ModelShape.of(model),
            seq_len=seq_len,
            rows_per_step=rows_per_step,
            sample_rows=max(rows_per_step, eval_rows),
            budget_bytes=device_budget(device, config.run.gpu_memory_gb),
            reference=config.algo.beta > 0 and not config.model.lora.r,
            critic=config.algo.estimator == "gae",
            microbatch_rows=chosen["microbatch_size"],
            gradient_checkpointing=chosen["gradient_checkpointing"],
            logprob_chunk_size=chosen["logprob_chunk_size"],
        )
        planned = {
            "gradient_checkpointing": plan.gradient_checkpointing,
            "logprob_chunk_size": plan.logprob_chunk_size,
            "microbatch_size": plan.microbatch_rows,
            "microbatch_tokens": plan.microbatch_tokens,
        }
    else:
        planned = {
            "gradient_checkpointing": False,
            "logprob_chunk_size": DEFAULT_LOGITS_CHUNK,
            "microbatch_size": CPU_MICROBATCH_ROWS,
            "microbatch_tokens": None,  # `models.microbatch_tokens` sizes it for the CPU
        }
    chosen = {key: planned[key] if value is None else value for key, value in chosen.items()}
    model_part = ("gradient_checkpointing", "logprob_chunk_size")
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(m, **{k: chosen[k] for k in model_part}),
        optim=dataclasses.replace(o, **{k: v for k, v in chosen.items() if k not in model_part}),
    )
    return config, plan


def _memory_settings(config: Config) -> dict:
    """The settings `_settle_memory` fills in, as a checkpoint keeps them."""
    return {
        "gradient_checkpointing": config.model.gradient_checkpointing,
        "logprob_chunk_size": config.model.logprob_chunk_size,
        "microbatch_size": config.optim.microbatch_size,
        "microbatch_tokens": config.optim.microbatch_tokens,
    }


def _preflight(s: Session) -> None:
    """`oncurve.preflight` on this rank's first two prompts of step 1; a failure stops the run
    before anything is trained."""
    cfg = s.config
    # the config as settled (auto and null filled in) passes every check of a loaded one
    build_config(to_dict(cfg))
    mine = distributed.shard(cfg.data.prompts_per_step, s.rank, s.world_size)
    with _whole(s):
        lines = run_preflight(
            policy=s.policy,
            sampler=s.sampler,
            rows=s.data.batch(1, cfg.data.prompts_per_step)[mine][:2],
            group_size=cfg.rollout.group_size,
            params=_sampling_params(cfg, seed=0),
            fns=s.loss_fns,
            trainable=[p for group in s.optimizer.param_groups for p in group["params"]],
            microbatch_size=cfg.optim.microbatch_size,
            microbatch_tokens=s.microbatch_tokens,
            chat_template=cfg.data.chat_template,
            dtype=next(s.model.parameters()).dtype,
            prompt_index=_shares_prompt_forward(cfg),
        )
    lines.insert(0, "preflight: settings valid, none of them a known silent no-op")
    if s.rank == 0:
        for line in lines:
            print(line, file=sys.stderr)


def _whole(s: Session) -> AbstractContextManager[torch.nn.Module]:
    """The policy with whole weights, for the duration (see `distributed.gathered`)."""
    return distributed.gathered(s.model, s.full_model)


def _save(s: Session, step: int) -> None:
    with _whole(s) as policy:
        checkpoint.save_checkpoint(
            s.run_dir,
            step,
            policy,
            s.optimizer,
            s.scheduler,
            {
                "step": step,
                "completion_tokens": s.completion_tokens,
                "world_size": s.world_size,
                "memory": _memory_settings(s.config),
            },
            keep_last=s.config.run.keep_last,
            modules=_extra_modules(s),
            optimizers=_extra_optimizers(s),
            trainable_only=s.config.model.lora.r > 0,
        )


def _extra_modules(s: Session) -> dict[str, torch.nn.Module]:
    modules: dict[str, torch.nn.Module] = {}
    # The reference only differs from the initial weights once it has been synced.
    if s.reference is not None and s.config.algo.ref_sync_every:
        modules["reference"] = s.reference
    if s.critic is not None:
        modules["value"] = s.critic.model
    return modules


def _extra_optimizers(s: Session) -> dict[str, torch.optim.Optimizer]:
    return {"value": s.critic.optimizer} if s.critic is not None else {}


def _evaluate(s: Session, step: int) -> dict[str, float]:
    cfg = s.config
    with _whole(s):
        result = evaluate(
            s.sampler,
            s.eval_data.rows[: cfg.eval.num_prompts],
            s.correct,
            max_new_tokens=cfg.rollout.max_new_tokens,
            samples=cfg.eval.samples,
            temperature=cfg.rollout.temperature,
            seed=cfg.run.seed,
        )
    s.logger.log(step, {f"eval/{k}": v for k, v in result.items()})
    return result


def _prepare_run_dir(config: Config, rank: int) -> tuple[Path, Path | None]:
    """The run directory and the checkpoint to resume from. Rank 0 checks and creates it; the
    other ranks wait for that (a barrier) and then only read."""
    run_dir, resume_from = _claim_run_dir(config) if rank == 0 else (None, None)
    if distributed.world()[1] > 1:
        shared = [str(run_dir), str(resume_from) if resume_from else ""]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_dir, resume_from = Path(shared[0]), Path(shared[1]) if shared[1] else None
    return run_dir, resume_from


# What a run (and `oncurve report` on it) writes: the only names a new run may delete.
_RUN_FILES = {
    "config.yaml",
    "metrics.jsonl",
    "samples.jsonl",
    "checkpoints",
    "tensorboard",
    "final",
    "report",
}


def _claim_run_dir(config: Config) -> tuple[Path, Path | None]:
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
        foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in _RUN_FILES)
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


def _lr_lambda(config: Config):
    warmup, total = config.optim.warmup_steps, config.run.steps
    cosine = config.optim.schedule == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def _sampling_params(config: Config, seed: int) -> SamplingParams:
    r = config.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        min_new_tokens=r.min_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        min_p=r.min_p,
        stop=tuple(r.stop),
        seed=seed,
    )


def _step_seed(seed: int, step: int, round_: int, rank: int) -> int:
    # A pure function of (seed, step, round, rank): resuming at step k samples exactly what an
    # uninterrupted run samples there, without saving any sampler state.
    return (seed * 1_000_003 + step * 1_009 + round_ * 101 + rank * 7_919_993) % (2**63)


def _reward_inputs(
    rows: list[dict], rollout: RolloutBatch, group_size: int
) -> tuple[list[str], list[str], dict[str, list]]:
    prompts, columns = group_columns(rows, group_size)
    columns["completion_lengths"] = rollout.completion_lengths.tolist()
    return prompts, rollout.texts, columns


def _shares_prompt_forward(cfg: Config) -> bool:
    """Whether the update runs each group's prompt once: not under gradient checkpointing (HF
    drops the KV cache there) or FSDP2 (its hooks expect one forward of each module per
    backward)."""
    m = cfg.model
    return m.share_prompt_forward and not m.gradient_checkpointing and not cfg.dist.fsdp


def _prompt_index(cfg: Config, rollout: RolloutBatch) -> torch.Tensor | None:
    """`[N]` group number of each row (a group's rows share a prompt), or None when the
    prompt forward is not shared (`_shares_prompt_forward`)."""
    if not _shares_prompt_forward(cfg):
        return None
    rows = torch.arange(rollout.num_rows, device=rollout.input_ids.device)
    return rows // rollout.group_size


def _informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[B]` True where a group's finite rewards are not all equal (it has a gradient)."""
    grouped = rewards.view(-1, group_size)
    finite = torch.isfinite(grouped)
    high = torch.where(finite, grouped, -torch.inf).max(1).values
    low = torch.where(finite, grouped, torch.inf).min(1).values
    return high > low


def _log_samples(
    s: Session, step: int, rollout: RolloutBatch, rewards: torch.Tensor, rows: list[dict]
) -> None:
    count = min(s.config.log.samples_per_step, rollout.num_rows)
    if not count:
        return
    group_size = rollout.group_size
    picks = torch.linspace(0, rollout.num_rows - 1, count).long().tolist()
    s.logger.log_samples(
        step,
        [
            {
                "prompt": rows[i // group_size]["prompt"],
                "completion": rollout.texts[i],
                "reward": float(rewards[i]),
                "answer": rows[i // group_size].get("answer"),
            }
            for i in picks
        ],
    )


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def _stop_on_signals(s: Session):
    """SIGTERM/SIGINT finish the current step, then save and exit cleanly."""

    def request_stop(signum: int, _frame: Any) -> None:
        s.stop_requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
