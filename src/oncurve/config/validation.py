"""Checks across fields: settings that are each valid alone but not together."""

from __future__ import annotations

from oncurve.config.presets import PRESETS, preset_applied
from oncurve.config.resume_settings import FORCEABLE, forceable
from oncurve.config.sections import Config
from oncurve.data.files import local_kind, without_splits
from oncurve.errors import UserError


def check_cross_fields(config: Config) -> None:
    if config.algo.kl_in_reward and config.algo.estimator != "gae":
        raise UserError(
            f"algo.kl_in_reward needs algo.estimator=gae (a critic), got {config.algo.estimator!r}"
            + _set_by_preset(config, "algo", "kl_in_reward")
        )
    if config.data.task is None and config.data.path is None:
        raise UserError("data.task or data.path must be set")
    check_ranks(config, config.dist.nproc)
    if config.dist.fsdp and config.model.lora.r:
        raise UserError("dist.fsdp=true with model.lora.r > 0 is not supported; use one of them")
    if config.rollout.min_new_tokens > config.rollout.max_new_tokens:
        raise UserError(
            f"rollout.min_new_tokens must be at most rollout.max_new_tokens "
            f"({config.rollout.max_new_tokens}), got {config.rollout.min_new_tokens}"
        )
    if config.rollout.max_turns > 1 and config.rollout.env is None:
        raise UserError("rollout.max_turns > 1 needs rollout.env (what answers the turns)")
    for key in config.run.force_changes:
        if not forceable(key):
            raise UserError(
                f"run.force_changes: {key!r} cannot be forced; choose among "
                f"{', '.join(FORCEABLE)} (data.rows for the training rows)"
            )
    _check_algo(config)
    _check_reward(config)
    _check_data(config)


def _set_by_preset(config: Config, section: str, key: str) -> str:
    """ " (algo.preset=P sets it)" when the preset sets `section.key` to the value the config
    holds, so that an error says where a setting the user may never have given came from; ""
    otherwise."""
    preset = config.algo.preset
    value = PRESETS[preset].get(section, {}).get(key)
    if value is None or getattr(getattr(config, section), key) != value:
        return ""
    return f" (algo.preset={preset} sets it)"


