"""A step's groups: sample G completions for each of this rank's prompts and score them, with
DAPO's dynamic sampling (keep only groups whose rewards differ, sample more to fill the step).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from oncurve import distributed
from oncurve.config import Config
from oncurve.data.curriculum import gather_pass_rates, group_pass_rates
from oncurve.data.prompts import group_columns
from oncurve.errors import TrainingError
from oncurve.loop.timer import Timer
from oncurve.rewards.runner import RewardResult, logged_columns
from oncurve.rewards.trl_contract import TrainerState
from oncurve.rollout import SamplingParams
from oncurve.rollout.env_calls import LENGTH, MAX_TURNS
from oncurve.rollout.episodes import draw
from oncurve.run.metrics import SAMPLE_COLUMNS
from oncurve.run.oom import sampling_round
from oncurve.run.session import Session
from oncurve.types import RolloutBatch


@dataclass
class Sampled:
    """This rank's scored groups for one training step (see `sample_groups`).

    Attributes:
        rollout: the g kept groups, N = g*G rows; g is the same on every rank.
        rewards: `[N]` their total rewards, NaN where a row has none.
        rows: the g dataset rows, one per group, in the rollout's order.
        metrics: what was sampled and what was kept (see `sample_groups`).
        tokens: completion tokens sampled on this rank in every round, kept or not.
        scores: every round's scores together (`RewardRunner.concat`), with the metrics the
            rewards logged, which join the step's (`oncurve.rewards.runner.logged_metrics`).
    """

    rollout: RolloutBatch
    rewards: torch.Tensor
    rows: list[dict]
    metrics: dict[str, float]
    tokens: int
    scores: RewardResult
    # what rewards logged beside each kept completion (`log_extra`): column -> one value per row
    extra: dict[str, list[Any]] = field(default_factory=dict)


def sample_groups(s: Session, step: int, timer: Timer) -> Sampled:
    """This rank's share of the step's groups, scored: B / W prompts x G completions (W ranks).

    With dynamic sampling (DAPO), a group is kept only when its filter scores differ: those of
    the runner's verifier (the correctness reward, as DAPO filters on accuracy) when the run has
    one, else the total reward. Rounds of fresh prompts follow, up to `algo.max_resample` more,
    while any rank holds fewer than its B / W groups: the decision is collective, so every rank
    leaves at the same round (a rank already full samples nothing meanwhile). A rank still short
    after the last round leaves every rank with the fewest groups any rank holds, so that all
    ranks run the same optimizer steps (`update_policy`); none at all is an error on every rank.

    Metrics: `reward/*` and `groups/all_equal_frac` (groups whose finite total rewards are all
    equal) cover every group sampled, in every round, as do `episode/turns_mean` (policy
    turns per episode), `episode/errors` and `episode/timeouts` (episodes ended on their
    environment's fault), `episode/truncated` (ended by a turn cut at `rollout.max_new_tokens`)
    and `episode/max_turns` (ended by the turn limit) with `rollout.env`, whose `episode_end`
    column joins the step's logged columns (samples.jsonl). With dynamic sampling also
    `kept/reward_mean` and `kept/reward_std` (the rows kept for the update), `kept/groups` (every
    rank's), `groups/dropped` (by the filter, this rank) and `groups/sampling_rounds`.

    With a curriculum (`oncurve.data.curriculum`) the prompts are its draw, and every group sampled,
    in every round and on every rank, updates it with its pass rate (its filter scores), once
    the step's rounds are over; its `curriculum/*` metrics join the step's.
    """
    cfg = s.config
    group_size, prompts = cfg.rollout.group_size, cfg.data.prompts_per_step
    mine = distributed.shard(prompts, s.rank, s.world_size)
    share = mine.stop - mine.start
    dynamic = cfg.algo.dynamic_sampling
    rounds_per_step = 1 + cfg.algo.max_resample if dynamic else 1
    results: list[RewardResult] = []
    kept: list[tuple[RolloutBatch, torch.Tensor, list[dict], dict[str, list]]] = []
    state = trainer_state(cfg, step - 1)
    turns: list[int] = []  # policy turns of every multi-turn episode sampled
    faults: list[str | None] = []  # and what ended each on its environment's fault
    endings: list[str] = []  # and what ended each (`oncurve.rollout.episodes.ENDINGS`)
    visits: list[tuple[int, torch.Tensor]] = []  # (round, group pass rates) for the curriculum
    kept_groups = dropped = tokens = fewest = rounds = 0
    while rounds < rounds_per_step and fewest < share:
        if kept_groups < share:
            rows = _prompt_rows(s, step, prompts, rounds, rounds_per_step)[mine]
            params = sampling_params(cfg, seed=step_seed(cfg.run.seed, step, rounds, s.rank))
            with timer("rollout"):
                rollout, outcomes = draw_recovering(s, rows, group_size, params)
            with timer("reward"):
                scored = s.rewards.score(
                    *_reward_inputs(rows, rollout, group_size, outcomes), state
                )
            results.append(scored)
            turns.extend(outcomes.get("turns", []))
            faults.extend(outcomes.get("episode_fault", []))
            endings.extend(outcomes.get("episode_end", []))
            episode = {
                column: outcomes[column] for column in ("episode_end",) if column in outcomes
            }
            logged = logged_columns(scored, SAMPLE_COLUMNS | episode.keys()) | episode
            tokens += int(rollout.completion_mask.sum())
            # Rewards are scored on the CPU; the advantages they become index the rollout's rows.
            total = scored.total.to(rollout.completion_ids.device)
            if s.curriculum is not None:
                visits.append((rounds, group_pass_rates(_verdicts(scored, total), group_size)))
            if dynamic:
                informative = _informative_groups(_verdicts(scored, total), group_size)
                dropped += int((~informative).sum())
                keep = informative.nonzero().flatten()[: share - kept_groups]
                if len(keep):
                    index = group_rows(keep, group_size)
                    picked = index.tolist()
                    kept.append(
                        (
                            rollout.select(index),
                            total[index],
                            [rows[i] for i in keep.tolist()],
                            {k: [v[i] for i in picked] for k, v in logged.items()},
                        )
                    )
                    kept_groups += len(keep)
            else:
                kept.append((rollout, total, rows, logged))
                kept_groups = share
        rounds += 1
        # Every rank learns the fewest groups any rank holds, in every round: ranks that stopped
        # sampling at different rounds would take their collectives out of step.
        fewest = int(distributed.all_min([float(kept_groups)])[0]) if dynamic else kept_groups
    if fewest == 0:
        raise TrainingError(
            f"dynamic sampling found no group whose {s.rewards.filter_name} rewards differ on "
            f"some rank in {rounds} rounds; raise algo.max_resample or check the reward"
        )
    rollout = RolloutBatch.concat([b for b, _, _, _ in kept], s.tokenizer.pad_token_id)
    rewards = torch.cat([r for _, r, _, _ in kept])
    rows = [row for _, _, rs, _ in kept for row in rs][:fewest]
    kept_columns = dict.fromkeys(column for *_, logged in kept for column in logged)
    extra = {
        column: [v for b, _, _, logged in kept for v in logged.get(column, [None] * b.num_rows)][
            : fewest * group_size
        ]
        for column in kept_columns
    }
    if fewest < kept_groups:
        index = torch.arange(fewest * group_size, device=rewards.device)
        rollout, rewards = rollout.select(index), rewards[index]
    every_round = s.rewards.concat(results)
    names = [name for name, _, _ in s.rewards.fns]
    metrics = {
        **every_round.metrics,
        **function_means(every_round.per_fn, names),
        **reward_metrics(every_round.total, group_size),
    }
    if cfg.rollout.env is not None:
        played, turns_total = distributed.all_sum([float(len(turns)), float(sum(turns))])
        metrics["episode/turns_mean"] = turns_total / played if played else math.nan
        metrics["episode/errors"] = float(faults.count("error"))
        metrics["episode/timeouts"] = float(faults.count("timeout"))
        metrics["episode/truncated"] = float(endings.count(LENGTH))
        metrics["episode/max_turns"] = float(endings.count(MAX_TURNS))
    if dynamic:
        mean, std = _pooled_mean_std(rewards)
        metrics |= {
            "kept/reward_mean": mean,
            "kept/reward_std": std,
            "kept/groups": float(fewest * s.world_size),
            "groups/dropped": float(dropped),
            "groups/sampling_rounds": float(rounds),
        }
    if s.curriculum is not None:
        rates = gather_pass_rates(visits, rounds, mine, prompts)
        metrics |= s.curriculum.record(step, rounds_per_step, rates)
    return Sampled(rollout, rewards, rows, metrics, tokens, every_round, extra)


def _verdicts(scored: RewardResult, total: torch.Tensor) -> torch.Tensor:
    """`[N]` what a group's rows are judged by, on `total`'s device: the verifier's scores, or
    the total rewards `total` when the run has no verifier."""
    if scored.verifier_scores is None:
        return total
    return scored.verifier_scores.to(total.device)


def _prompt_rows(s: Session, step: int, size: int, round_: int, rounds_per_step: int) -> list[dict]:
    """The step's `size` prompts of sampling round `round_`, every rank's: the seeded order of
    `PromptData.batch`, or the curriculum's draw."""
    if s.curriculum is None:
        return s.data.batch(step, size, round_, rounds_per_step)
    return [s.data.rows[i] for i in s.curriculum.draw(step, size, round_, rounds_per_step)]


def reward_metrics(rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """Mean and population std of the finite rewards `[N]` and the fraction of groups whose
    finite rewards are all equal (no gradient), of every rank's rows together: ranks may hold
    different numbers of them (dynamic sampling stops sampling on a rank that is full), so
    each row weighs alike, not each rank."""
    all_equal = ~_informative_groups(rewards, group_size)
    counted = distributed.all_sum([float(all_equal.sum()), float(all_equal.numel())])
    mean, std = _pooled_mean_std(rewards)
    return {
        "reward/mean": mean,
        "reward/std": std,
        "groups/all_equal_frac": counted[0] / counted[1],
    }


def function_means(per_fn: torch.Tensor, names: list[str]) -> dict[str, float]:
    """`reward/<name>`: each function's mean score over the rows it scored (`per_fn`
    `[N, n_fns]`, NaN where it gave none) of every rank together; NaN where none was scored."""
    scored = ~torch.isnan(per_fn)
    local = [float(scored.sum(0)[f]) for f in range(len(names))]
    local += [float(per_fn[scored[:, f], f].double().sum()) for f in range(len(names))]
    sums = distributed.all_sum(local)
    counts, totals = sums[: len(names)], sums[len(names) :]
    return {
        f"reward/{name}": total / count if count else math.nan
        for name, count, total in zip(names, counts, totals, strict=True)
    }


def _pooled_mean_std(rewards: torch.Tensor) -> tuple[float, float]:
    """Mean and population std of the finite values of `rewards` `[N]` on every rank taken
    together; NaN when none is."""
    finite = rewards[torch.isfinite(rewards)].double()
    count, total, squares = distributed.all_sum(
        [float(finite.numel()), float(finite.sum()), float(finite.square().sum())]
    )
    if not count:
        return math.nan, math.nan
    mean = total / count
    return mean, math.sqrt(max(squares / count - mean**2, 0.0))


def draw_recovering(
    s: Session, rows: list[dict], group_size: int, params: SamplingParams
) -> tuple[RolloutBatch, dict[str, list]]:
    """`draw` of `rows` in calls of `rollout.prompts_per_call` prompts (all at once when
    null), concatenated; calls of half as many prompts when sampling runs out of memory
    (`oncurve.run.oom`). Each call says which rows of the whole round it samples
    (`SamplingParams.first_row`): the cuda_graph sampler then samples what the round in one call
    would have, the decode-loop samplers a reproducible draw of their own."""

    def attempt() -> tuple[RolloutBatch, dict[str, list]]:
        per_call = s.config.rollout.prompts_per_call or len(rows)
        parts = [
            draw(
                s.sampler,
                s.episodes,
                rows[start : start + per_call],
                group_size,
                dataclasses.replace(params, first_row=start * group_size),
            )
            for start in range(0, len(rows), per_call)
        ]
        if len(parts) == 1:
            return parts[0]
        rollout = RolloutBatch.concat([part for part, _ in parts], s.tokenizer.pad_token_id)
        outcomes = {key: [v for _, part in parts for v in part[key]] for key in parts[0][1]}
        return rollout, outcomes

    return s.recovering(sampling_round(len(rows)), attempt, on_retry=s.sampler.release)


def trainer_state(config: Config, steps_done: int) -> TrainerState:
    """What TRL's `trainer_state` says to a reward after `steps_done` steps: TRL counts
    optimizer steps, and each step here takes `algo.mu` x `algo.minibatches` of them (TRL's
    `num_iterations` x `steps_per_generation` / `gradient_accumulation_steps`)."""
    per_step = config.algo.mu * config.algo.minibatches
    return TrainerState(steps_done * per_step, config.run.steps * per_step)


def sampling_params(config: Config, seed: int) -> SamplingParams:
    """The sampler's settings from `rollout.*`, with `seed`."""
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


def _reward_inputs(
    rows: list[dict], rollout: RolloutBatch, group_size: int, outcomes: dict[str, list]
) -> tuple[list[str], list[str], dict[str, list]]:
    prompts, columns = group_columns(rows, group_size)
    columns["completion_lengths"] = rollout.completion_lengths.tolist()
    columns["completion_ids"] = rollout.completion_token_lists()
    return prompts, rollout.texts, columns | outcomes


def _informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[B]` True where a group's finite rewards are not all equal (it has a gradient)."""
    grouped = rewards.view(-1, group_size)
    finite = torch.isfinite(grouped)
    high = torch.where(finite, grouped, -torch.inf).max(1).values
    low = torch.where(finite, grouped, torch.inf).min(1).values
    return high > low


def group_rows(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[len(groups) * G]` the rows of `groups` `[g]`, a group's G rows contiguous."""
    return (groups[:, None] * group_size + torch.arange(group_size, device=groups.device)).flatten()


def step_seed(seed: int, step: int, round_: int, rank: int) -> int:
    """The sampling seed of one round of one step on one rank.

    A pure function of (seed, step, round, rank): resuming at step k samples exactly what an
    uninterrupted run samples there, without saving any sampler state.
    """
    return (seed * 1_000_003 + step * 1_009 + round_ * 101 + rank * 7_919_993) % (2**63)
