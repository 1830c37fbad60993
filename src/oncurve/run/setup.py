"""Building a run from its config: devices, the run directory, data, rewards and the model;
the settings settled (`oncurve.run.settle`); then the policy and its reference, the optimizer, the
advantage source and the sampler assembled, and the checkpoint resumed.

Everything the loop (`oncurve.loop.trainer`) holds between steps is built here, in the order the
pieces depend on each other, and kept in one `Session` (`oncurve.run.session`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from oncurve import distributed
from oncurve.advantages.sources import AdvantageSource, build_advantage_source
from oncurve.algo.registry import (
    AGGREGATIONS,
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    lookup,
)
from oncurve.config import AlgoConfig, Config, check_ranks, to_dict
from oncurve.config.resume_settings import (
    DATA_ROWS,
    EVAL_ROWS,
    ROWS_DIGEST,
    apply_optimizer_settings,
    changed_settings,
    data_fingerprint,
    prompt_answer_fingerprint,
    refusal,
)
from oncurve.data.curriculum import build_curriculum, curriculum_notes
from oncurve.data.given import given_argument, streamed
from oncurve.data.prompts import (
    PromptData,
    correctness_fn,
    correctness_name,
    encode_prompt,
    load_prompts,
)
from oncurve.envs.verifiers_envs import PREFIX as VERIFIERS_PREFIX
from oncurve.envs.verifiers_envs import GroupPlay, load_environment
from oncurve.errors import UserError
from oncurve.model import packed_attention
from oncurve.model.compiled_layers import compile_decoder_layers
from oncurve.model.devices import cap_gpu_memory, resolve_device, resolve_dtype
from oncurve.model.sources import (
    hub_commit,
    is_hub_id,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from oncurve.model.weights import add_lora, enable_gradient_checkpointing
from oncurve.rewards.registry import GIVEN_PREFIX
from oncurve.rewards.runner import RewardRunner
from oncurve.rewards.trl_contract import TrlReward
from oncurve.rollout import Sampler, SamplerSettings, backend_named
from oncurve.rollout.base import check_room, check_stops
from oncurve.rollout.env_calls import EnvFaults
from oncurve.rollout.episodes import (
    EpisodeSettings,
    ObservationFormat,
    feed_overhead,
    observation_role,
    resolve_environment,
)
from oncurve.rollout.harness import PREFIX as HARNESS_PREFIX
from oncurve.rollout.harness import HarnessSettings, resolve_harness
from oncurve.run import checkpoint, oom
from oncurve.run.metrics import (
    MetricsLogger,
    require_tensorboard,
    start_trackers,
    truncate_after,
)
from oncurve.run.rewards import build_rewards
from oncurve.run.rundir import prepare_run_dir, removed_if_not_started
from oncurve.run.session import REFERENCE, Session, forward_settings
from oncurve.run.settle import (
    LOCAL_PATHS,
    RunFacts,
    same_local_path,
    settle,
    settle_loading,
    settle_paths,
)
from oncurve.update.adamw import AdamW as StochasticRoundingAdamW
from oncurve.update.policy import Policy
from oncurve.update.step import LossFns


def setup(config: Config, checks: Callable[[Session], None] | None = None) -> Session:
    """Build the session: settle the config, load and assemble the run; resume if asked.
    `checks(session)` runs once the session is built, before the run's trackers start and
    before anything it replaces is deleted or its config.yaml written: a run that a check
    refuses (a reference the reward cannot pay, a failed preflight, a stop) leaves a previous
    run in its directory as it was; a start that fails in a run directory it created, before
    writing a file there, removes that directory again (`removed_if_not_started`)."""
    config = settle_paths(config)
    device, rank, world_size = start_devices(config)
    run_dir, resume_from, replaced = prepare_run_dir(config, rank)
    with removed_if_not_started(run_dir):
        if config.run.threads:
            torch.set_num_threads(config.run.threads)
        torch.manual_seed(config.run.seed)
        model_path = resolve_model_path(config.model.path, config.model.revision)
        tokenizer = load_tokenizer(model_path, config.model.trust_remote_code)
        check_stops(config.rollout.stop, tokenizer, "rollout.stop")
        data, eval_data, task = prompt_data(config, tokenizer)
        revision = hub_commit(model_path) if is_hub_id(config.model.path) else None
        config = settle_loading(config, resolve_dtype("auto", device), revision)
        model = load_model(model_path, config.model.dtype, device, config.model.trust_remote_code)
        episodes = episode_settings(config, tokenizer)
        longest = max(len(row["prompt_ids"]) for row in prompt_rows(data, eval_data))
        seq_len = longest + completion_room(config, episodes, longest, model.config)
        hub_id = config.model.path if revision is not None else None
        peft_model = (
            add_lora(model, config.model.lora, hub_id, revision) if config.model.lora.r else None
        )
        if peft_model is not None:
            model = peft_model.get_base_model()
        # before the memory plan, which counts a reward model's weights
        rewards = build_rewards(config, task, device)
        facts = RunFacts.gather(
            config,
            model,
            world_size,
            seq_len=seq_len,
            saved_memory=checkpoint.read_state(resume_from).get("memory") if resume_from else None,
            evaluates=eval_data is not None and (config.eval.at_start_end or config.eval.every > 0),
            reward_bytes=rewards.memory_bytes(),
        )
        settled = settle(config, facts)
        config = settled.config
        if rank == 0:
            for line in settled.report + startup_notes(config, rewards, data, eval_data, task):
                print(line, file=sys.stderr)
        policy, advantage = assemble_policy(config, model, peft_model, world_size)
        fsdp = config.dist.fsdp and world_size > 1
        optimizer = build_optimizer(policy.trainable(), config, sharded=fsdp)
        s = Session(
            config=config,
            run_dir=run_dir,
            device=device,
            policy=policy,
            tokenizer=tokenizer,
            sampler=make_sampler(config, policy.whole_model, tokenizer, longest),
            data=data,
            eval_data=eval_data,
            rewards=rewards,
            correct=correctness_fn(config, task),
            correct_name=correctness_name(config, task),
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(config)),
            loss_fns=build_loss_fns(config),
            advantage=advantage,
            episodes=episodes,
            curriculum=build_curriculum(config, data.rows),
            # writes nothing: the run's own opens once a resume is settled (a refused one starts no
            # tracker run) and knows the step its TensorBoard events continue from
            logger=MetricsLogger(run_dir, enabled=False),
            rank=rank,
            world_size=world_size,
            data_fingerprint=data_fingerprint(data.rows),
            eval_fingerprint="" if eval_data is None else data_fingerprint(eval_data.rows),
        )
        if resume_from is not None:
            _resume(s, resume_from)
        if checks is not None:
            checks(s)
        # The run is set up and checked; its trackers start before what it replaces goes, so that one that
        # cannot start leaves a previous run whole.
        trackers = []
        if rank == 0:
            if s.config.log.tensorboard:
                require_tensorboard()
            trackers = start_trackers(
                run_dir, wandb=_wandb_settings(s.config), trackio=_trackio_settings(s.config)
            )
        # before the metrics are cut back to the resumed step: a crash between the two then leaves
        # checkpoints and metrics that agree
        replaced.remove()
        if resume_from is not None and rank == 0:
            # at the last step, an evaluation row is the final one's, which a stop cut short of the
            # final save: the resume evaluates again
            done = s.start_step == s.config.run.steps and s.config.eval.at_start_end
            truncate_after(run_dir, s.start_step, drop_evaluation=done)
        s.logger = MetricsLogger(
            run_dir,
            tensorboard=s.config.log.tensorboard,
            enabled=rank == 0,
            trackers=trackers,
            start_step=s.start_step,
        )
        policy.release()
        s.writes_run_dir = True
        s.record_settings()
        return s


def start_devices(config: Config) -> tuple[torch.device, int, int]:
    """The run's device (torchrun's local GPU under CUDA, capped at `run.gpu_memory_gb`), this
    process's rank and the number of ranks, the process group started where there are several;
    the ranks checked against the batch's groups (`check_ranks`)."""
    device = resolve_device(config.run.device)
    rank, world_size = distributed.init_distributed(device.type, config.dist.timeout_s)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # torchrun's LOCAL_RANK
        if config.run.gpu_memory_gb is not None:
            cap_gpu_memory(device, config.run.gpu_memory_gb)
    check_ranks(config, world_size)
    return device, rank, world_size