def check_preset_applied(config: Config) -> None:
    """UserError when `config`'s algo section was not built by loading (`load_config`,
    `build_config`, which apply the preset below the settings given) and holds none of the
    settings its preset brings beyond the field defaults: a Config made in Python keeps every
    field as given, so it would train without the preset it names."""
    preset = config.algo.preset
    if preset not in PRESETS:
        raise UserError(f"algo.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if preset_applied(config.algo):
        return
    defaults = Config()
    brought = [
        (section, key, value)
        for section, keys in PRESETS[preset].items()
        for key, value in keys.items()
        if getattr(getattr(defaults, section), key) != value
    ]
    held = [getattr(getattr(config, section), key) == value for section, key, value in brought]
    if brought and not any(held):
        section, key, value = brought[0]
        raise UserError(
            f"algo.preset={preset} sets {section}.{key}={value!r} (and more), but the config holds "
            f"{getattr(getattr(config, section), key)!r}: a Config made in Python applies no "
            f"preset; build it with oncurve.load_config(overrides=['algo.preset={preset}', ...])"
        )


def check_ranks(config: Config, world_size: int) -> None:
    """Every rank samples an equal share of the step's groups and must hold a group of every
    minibatch (`training_step.update_policy`): checked on loading with `dist.nproc`, and again
    at setup with the ranks torchrun really started."""
    if config.data.prompts_per_step % world_size:
        raise UserError(
            f"data.prompts_per_step ({config.data.prompts_per_step}) must be divisible by the "
            f"number of ranks (dist.nproc: {world_size}): each rank samples whole groups"
        )
    per_rank = config.data.prompts_per_step // world_size
    minibatches = config.algo.minibatches
    if minibatches > per_rank:
        preset = _set_by_preset(config, "algo", "minibatches")
        fix = (
            f": set algo.minibatches={per_rank}, or data.prompts_per_step="
            f"{minibatches * world_size} or more"
        )
        raise UserError(
            f"algo.minibatches must be at most data.prompts_per_step per rank "
            f"({config.data.prompts_per_step} / {world_size} = {per_rank}), got {minibatches}"
            + (preset + fix if preset else "")
        )


def _check_algo(config: Config) -> None:
    algo = config.algo
    if algo.kl_estimator == "k1" and algo.beta > 0 and not algo.kl_in_reward:
        raise UserError(
            "algo.kl_estimator=k1 in the loss (algo.kl_in_reward=false) has zero expected "
            "gradient: set algo.kl_estimator=k3 (or k2), or algo.kl_in_reward=true"
        )
    if algo.loss == "gspo" and algo.loss_agg != "seq-mean-token-mean":
        raise UserError(
            f"algo.loss_agg must be seq-mean-token-mean with algo.loss=gspo (the GSPO objective "
            f"weights every sequence equally), got {algo.loss_agg!r}"
        )
    if algo.ref_sync_every and config.model.lora.r:
        raise UserError(
            "algo.ref_sync_every > 0 with model.lora.r > 0 never syncs: the reference is the "
            "base model (the adapter switched off), which does not change; set it to 0"
        )
    if algo.ref_sync_every and algo.beta == 0:
        raise UserError(
            "algo.ref_sync_every > 0 syncs nothing with algo.beta=0 (no reference is held); "
            "set it to 0"
        )
    if config.model.offload_reference and not config.frozen_reference:
        raise UserError(
            "model.offload_reference=true offloads nothing: no frozen reference is held with "
            "algo.beta=0 or model.lora.r > 0; set it to null"
        )
    if algo.beta_warmup_steps and algo.beta == 0:
        raise UserError("algo.beta_warmup_steps > 0 ramps nothing with algo.beta=0; set it to 0")
    if algo.beta_warmup_steps and algo.kl_in_reward:
        raise UserError(
            "algo.beta_warmup_steps ramps the KL term of the loss, and algo.kl_in_reward=true "
            "puts the KL in the reward instead; set one of them off"
        )


def _check_data(config: Config) -> None:
    data = config.data
    # data.path replaces the task, so the task's settings would do nothing
    if data.path is not None and data.task_options:
        raise UserError("data.task_options applies to data.task, which data.path replaces")
    # a curriculum's own setting given for another curriculum would do nothing
    defaults = type(data)()
    for setting, curriculum in (
        ("curriculum_threshold", "difficulty"),
        ("curriculum_floor", "pass_rate"),
    ):
        if data.curriculum != curriculum and getattr(data, setting) != getattr(defaults, setting):
            raise UserError(
                f"data.{setting} applies to data.curriculum={curriculum}, not "
                f"{data.curriculum}; leave it out"
            )
    if data.path is not None and data.curriculum == "difficulty":
        raise UserError(
            "data.curriculum=difficulty needs a built-in task with difficulty levels (data.task), "
            "not data.path"
        )


def _check_reward(config: Config) -> None:
    reward = config.reward
    # overlong_penalty refuses it too, but only once the first rewards are computed.
    if reward.overlong_buffer > config.rollout.max_new_tokens:
        raise UserError(
            f"reward.overlong_buffer must be at most rollout.max_new_tokens "
            f"({config.rollout.max_new_tokens}), got {reward.overlong_buffer}"
        )
    # both measure a completion against max_new_tokens, which bounds each turn, not an episode
    # of turns and observations
    measured = "reward.overlong_buffer" if reward.overlong_buffer else None
    if any(spec.name == "length" for spec in reward.functions):
        measured = "the length reward"
    if measured and config.rollout.max_turns > 1:
        raise UserError(
            f"{measured} measures a completion against rollout.max_new_tokens, which bounds each "
            f"turn of an episode, not its {config.rollout.max_turns} turns and observations; "
            "drop it (algo.preset=dapo sets reward.overlong_buffer: set it to 0)"
        )


def check_given_settings(config: Config, given: set[str]) -> None:
    """A one-line error for a setting the user gave (`given`: dotted keys of the YAML file and
    the overrides) that the rest of the config leaves without effect: a run must not train as
    if it were honoured."""
    algo, lora = config.algo, config.model.lora
    from_file = config.data.path is not None
    configless = _without_configs(config.data.path, config.eval.path)
    data_unsplit = without_splits(config.data.path)
    eval_unsplit = without_splits(config.eval.path)
    unused = {
        "algo.dual_clip": (algo.loss == "cispo", "algo.loss=cispo bounds its weight itself"),
        "algo.norm_len": (
            algo.loss_agg != "seq-mean-token-sum-norm",
            "only algo.loss_agg=seq-mean-token-sum-norm divides by it",
        ),
        "algo.is_cap": (algo.is_correction == "none", "algo.is_correction=none corrects nothing"),
        "algo.max_resample": (not algo.dynamic_sampling, "algo.dynamic_sampling is off"),
        "reward.overlong_penalty": (
            not config.reward.overlong_buffer,
            "reward.overlong_buffer=0 turns the penalty off",
        ),
        "eval.path": (
            not from_file,
            "a built-in task or a verifiers environment evaluates on its own held-out rows",
        ),
        "eval.split": (
            (config.eval.path is None, "it picks a split of eval.path, which is unset")
            if not eval_unsplit
            else (True, f"eval.path {config.eval.path} is {eval_unsplit}, which has no splits")
        ),
        "data.split": (
            (not from_file, "it picks a split of data.path, which is unset")
            if not data_unsplit
            else (True, f"data.path {config.data.path} is {data_unsplit}, which has no splits")
        ),
        "data.config": (
            (not from_file, "it picks a config of data.path, which is unset")
            if not configless
            else (True, configless)
        ),
        "data.num_train": (from_file, "data.path's rows are its own; it sizes a built-in task's"),
        "data.task_options": (from_file, "data.path overrides data.task"),
        **{
            f"algo.{name}": (algo.estimator != "gae", "only algo.estimator=gae uses it")
            for name in ("gamma", "lam", "value_clip", "value_coef", "value_lr")
        },
        "algo.adv_scale": (algo.estimator == "gae", "algo.estimator=gae scales by the critic"),
        "algo.adv_eps": (
            (True, "algo.estimator=gae scales by the critic")
            if algo.estimator == "gae"
            else (algo.adv_scale == "none", "algo.adv_scale=none divides by no std")
        ),
        "algo.kl_in_reward": (algo.beta == 0, "algo.beta=0 puts no KL in the reward"),
        "algo.kl_estimator": (algo.beta == 0, "algo.beta=0 has no KL term to estimate"),
        **{
            f"model.lora.{name}": (not lora.r, "model.lora.r=0 trains no adapter")
            for name in ("alpha", "dropout", "target_modules", "save_adapter")
        },
        **{
            f"rollout.{name}": (config.rollout.env is None, "rollout.env is not set")
            for name in ("env_args", "env_timeout_s", "max_observation_tokens")
        },
        **{
            f"eval.{name}": (config.eval.num_prompts == 0, "eval.num_prompts=0 evaluates nothing")
            for name in ("every", "samples", "batch_rows")
        },
        **{
            f"log.{tracker}.{name}": (
                getattr(config.log, tracker).project is None,
                f"log.{tracker}.project is not set, so nothing is logged there",
            )
            for tracker, names in (("wandb", ("name", "mode")), ("trackio", ("name",)))
            for name in names
        },
    }
    for key in sorted(given):
        ignored, why = unused.get(key, (False, ""))
        if ignored:
            raise UserError(f"{key} has no effect here: {why}; drop it")
    asked = sorted(k for k in given if k in ("eval.every", "eval.samples", "eval.num_prompts"))
    if from_file and config.eval.path is None and asked:
        raise UserError(
            f"{asked[0]} has no effect here: data.path has no held-out rows of its own; set "
            "eval.path (a file or Hub dataset, eval.split) to evaluate"
        )


def _without_configs(data_path: str | None, eval_path: str | None) -> str:
    """Why data.config, which picks the config of whichever of `data_path` and `eval_path` is a
    Hub dataset, picks none: `data_path` and any `eval_path` are local data, a file or a
    directory (a saved dataset's, of one Dataset or a DatasetDict); else ""."""
    if data_path is None:
        return ""
    paths = {"data.path": data_path, "eval.path": eval_path}
    local = {name: local_kind(path) for name, path in paths.items() if path is not None}
    if not all(local.values()):
        return ""
    said = " and ".join(f"{name} {paths[name]} is {kind}" for name, kind in local.items())
    return f"{said}, {'which has no' if len(local) == 1 else 'neither of which has'} configs"
