"""A run as the loop holds it (`Session`): the components `oncurve.run.setup` assembled, the
settings in effect and how they change (smaller after running out of memory, a sampler's
fallback), and what the steps count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from oncurve.advantages.sources import AdvantageSource
from oncurve.algo.truncation import Truncation
from oncurve.config import Config, config_yaml
from oncurve.data.curriculum import Curriculum
from oncurve.data.prompts import PromptData
from oncurve.model.kv_cache import microbatch_tokens
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.rewards.runner import RewardRunner
from oncurve.rollout import Sampler
from oncurve.rollout.episodes import EpisodeSettings
from oncurve.rollout.harness import HarnessSettings
from oncurve.run import oom
from oncurve.run.durable_files import replace_text
from oncurve.run.memory_plan import ModelShape, forward_only_tokens
from oncurve.run.metrics import MetricsLogger
from oncurve.update.microbatches import ForwardSettings
from oncurve.update.policy import Policy
from oncurve.update.step import LossFns

T = TypeVar("T")

# The name a checkpoint keeps a synced reference under
REFERENCE = "reference"


@dataclass
class Counts:
    """What the steps count: carried from step to step (and checkpointed), or this step's."""

    completion_tokens: int = 0  # sampled so far, every rank's, checkpointed with the step
    skipped_in_a_row: int = 0  # consecutive optimizer steps skipped for a non-finite update
    oom_retries: int = 0  # phases redone after running out of memory, this step
    updates_this_step: int = 0  # optimizer steps taken in the step under way

    def begin_step(self) -> None:
        self.oom_retries = self.updates_this_step = 0


@dataclass
class Session:
    """A run: the components built once by `setup`, which no step reassigns; the settings it
    trains with (`config`), changed only through `adopt` and `settle_settings`; what the steps
    count (`counts`); and what a checkpoint keeps of where the run came from."""

    # -- the settings in effect: as settled (`auto` and null filled in), then smaller where a
    # phase ran out of memory (`adopt`) or the sampler turned one off (`settle_settings`)
    config: Config
    # -- the components, built once
    run_dir: Path
    device: torch.device
    policy: Policy
    tokenizer: Any
    sampler: Sampler  # built on the policy's whole weights: call it inside `policy.whole()`
    data: PromptData
    eval_data: PromptData | None
    rewards: RewardRunner
    correct: Any  # the reward evaluation calls correct
    correct_name: str  # how evaluation's warnings name it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_fns: LossFns
    advantage: AdvantageSource
    logger: MetricsLogger
    episodes: EpisodeSettings | HarnessSettings | None = (
        None  # with rollout.env: multi-turn episodes
    )
    curriculum: Curriculum | None = None  # data.curriculum's sampler; None: the seeded order
    rank: int = 0
    world_size: int = 1
    # -- what the steps count
    counts: Counts = dataclasses.field(default_factory=Counts)
    # -- what checkpoints keep: the step resumed from; the settings made smaller after running
    # out of memory, by dotted name (a resumed run starts from them); the training and held-out
    # rows' digests ("" without held-out rows) and the settings changed on each resume
    start_step: int = 0
    shrunk: dict[str, Any] = dataclasses.field(default_factory=dict)
    data_fingerprint: str = ""
    eval_fingerprint: str = ""
    config_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    recorded: Config | None = None  # what config.yaml holds, as this process last wrote it
    # whether the run has taken its directory over (`setup`, once its checks passed): a run
    # refused before writes no config.yaml over the previous run's
    writes_run_dir: bool = False

    def adopt(self, config: Config) -> None:
        """Make `config`, with smaller memory settings (`oncurve.run.oom`), the session's from the
        next attempt of a phase on: the forward's microbatches, gradient checkpointing; counted
        in `counts.oom_retries`. config.yaml records it when the step ends (`settle_settings`)."""
        self.counts.oom_retries += 1
        self._apply_memory_settings(config)

    def settle_settings(self) -> None:
        """After a step, the preflight or an evaluation: every rank takes the smallest memory
        settings any rank holds (a rank that ran out of memory in a phase without collectives
        redid it alone), the settings the sampler turned off after they failed become the
        run's, and config.yaml is written again when the settings changed. Collective."""
        if self.world_size > 1:
            agreed = oom.agree(self.config)
            if oom.settings_of(agreed) != oom.settings_of(self.config):
                self._apply_memory_settings(agreed)
        r = self.config.rollout
        off = {name: on for name, on in self.sampler.turned_off().items() if getattr(r, name) != on}
        if off:
            self.config = dataclasses.replace(self.config, rollout=dataclasses.replace(r, **off))
        self.record_settings()

    def record_settings(self) -> None:
        """config.yaml holds the settings in effect (written by rank 0, when they changed,
        once the run writes its directory)."""
        if self.rank == 0 and self.writes_run_dir and self.config != self.recorded:
            # whole or not at all: a resume and `oncurve eval --run` read it
            replace_text(self.run_dir / "config.yaml", config_yaml(self.config))
            self.recorded = self.config

    def _apply_memory_settings(self, config: Config) -> None:
        if config.model.gradient_checkpointing and not self.config.model.gradient_checkpointing:
            enable_gradient_checkpointing(self.policy.model)
        self.policy.forward = forward_settings(self.policy.model, config)
        before, after = oom.settings_of(self.config), oom.settings_of(config)
        self.shrunk |= {key: value for key, value in after.items() if before[key] != value}
        self.config = config

    def recovering(
        self, phase: oom.Phase, attempt: Callable[[], T], on_retry: Callable[[], None] | None = None
    ) -> T:
        """`attempt()`, redone each time it runs out of memory with `phase`'s next smaller
        setting (`oom.next_settings`), made the session's (`adopt`) so that the next attempt
        reads it. `on_retry` undoes what a failed attempt left (e.g. its partial gradients).

        Raises:
            oom.OutOfMemoryStop: out of memory with nothing left to shrink.
        """
        while True:
            try:
                return attempt()
            except torch.OutOfMemoryError as error:
                # only the line is kept: the error holds the failed attempt's frames and tensors
                detail = oom.failure_line(error)
            if on_retry is not None:
                on_retry()
            oom.free_memory()
            self.adopt(oom.next_settings(phase, self.config, detail))

    def checkpoint_extras(
        self,
    ) -> tuple[dict[str, torch.nn.Module], dict[str, torch.optim.Optimizer]]:
        """Modules and optimizers a checkpoint keeps besides the policy's: the advantage
        source's, and the reference once it has been synced (before, it is the initial model,
        which a resume builds again from `model.path`)."""
        modules, optimizers = self.advantage.checkpoint_state()
        if self.policy.reference is not None and self.policy.reference_synced:
            modules = {REFERENCE: self.policy.reference, **modules}
        return modules, optimizers