def prompt_data(config: Config, tokenizer: Any) -> tuple[PromptData, PromptData | None, Any]:
    """The training prompts, the held-out ones (None without), both encoded with the run's
    chat template, and the task they come from (its answer checker and rewards)."""
    train_rows, eval_rows, task = load_prompts(config)
    data = PromptData(train_rows, tokenizer, config.data, seed=config.run.seed)
    eval_data = (
        PromptData(eval_rows, tokenizer, config.data, seed=config.run.seed)
        if eval_rows and config.eval.num_prompts != 0
        else None
    )
    return data, eval_data, task


def prompt_rows(data: PromptData, eval_data: PromptData | None) -> list[dict]:
    """Every prompt the run samples from: training's, then the held-out ones."""
    return data.rows + (eval_data.rows if eval_data is not None else [])


def completion_room(
    config: Config,
    episodes: EpisodeSettings | HarnessSettings | None,
    longest: int,
    model_config: Any,
) -> int:
    """The most tokens a completion (or a whole episode) may take after the `longest` prompt;
    an error naming the setting when that does not fit the model's positions."""
    if episodes is None:
        room, setting = config.rollout.max_new_tokens, "rollout.max_new_tokens"
    else:
        room = episodes.budget(config.rollout.max_new_tokens)
        setting = (
            "an episode (rollout.max_turns turns of rollout.max_new_tokens, "
            "rollout.max_observation_tokens per observation)"
        )
    check_room(longest, room, model_config, setting)
    return room


