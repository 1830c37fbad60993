"""Settling a run's config: every `auto` and null setting resolved, in one pure step.

Two steps, both pure. What loading the weights needs comes first (`settle_loading`: the
dtype, a Hub model's revision); then, once the model is loaded, the rest. What those choices
read besides the config is gathered into `RunFacts`: the model's shape,
the sampler backend's class, the device's memory and the host's, whether packed rows can run.
`settle(config, facts)` then fills in the memory settings (the plan on CUDA, fixed defaults on
the CPU), the importance-sampling cap, CUDA graphs and compilation, and packing, and says what it chose in
`Settled.report`. It loads nothing and changes nothing, so any shape or device can be settled
in a test (`RunFacts` made by hand). The run's config.yaml records the result.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from oncurve.config import Config
from oncurve.errors import UserError
from oncurve.model import packed_attention
from oncurve.model.devices import host_memory_bytes
from oncurve.rollout import Sampler, backend_named
from oncurve.run.memory_plan import (
    CPU_MICROBATCH_ROWS,
    DEFAULT_LOGITS_CHUNK,
    MemoryPlan,
    ModelShape,
    device_budget,
    keeps_sampler_cache,
    offloads_reference,
    plan_memory,
)

# `algo.is_cap` when left null with a sampler whose kernels differ from the training forward's
SAMPLER_IS_CAP = 2.0
# the settings the memory plan fills in where null, by the config section that holds each
MEMORY_SETTINGS = {
    "gradient_checkpointing": "model",
    "logprob_chunk_size": "model",
    "microbatch_size": "optim",
    "microbatch_tokens": "optim",
    "keep_cache": "rollout",
    "offload_reference": "model",
}


@dataclass(frozen=True)
class RunFacts:
    """What settling reads besides the config.

    Attributes:
        device_type: where the run trains ("cpu", "cuda").
        shape: the policy's shape (LoRA's adapters counted as what is trainable).
        sampler: the class of the sampler `rollout.backend` names (or `auto` picks).
        world_size: ranks; each plans for its share of a step's rows.
        seq_len: the longest prompt plus the longest completion (or episode).
        budget_bytes: device memory the run may use (CUDA), None elsewhere.
        host_bytes: host memory, for a reference offloaded to it.
        processes_on_host: training processes on this host (each pins its own copy).
        evaluates: the run evaluates (its sampling calls count in the plan).
        reward_bytes: a reward model's weights on the device.
        saved_memory: a resumed checkpoint's memory settings (`memory_settings`), or None.
        unpackable: why packed rows cannot run here (`packed_attention.unsupported`), or None.
        packing_failure: what the packed forward's check found wrong
            (`packed_attention.packed_failure`), or None; checked only where null would pack.
    """

    device_type: str
    shape: ModelShape
    sampler: type[Sampler]
    world_size: int = 1
    seq_len: int = 0
    budget_bytes: int | None = None
    host_bytes: int = 0
    processes_on_host: int = 1
    evaluates: bool = False
    reward_bytes: int = 0
    saved_memory: dict | None = None
    unpackable: str | None = None
    packing_failure: str | None = None

    @classmethod
    def gather(
        cls,
        config: Config,
        model: torch.nn.Module,
        world_size: int = 1,
        seq_len: int = 0,
        saved_memory: dict | None = None,
        evaluates: bool = False,
        reward_bytes: int = 0,
    ) -> RunFacts:
        """The facts of `model` (loaded, LoRA added) on its device. Where `model.pack_rows`
        is null and packing could run, the packed forward is checked once on the model (its
        attention is sdpa again after)."""
        device = model.device
        cuda = device.type == "cuda"
        unpackable = packed_attention.unsupported(model)
        failure = None
        if (
            config.model.pack_rows is None
            and unpackable is None
            and device.type in packed_attention.VARLEN_KERNELS
        ):
            packed_attention.use_packed_attention(model)
            failure = packed_attention.packed_failure(model)
            model.set_attn_implementation("sdpa")
        return cls(
            device_type=device.type,
            shape=ModelShape.of(model),
            sampler=backend_named(config.rollout.backend, model).sampler,
            world_size=world_size,
            seq_len=seq_len,
            budget_bytes=device_budget(device, config.run.gpu_memory_gb) if cuda else None,
            host_bytes=host_memory_bytes() if cuda else 0,
            # pinned copies: one per process on this host (torchrun's count, else all of them)
            processes_on_host=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
            evaluates=evaluates,
            reward_bytes=reward_bytes,
            saved_memory=saved_memory,
            unpackable=unpackable,
            packing_failure=failure,
        )


# Settings that may name a local file or directory: recorded whole, so that the run's config
# and checkpoints name the same files from any working directory.
LOCAL_PATHS = ("model.path", "data.path", "eval.path")


def settle_paths(config: Config) -> Config:
    """`config` with each setting of `LOCAL_PATHS` that names an existing local path (the
    bundled model's name `default` aside) made absolute."""
    for setting in LOCAL_PATHS:
        section, key = setting.split(".")
        part = getattr(config, section)
        value = getattr(part, key)
        if value and value != "default" and Path(value).expanduser().exists():
            whole = os.path.abspath(Path(value).expanduser())
            config = dataclasses.replace(
                config, **{section: dataclasses.replace(part, **{key: whole})}
            )
    return config


def same_local_path(before: object, now: object) -> bool:
    """Whether two values of a `LOCAL_PATHS` setting name the same existing local path (a run
    that recorded it relative, resumed from the same directory)."""
    if not isinstance(before, str) or not isinstance(now, str):
        return False
    paths = [Path(value).expanduser() for value in (before, now)]
    return all(p.exists() for p in paths) and paths[0].resolve() == paths[1].resolve()


def settle_loading(config: Config, auto_dtype: str, hub_commit: str | None) -> Config:
    """`config` with what loading the weights needs settled: `model.dtype` (`auto_dtype`, what
    `auto` means on the run's device, where `auto`) and `model.revision` (`hub_commit`, the
    commit a Hub model resolved to, where one did), so that config.yaml names the weights."""
    m = config.model
    model = dataclasses.replace(
        m,
        dtype=auto_dtype if m.dtype == "auto" else m.dtype,
        revision=hub_commit or m.revision,
    )
    return dataclasses.replace(config, model=model)


@dataclass(frozen=True)
class Settled:
    """A settled config, the memory plan that chose its memory settings (CUDA; None on the
    CPU), and the start-up report's lines (what was chosen, and warnings)."""

    config: Config
    plan: MemoryPlan | None
    report: list[str]


def settle(config: Config, facts: RunFacts) -> Settled:
    """`config` with every `auto` and null setting filled in from `facts`; raises
    `UserError` for a setting the facts rule out (`model.pack_rows: true` where packing
    cannot run)."""
    config, plan = settle_memory(config, facts)
    config = settle_is_cap(config, facts)
    config, graphs_note = settle_cuda_graphs(config, facts)
    config, packing_note = settle_pack_rows(config, facts)
    report = [graphs_note] if graphs_note else []
    if config.run.gpu_memory_gb is not None and facts.device_type != "cuda":
        report.append(
            f"note: run.gpu_memory_gb has no effect here (run.device={facts.device_type}): "
            "it caps a CUDA device's memory"
        )
    if plan is not None:
        report.append(plan.describe())
        if not plan.fits:
            report.append(
                "warning: the predicted peak exceeds the memory budget; lower "
                "rollout.max_new_tokens or data.prompts_per_step, or train LoRA adapters"
            )
    if packing_note:
        report.append(packing_note)
    return Settled(config, plan, report)


def settle_memory(config: Config, facts: RunFacts) -> tuple[Config, MemoryPlan | None]:
    """`config` with every memory setting the user left unset (null) filled in, and the plan
    that chose them on CUDA (None on the CPU, where the defaults are fixed). A resumed run takes
    the settings its checkpoint was written with (`facts.saved_memory`), so that it trains as
    the run did. A reward model's weights (`facts.reward_bytes`) count in the plan's state."""
    chosen = memory_settings(config)
    for key, value in (facts.saved_memory or {}).items():
        if key in chosen and chosen[key] is None:
            chosen[key] = value
    plan = None
    if facts.device_type == "cuda":
        shape = facts.shape
        rows_per_step = config.data.prompts_per_step * config.rollout.group_size // facts.world_size
        # `evaluate` samples up to 256 rows at once; eval.num_prompts=null takes the whole set
        prompts = 256 if config.eval.num_prompts is None else config.eval.num_prompts
        eval_rows = min(256, prompts * config.eval.samples) if facts.evaluates else 0
        keep_cache = chosen["keep_cache"]
        if keep_cache is None:
            keep_cache = keeps_sampler_cache(shape, rows_per_step, facts.seq_len)
        holds = facts.sampler.holds_cache and keep_cache
        reference = config.frozen_reference
        offload = chosen["offload_reference"]
        if offload is None:
            offload = reference and offloads_reference(
                shape, facts.processes_on_host, facts.host_bytes
            )
        plan = plan_memory(
            shape,
            seq_len=facts.seq_len,
            rows_per_step=rows_per_step,
            sample_rows=rows_per_step,
            budget_bytes=facts.budget_bytes,
            reference=reference,
            critic=config.algo.estimator == "gae",
            # the training calls' workspace, when kept (an evaluation's is freed after it)
            held_cache_rows=rows_per_step if holds else 0,
            eval_rows=eval_rows,
            microbatch_rows=chosen["microbatch_size"],
            gradient_checkpointing=chosen["gradient_checkpointing"],
            logprob_chunk_size=chosen["logprob_chunk_size"],
            extra_state_bytes=facts.reward_bytes,
            offload_reference=offload,
        )
        planned = {
            "gradient_checkpointing": plan.gradient_checkpointing,
            "logprob_chunk_size": plan.logprob_chunk_size,
            "microbatch_size": plan.microbatch_rows,
            "microbatch_tokens": plan.microbatch_tokens,
            "keep_cache": keep_cache,
            "offload_reference": offload,
        }
    else:
        planned = {
            "gradient_checkpointing": False,
            "logprob_chunk_size": DEFAULT_LOGITS_CHUNK,
            "microbatch_size": CPU_MICROBATCH_ROWS,
            "microbatch_tokens": None,  # `kv_cache.microbatch_tokens` sizes it for the CPU
            "keep_cache": True,  # nothing is captured on the CPU
            "offload_reference": False,  # the weights are in host memory already
        }
    chosen = {key: planned[key] if value is None else value for key, value in chosen.items()}
    sections: dict[str, dict] = {}
    for key, value in chosen.items():
        sections.setdefault(MEMORY_SETTINGS[key], {})[key] = value
    config = dataclasses.replace(
        config,
        **{
            name: dataclasses.replace(getattr(config, name), **values)
            for name, values in sections.items()
        },
    )
    return config, plan


def memory_settings(config: Config) -> dict:
    """The settings `settle_memory` fills in, as a checkpoint keeps them."""
    return {key: getattr(getattr(config, name), key) for key, name in MEMORY_SETTINGS.items()}


def settle_is_cap(config: Config, facts: RunFacts) -> Config:
    """`config` with `algo.is_cap` filled in when null: 0.0 (off) when the sampler's logprobs
    are `exact_logprobs` and the weights are float32, else `SAMPLER_IS_CAP` (in bfloat16 a
    decode step's logprobs differ from the whole sequence's forward in their last bits); left
    null under `algo.is_correction=none`, which has nothing to cap."""
    if config.algo.is_cap is not None or config.algo.is_correction == "none":
        return config
    exact = facts.sampler.exact_logprobs and facts.shape.weight_bytes == 4
    cap = 0.0 if exact else SAMPLER_IS_CAP
    return dataclasses.replace(config, algo=dataclasses.replace(config.algo, is_cap=cap))


def settle_cuda_graphs(config: Config, facts: RunFacts) -> tuple[Config, str]:
    """`config` with `rollout.cuda_graphs` and `rollout.compile` filled in where null: on with
    a sampler that `compiles_steps` on CUDA, else off; and turned off where set for a sampler
    that compiles and captures nothing (the torch sampler's), with the note that says so (""
    for none), so that config.yaml and the `rollout/compiled` metric say what runs. (A sampler
    that compiles tries graphs on any device: a capture that fails is a warning of its own.)"""
    can = facts.sampler.compiles_steps
    on = can and facts.device_type == "cuda"
    r = config.rollout
    given = {"cuda_graphs": r.cuda_graphs, "compile": r.compile}
    ignored = [name for name, value in given.items() if value and not can]
    settled = {name: on if value is None else value and can for name, value in given.items()}
    note = ""
    if ignored:
        names = " and ".join(f"rollout.{name}=true" for name in ignored)
        verb = "have" if len(ignored) > 1 else "has"
        note = (
            f"note: {names} {verb} no effect here (rollout.backend={r.backend} on "
            f"{facts.device_type}): off"
        )
    return dataclasses.replace(config, rollout=dataclasses.replace(r, **settled)), note


def settle_pack_rows(config: Config, facts: RunFacts) -> tuple[Config, str]:
    """`config` with `model.pack_rows` filled in where null, and the warning to print ("" for
    none). Null is on where packed rows take torch's variable-length attention (CUDA), nothing
    makes packing unsupported and the packed forward passed its check (a failure is one
    warning, and rows padded); true where packing is unsupported is an error."""
    wanted = config.model.pack_rows
    if wanted is False:
        return config, ""
    if wanted and facts.unpackable:
        raise UserError(f"model.pack_rows: {facts.unpackable}; set it to false or null")
    on = bool(wanted) or (
        facts.device_type in packed_attention.VARLEN_KERNELS and facts.unpackable is None
    )
    note = ""
    if on and wanted is None and facts.packing_failure:
        note = (
            "warning: rows stay padded in the update (model.pack_rows): the packed forward "
            f"failed its check: {facts.packing_failure}"
        )
        on = False
    return dataclasses.replace(config, model=dataclasses.replace(config.model, pack_rows=on)), note