def forward_settings(model: torch.nn.Module, config: Config) -> ForwardSettings:
    """How the training forward of `model` runs under the settled `config`: made at setup and
    again whenever a memory setting shrinks (`Session.adopt`)."""
    return ForwardSettings(
        temperature=config.rollout.temperature,
        chunk_size=config.model.logprob_chunk_size,
        microbatch_rows=config.optim.microbatch_size,
        compile_layers=config.model.compile_layers,
        pack_rows=config.model.pack_rows,
        share_prompt=shares_prompt_forward(config),
        truncation=Truncation(
            top_k=config.rollout.top_k, top_p=config.rollout.top_p, min_p=config.rollout.min_p
        ),
        **token_caps(model, config),
    )


def shares_prompt_forward(config: Config) -> bool:
    """Whether the update runs each group's prompt once: with rows packed, always (one forward,
    the prompt a segment of it); padded, not under gradient checkpointing (HF drops the KV
    cache there), FSDP2 (its hooks expect one forward of each module per backward) or compiled
    layers (transformers' KV cache is indexed by the layer's number, so Dynamo would compile
    each layer apart and run the rest eagerly past its recompile limit)."""
    m = config.model
    if not m.share_prompt_forward:
        return False
    if m.pack_rows:
        return True
    return not (m.gradient_checkpointing or config.dist.fsdp or m.compile_layers)


def token_caps(model: torch.nn.Module, config: Config) -> dict[str, int | None]:
    """`ForwardSettings`' token caps: the training microbatches' (`kv_cache.microbatch_tokens`)
    and, on an accelerator, the reference pass's, as many tokens as a forward without gradients
    runs in the memory a training microbatch keeps for its backward (fewer microbatches, so
    fewer kernel launches). On the CPU both are one: there the cap bounds the widest single
    activation, which both passes make."""
    tokens = microbatch_tokens(model, config.optim.microbatch_tokens)
    reference = None
    if model.get_input_embeddings().weight.device.type != "cpu":
        checkpointing = bool(config.model.gradient_checkpointing)
        reference = forward_only_tokens(ModelShape.of(model), tokens, checkpointing)
    return {"microbatch_tokens": tokens, "reference_tokens": reference}