def assemble_policy(
    config: Config,
    model: torch.nn.Module,
    peft_model: torch.nn.Module | None,
    world_size: int,
) -> tuple[Policy, AdvantageSource]:
    """The policy (with its reference and data-parallel wrapper) and the advantage source, on
    the loaded `model` as the settled `config` runs it: packed attention, gradient
    checkpointing, compiled layers."""
    if config.model.pack_rows:
        packed_attention.use_packed_attention(model)
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    forward = forward_settings(model, config)
    # before the policy's data-parallel wrapper: a critic copies the trunk's whole weights
    advantage = build_advantage_source(config, model, forward)
    if config.model.compile_layers:  # before the reference copy and FSDP2's layer classes
        compile_decoder_layers(model)
    policy = Policy(
        model,
        forward=forward,
        peft_model=peft_model,
        with_reference=config.algo.beta > 0,
        offload_reference=bool(config.model.offload_reference),
        fsdp=config.dist.fsdp and world_size > 1,
    )
    return policy, advantage


def _wandb_settings(config: Config) -> dict[str, Any] | None:
    """`MetricsLogger`'s W&B settings (the run's config among them), None when log.wandb is off."""
    wandb = config.log.wandb
    if wandb.project is None:
        return None
    return {
        "project": wandb.project,
        "name": wandb.name,
        "mode": wandb.mode,
        "config": to_dict(config),
    }


def _trackio_settings(config: Config) -> dict[str, Any] | None:
    """`MetricsLogger`'s trackio settings (the run's config among them), None when log.trackio
    is off."""
    trackio = config.log.trackio
    if trackio.project is None:
        return None
    return {"project": trackio.project, "name": trackio.name, "config": to_dict(config)}


