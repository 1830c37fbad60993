"""Out of memory is not the end of a run: a phase that runs out is redone in smaller pieces.

The memory plan (`oncurve.run.memory_plan`) is an estimate: completions grow during training, another
process may share the card. When a phase raises `torch.OutOfMemoryError`, the session
(`Session.recovering`) frees what the failed attempt held, makes that phase's pieces smaller
(`next_settings`) and runs it again on the same data:

- sampling: fewer prompts per sampler call (`rollout.prompts_per_call`);
- the reference and old-policy forwards and the update: half the rows and tokens per microbatch
  (`optim.microbatch_size`, `optim.microbatch_tokens`), then gradient checkpointing
  (`model.gradient_checkpointing`) once a microbatch is one row. The loss is normalised by the
  whole step's counts, so smaller microbatches give the same update to float rounding;
- evaluation: fewer rows per sampler call (`eval.batch_rows`).

Each change is one line on stderr (phase, old and new setting), is counted in the step's
`memory/oom_retries`, and goes into the session's config (config.yaml and every later
checkpoint), so a resumed run starts from it. When nothing is left to make smaller,
`next_settings` raises `OutOfMemoryStop` with one line of what to try; the trainer then saves the last
finished step and stops. With several ranks, a phase without collectives (sampling,
evaluation, a frozen reference's forward) is redone on the rank that ran out, and every rank
takes the smallest setting at the end of the step (`agree`); a phase with collectives is not
redone on one rank: it stops with one line naming the smaller setting to restart with.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from oncurve import distributed
from oncurve.config import Config
from oncurve.errors import TrainingError


class OutOfMemoryStop(TrainingError):
    """A phase ran out of memory with every setting it can shrink at its smallest."""


# A change of settings: the new config and a description "key old -> new", or None when the
# phase has nothing left to make smaller.
Shrink = Callable[[Config], tuple[Config, str] | None]


def halve_microbatches(config: Config) -> tuple[Config, str] | None:
    """Half the rows and tokens per microbatch; at one row, gradient checkpointing on."""
    o, m = config.optim, config.model
    rows, tokens = o.microbatch_size, o.microbatch_tokens
    if rows is not None and rows > 1:
        # a token cap that is set is halved too; none (0) or the device's own (null) stays
        half = dataclasses.replace(
            o, microbatch_size=rows // 2, microbatch_tokens=tokens // 2 if tokens else tokens
        )
        change = f"optim.microbatch_size {rows} -> {rows // 2}"
        if o.microbatch_tokens:
            change += f", optim.microbatch_tokens {o.microbatch_tokens} -> {half.microbatch_tokens}"
        return dataclasses.replace(config, optim=half), change
    if not m.gradient_checkpointing:
        checkpointed = dataclasses.replace(m, gradient_checkpointing=True)
        return (
            dataclasses.replace(config, model=checkpointed),
            "model.gradient_checkpointing false -> true",
        )
    return None


def _halved(config: Config, name: str, now: int) -> tuple[Config, str] | None:
    """`config` with the integer setting `name` (dotted) at half of `now`, its value."""
    if now <= 1:
        return None
    return with_settings(config, {name: now // 2}), f"{name} {now} -> {now // 2}"


def fewer_prompts_per_call(prompts: int) -> Shrink:
    """Half the prompts of a sampler call, from `prompts` (all of a round's) when unset."""
    return lambda config: _halved(
        config, "rollout.prompts_per_call", config.rollout.prompts_per_call or prompts
    )


def fewer_evaluation_rows(config: Config) -> tuple[Config, str] | None:
    """Half the rows of an evaluation's sampler call."""
    return _halved(config, "eval.batch_rows", config.eval.batch_rows)


@dataclass(frozen=True)
class Phase:
    """A part of a step that `Session.recovering` redoes in smaller pieces after running out of memory.

    Attributes:
        name: named in the lines printed and in the error when it gives up.
        shrink: the next smaller settings (see `Shrink`).
        alone: the phase runs no collective, so one rank may redo it while the others go on
            (they take its smaller setting at the end of the step: `agree`).
    """

    name: str
    shrink: Shrink
    alone: bool = False


def sampling_round(prompts: int) -> Phase:
    """A round of sampling `prompts` prompts; it runs no collective."""
    return Phase("sampling", fewer_prompts_per_call(prompts), alone=True)


def reference_forward(frozen_copy: bool) -> Phase:
    """The reference's logprobs; a frozen copy is not data-parallel, so its forward runs no
    collective."""
    return Phase("the reference forward", halve_microbatches, alone=frozen_copy)


OLD_POLICY_FORWARD = Phase("the old-policy forward", halve_microbatches)
UPDATE = Phase("the update", halve_microbatches)
PREFLIGHT = Phase("the preflight", halve_microbatches)
EVALUATION = Phase("evaluation", fewer_evaluation_rows, alone=True)

# the settings a phase makes smaller, by section and field
SETTINGS = (
    ("optim", "microbatch_size"),
    ("optim", "microbatch_tokens"),
    ("model", "gradient_checkpointing"),
    ("rollout", "prompts_per_call"),
    ("eval", "batch_rows"),
)


def settings_of(config: Config) -> dict[str, object]:
    """`config`'s values of `SETTINGS`, by dotted name."""
    return {f"{section}.{key}": getattr(getattr(config, section), key) for section, key in SETTINGS}


def with_settings(config: Config, settings: dict[str, object]) -> Config:
    """`config` with `settings` (dotted names of `SETTINGS`, as `settings_of` gives) in place."""
    for name, value in settings.items():
        section, key = name.split(".")
        config = dataclasses.replace(
            config, **{section: dataclasses.replace(getattr(config, section), **{key: value})}
        )
    return config


def agree(config: Config) -> Config:
    """`config` with each of `SETTINGS` at the smallest any rank holds (gradient
    checkpointing on where any rank has it on): the same on every rank. Collective."""
    mine = settings_of(config)
    # null and 0 (no cap, the device's own cap, all prompts per call) are larger than any
    # number; a checkpointing rank is the smallest
    values = [
        -float(v) if isinstance(v, bool) else float(v) if v else math.inf for v in mine.values()
    ]
    smallest = distributed.all_min(values)
    agreed = {}
    for (name, value), low in zip(mine.items(), smallest, strict=True):
        if isinstance(value, bool):
            agreed[name] = low < 0
        else:
            agreed[name] = value if math.isinf(low) else int(low)
    return with_settings(config, agreed)


def free_memory() -> None:
    """Return what a failed attempt held (its tensors die with its frames) to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure_line(error: torch.OutOfMemoryError) -> str:
    """The first line of what the allocator said (kept after the error and its frames go)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else "out of memory"


def next_settings(phase: Phase, config: Config, detail: str) -> Config:
    """The config `phase` is redone with after running out of memory (`detail`, the
    allocator's line) under `config`: its next smaller setting, said in one line on stderr.

    Raises:
        OutOfMemoryStop: nothing left to shrink, or several ranks in a phase with collectives.
    """
    smaller = phase.shrink(config)
    if smaller is None:
        raise OutOfMemoryStop(
            f"out of memory in {phase.name} with every setting that can shrink at its smallest "
            f"({detail}); lower rollout.max_new_tokens, set run.gpu_memory_gb to the memory "
            "the card really has free, or train LoRA adapters (model.lora.r)"
        )
    before, (config, change) = settings_of(config), smaller
    rank, world_size = distributed.world()
    if world_size > 1 and not phase.alone:
        # The other ranks are inside this phase's collectives (DDP's buffer broadcasts and
        # gradient all-reduce), which a redo on this rank alone would not match.
        raise OutOfMemoryStop(
            f"out of memory in {phase.name} on rank {rank} ({detail}); with several ranks a phase "
            "cannot be redone on one of them: restart with "
            + " ".join(f"{k}={v}" for k, v in settings_of(config).items() if before[k] != v)
        )
    print(f"out of memory in {phase.name}: redoing it with {change}", file=sys.stderr)
    return config