def _resume(s: Session, checkpoint_dir: Path) -> None:
    """Load the checkpoint into the session. Its ranks and settings are compared first, from its
    `state.json`: a changed setting is named before any tensor that would not fit it loads.
    Nothing is deleted here: the caller removes what the run replaces once it is set up."""
    saved = checkpoint.read_state(checkpoint_dir)
    checkpoint.check_saved_ranks(checkpoint_dir, saved, s.world_size)
    s.start_step = int(saved["step"])
    changes = _changes(s, saved, checkpoint_dir)
    # A reference the checkpoint does not hold was never synced (or the run had algo.beta=0):
    # it is the initial model, as the policy's was built; one it holds is the run's, restored
    # (`checkpoint_extras` then names it). `_changes` refused a switch to or from a critic, so
    # the checkpoint holds the advantage source's state.
    held_reference = REFERENCE in checkpoint.saved_modules(checkpoint_dir)
    s.policy.reference_synced = held_reference and s.policy.reference is not None
    modules, optimizers = s.checkpoint_extras()
    state = checkpoint.load_checkpoint(
        checkpoint_dir,
        s.policy.whole_model,
        s.optimizer,
        s.scheduler,
        modules=modules,
        optimizers=optimizers,
        trainable_only=s.config.model.lora.r > 0,
    )
    if held_reference and s.policy.reference is None and s.rank == 0:
        print(
            f"note: {checkpoint_dir} holds a synced reference, which this run, without a KL "
            "term, does not keep: a later resume with one starts its reference from model.path",
            file=sys.stderr,
        )
    if s.policy.fsdp:
        distributed.scatter_weights(s.policy.whole_model, s.policy.model)
    shrunk = state.get("oom_settings") or {}
    if shrunk:
        s.adopt(oom.with_settings(s.config, shrunk))
        s.shrunk, s.counts.oom_retries = dict(shrunk), 0
        if s.rank == 0:
            print(
                "resuming with the settings the run made smaller after running out of memory: "
                + ", ".join(f"{key}={value}" for key, value in shrunk.items()),
                file=sys.stderr,
            )
    s.counts.completion_tokens = int(state.get("completion_tokens", 0))
    if s.curriculum is not None:
        if "curriculum" not in state:
            raise UserError(
                f"checkpoint {checkpoint_dir} was written without data.curriculum="
                f"{s.config.data.curriculum}; resume it with the curriculum it had"
            )
        s.curriculum.load_state_dict(state["curriculum"])
    s.config_history = list(state.get("config_history", []))
    if changes:
        _apply_changes(s, changes)


def _changes(s: Session, state: dict, checkpoint_dir: Path) -> dict[str, list[Any]]:
    """The session's settings that differ from the checkpoint's (`oncurve.config.resume_settings`),
    by dotted name: `[saved, current]`; a UserError naming the first that cannot apply."""
    if "config" not in state:  # a checkpoint from before settings were kept
        return {}
    changes = changed_settings(state["config"], to_dict(s.config))
    for setting in LOCAL_PATHS:
        if setting in changes and same_local_path(*changes[setting]):
            del changes[setting]
    saved = state.get("data_fingerprint")
    current = s.data_fingerprint
    if saved is not None and not saved.startswith(ROWS_DIGEST):  # an older version's digest
        current = prompt_answer_fingerprint(s.data.rows)
    fingerprints = (saved, current)
    forced = s.config.run.force_changes
    rows_why = None
    if "run.steps" in changes and streamed("train_dataset"):  # more steps read other rows
        old, new = changes["run.steps"]
        read = s.config.data.prompts_per_step * new
        rows_why = (
            f"run.steps was {old} and is now {new}, and the train_dataset streams its rows, of "
            "which a run reads data.prompts_per_step x run.steps: it would train on others; "
            f"resume with run.steps={old}, force it with run.force_changes=[{DATA_ROWS}] (the "
            f"remaining steps draw from the {read} rows read then), or start a new run.dir"
        )
    why = refusal(changes, s.start_step, s.config.run.steps, fingerprints, forced, rows_why)
    trained_on = given_argument(changes.get("data.path", [None])[0])
    if trained_on and "data.path" not in forced:  # said before the setting's own refusal
        why = (
            f"data.path was the {trained_on} passed to oncurve.train: resume it from Python "
            f"with it again, oncurve.train(config, {trained_on}=...)"
        )
    if why is None and "reward.functions" in changes:
        saved, current = ({f["name"] for f in fns or []} for fns in changes["reward.functions"])
        if missing := sorted(n for n in saved - current if n.startswith(GIVEN_PREFIX)):
            why = (
                f"reward.functions had {', '.join(missing)}, passed to "
                "oncurve.train(reward_funcs=...): resume it from Python with them again"
            )
    if why is not None:
        raise UserError(f"cannot resume {checkpoint_dir}: {why}")
    if fingerprints[0] is not None and fingerprints[0] != fingerprints[1]:
        changes[DATA_ROWS] = list(fingerprints)  # forced: said and kept like any change
    # other held-out rows under the same eval.path: said as another eval.path is
    held_out = (state.get("eval_fingerprint"), s.eval_fingerprint)
    if all(held_out) and held_out[0] != held_out[1] and "eval.path" not in changes:
        changes[EVAL_ROWS] = list(held_out)
    return changes


def _apply_changes(s: Session, changes: dict[str, list[Any]]) -> None:
    """Put the `changes` in effect after the checkpoint loaded (the optimizer's saved state
    would keep the old hyperparameters), say them and add them to the run's history."""
    o = s.config.optim
    apply_optimizer_settings(s.optimizer, s.scheduler, o.lr, (o.beta1, o.beta2), o.weight_decay)
    s.advantage.adopt_settings(s.config)  # a critic's own optimizer
    s.config_history.append({"step": s.start_step, "changed": changes})
    if s.rank == 0:
        said = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())
        print(f"resuming at step {s.start_step} with changed settings: {said}", file=sys.stderr)


def build_loss_fns(config: Config) -> LossFns:
    """The per-token objective's pieces, looked up by name from the config."""
    algo = config.algo
    return LossFns(
        policy_loss=lookup(POLICY_LOSSES, algo.loss),
        aggregate=lookup(AGGREGATIONS, algo.loss_agg),
        kl=lookup(KL_ESTIMATORS, algo.kl_estimator),
        beta=0.0 if algo.kl_in_reward else algo.beta,
        eps_low=algo.epsilon,
        eps_high=config.epsilon_high,
        dual_clip=algo.dual_clip,
        norm_len=float(algo.norm_len or config.rollout.max_new_tokens),
        is_correction=(
            None
            if algo.is_correction == "none" or not algo.is_cap
            else lookup(IS_CORRECTIONS, algo.is_correction)
        ),
        is_cap=algo.is_cap or 0.0,
    )


def make_sampler(config: Config, model: torch.nn.Module, tokenizer: Any, longest: int) -> Sampler:
    """The run's sampler, prepared with the run's settings (`rollout.cuda_graphs`,
    `rollout.compile`) and its `longest` prompt, so that no step meets a wider one."""
    sampler = backend_named(config.rollout.backend, model).build(model, tokenizer)
    r = config.rollout
    sampler.prepare(SamplerSettings(longest, bool(r.cuda_graphs), bool(r.compile)))
    return sampler


def episode_settings(config: Config, tokenizer: Any) -> EpisodeSettings | HarnessSettings | None:
    """How multi-turn episodes are played with `rollout.env` (by an agent harness against the
    endpoint for `harness:module:function` and `verifiers:NAME`), or None without one."""
    r = config.rollout
    if r.env is None:
        return None
    faults = EnvFaults(r.env_timeout_s, config.reward.errors, config.reward.timeout_score)
    template_kwargs = config.data.chat_template_kwargs
    if r.env.startswith((HARNESS_PREFIX, VERIFIERS_PREFIX)):
        if r.env.startswith(HARNESS_PREFIX):
            play, groups = resolve_harness(r.env), False
        else:
            play, groups = GroupPlay(load_environment(r.env, r.env_args), r.max_turns), True
        return HarnessSettings(
            play,
            r.max_turns,
            r.max_observation_tokens,
            faults,
            groups,
            observation_overhead=feed_overhead(tokenizer, template_kwargs),
            chat_template_kwargs=template_kwargs,
        )
    make_env = resolve_environment(r.env, r.env_args)
    return EpisodeSettings(
        make_env=make_env,
        max_turns=r.max_turns,
        encode_prompt=lambda text: encode_prompt(tokenizer, text, config.data, "rollout.env"),
        observation=ObservationFormat(
            tokenizer,
            config.data.chat_template,
            r.max_observation_tokens,
            role=observation_role(make_env),
            template_kwargs=template_kwargs,
        ),
        faults=faults,
    )


def startup_notes(
    config: Config,
    rewards: RewardRunner,
    data: PromptData,
    eval_data: PromptData | None = None,
    task: Any = None,
) -> list[str]:
    """What the start-up report says of the run's choices beyond the settled ones: a LoRA
    dropout (which no forward applies), a clip or cap that an on-policy update never reaches
    (`_unreached_clip`), fewer training rows than a step takes (or than a difficulty level
    holds), held-out prompts that are training prompts too, fewer held-out
    problems in a task than eval.num_prompts asks or more rows in eval.path than it takes, the
    column the reference answers were found in when the config does not name it and it is not
    `answer`, an `answer` column that `module:function` rewards get otherwise than stored (TRL
    passes it as stored), and which rewards the curriculum and dynamic sampling read."""
    notes = []
    if config.model.lora.r and config.model.lora.dropout:
        notes.append(
            f"warning: model.lora.dropout={config.model.lora.dropout} does nothing: every "
            "forward of a step runs without dropout, so that the update's ratios compare like "
            "with like"
        )
    unreached = _unreached_clip(config.algo)
    if unreached:
        notes.append(
            f"warning: {unreached} never binds with algo.mu=1 and algo.minibatches=1: the "
            "update is on-policy, so every importance ratio is 1; set algo.minibatches or "
            "algo.mu above 1"
        )
    rows, per_step = len(data.rows), config.data.prompts_per_step
    if rows < per_step:
        notes.append(
            f"data: {rows} training rows, fewer than data.prompts_per_step={per_step}: each step "
            "repeats prompts"
        )
    notes.extend(curriculum_notes(config, data.rows))
    evaluates = config.eval.at_start_end or config.eval.every > 0
    if eval_data is not None and evaluates:
        seen = {tuple(row["prompt_ids"]) for row in data.rows}
        evaluated = eval_data.rows[: config.eval.num_prompts]  # the rows evaluation scores
        shared = sum(tuple(row["prompt_ids"]) in seen for row in evaluated)
        if shared:
            notes.append(
                f"eval: {shared} of the {len(evaluated)} held-out prompts are training "
                "prompts too: held-out accuracy is measured partly on the training set"
            )
    asked = config.eval.num_prompts
    if task is not None and eval_data is not None and asked and len(eval_data.rows) < asked:
        notes.append(
            f"eval: {task.name} has {len(eval_data.rows)} test problems, fewer than "
            f"eval.num_prompts={asked}: each evaluation scores them all"
        )
    if (
        config.eval.path
        and eval_data is not None
        and evaluates
        and asked
        and len(eval_data.rows) > asked
    ):
        notes.append(
            f"eval: {given_argument(config.eval.path) or config.eval.path} has "
            f"{len(eval_data.rows)} rows; each evaluation scores "
            f"the first eval.num_prompts={asked} (null, or a larger number, for them all)"
        )
    found = data.rows[0].answer_field
    if config.data.answer_field is None and found not in ("", "answer"):
        notes.append(f"data: reference answers from column {found!r} (there is no 'answer')")
    if found == "answer" and any(isinstance(fn, TrlReward) for _, fn, _ in rewards.fns):
        # TRL passes the column as stored; a reward comparing with a number or parsing the
        # whole text would score otherwise here without a word
        read = next((row for row in data.rows if _read_otherwise(row)), None)
        if read is not None:
            notes.append(
                "data: column 'answer' reaches module:function rewards as the reference text "
                f"oncurve reads off it ({read['answer']!r} for the stored {read['answer_raw']!r}), "
                "where TRL passes it as stored; as stored, it is column 'answer_raw'"
            )
    correct = "" if rewards.verifier else " (no reward is the one evaluation calls correct)"
    if config.data.curriculum != "none":
        notes.append(
            f"data.curriculum={config.data.curriculum} reads each group's pass rate from its "
            f"{rewards.filter_name} rewards"
            + ("" if rewards.verifier else ", clipped to [0, 1]" + correct)
        )
    if config.algo.dynamic_sampling:
        notes.append(
            f"dynamic sampling keeps the groups whose {rewards.filter_name} rewards differ"
            + correct
        )
    return notes


def _read_otherwise(row: dict[str, Any]) -> bool:
    """Whether `row`'s answer as stored (`answer_raw`, kept by `load_rows` where the answers
    were read otherwise) is other than the text read off it."""
    raw = row.get("answer_raw")
    return raw is not None and (type(raw) is not str or raw != row["answer"])


def _unreached_clip(algo: AlgoConfig) -> str:
    """The bound of `algo`'s loss that only an off-policy ratio reaches, named, where the
    update is on-policy (`algo.mu * algo.minibatches` = 1: the old logprobs are the current
    ones, every ratio 1): GSPO's clip, CISPO's cap, a clip-higher bound; "" otherwise. A
    symmetric PPO clip at mu=1 is DeepSeekMath's GRPO as meant, and not named."""
    if algo.mu * algo.minibatches > 1:
        return ""
    if algo.loss == "gspo":
        return "algo.loss=gspo's clip of the sequence ratio"
    if algo.loss == "cispo":
        return "algo.loss=cispo's cap of the weight"
    if algo.loss == "ppo_clip" and algo.epsilon_high is not None:
        return f"algo.epsilon_high={algo.epsilon_high}"
    return ""


def build_optimizer(
    params: list[torch.nn.Parameter], config: Config, sharded: bool
) -> torch.optim.Optimizer:
    """AdamW: oncurve's, which rounds bfloat16 updates stochastically, where some weight is
    bfloat16 (and not an FSDP2 shard), its update compiled on CUDA; torch's fused one
    otherwise."""
    o = config.optim
    settings = {"lr": o.lr, "betas": (o.beta1, o.beta2), "weight_decay": o.weight_decay}
    bf16 = any(p.dtype == torch.bfloat16 for p in params)
    if bf16 and o.stochastic_rounding and not sharded:
        cuda = any(p.is_cuda for p in params)
        return StochasticRoundingAdamW(
            params, seed=config.run.seed, compile_update=cuda, **settings
        )
    # fused: one kernel per parameter instead of a dozen elementwise passes
    return torch.optim.AdamW(params, fused=True, **settings)


def lr_schedule(config: Config):
    """The learning-rate factor of each step: linear warmup, then constant or a half cosine
    towards 0, which it would reach at step `run.steps` (the last step trains at
    0.5 * (1 + cos(pi * (S - 1 - w) / (S - w))), as Hugging Face's schedule does)."""
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
