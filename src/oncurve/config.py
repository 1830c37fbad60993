"""Run configuration: nested dataclasses, YAML loading, dotted overrides and validation.

Sections follow the data flow: model, data, rollout, reward, algo, optim, eval, log, run, dist.
Precedence, lowest first: field defaults, the algorithm preset named by `algo.preset` (which may
set keys of any section), the defaults of the chosen `algo.estimator`, the YAML file, then
command-line overrides (`algo.beta=0.0`). Every field documents itself through its `help`
metadata; `describe()` prints them all. Errors are one line naming the field; a key that was
renamed or moved (`RENAMED`) names its new place.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oncurve.errors import UserError

Check = Callable[[Any], str | None]


def _opt(default: Any, help: str, check: Check | None = None, choices: tuple | None = None):
    meta = {"help": help, "check": check, "choices": choices}
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _range(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False):
    """A check that a number lies in an interval, with the interval in its message."""
    text = (
        f"{'(' if low_open else '['}{'-inf' if low is None else low}, "
        f"{'inf' if high is None else high}{')' if high_open or high is None else ']'}"
    )

    def check(value: Any) -> str | None:
        if value is None:
            return None
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        return f"must be in {text}" if too_low or too_high else None

    return check


POSITIVE = _range(0, None, low_open=True)


def _device_check(value: str) -> str | None:
    kind, _, index = value.partition(":")
    if kind in ("cpu", "auto") and not index or kind == "cuda" and (not index or index.isdigit()):
        return None
    return "must be cpu, cuda, cuda:N or auto"


NON_NEGATIVE = _range(0, None)
UNIT_OPEN = _range(0, 1, low_open=True, high_open=True)


def _tis_cap_check(value: float | None) -> str | None:
    if value is None or value == 0 or value >= 1:
        return None
    return "must be 0 (off) or at least 1 (a cap below 1 scales every token's loss down)"


@dataclass
class LoraConfig:
    r: int = _opt(0, "LoRA rank; 0 trains every weight (extra `lora` installs peft)", NON_NEGATIVE)
    alpha: float = _opt(16.0, "LoRA scaling numerator (scale = alpha / r)", POSITIVE)
    dropout: float = _opt(0.0, "dropout on the LoRA input", _range(0, 1, high_open=True))
    target_modules: list[str] = _opt(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names that get adapters",
    )
    save_adapter: bool = _opt(False, "also write the adapter alone to final/adapter")


@dataclass
class ModelConfig:
    path: str = _opt(
        "default",
        "local Hugging Face model directory, Hub id (owner/name: downloaded into the Hugging "
        "Face cache, or read from it offline), .gguf file (extra `gguf`), or `default` (the "
        "bundled model)",
    )
    revision: str | None = _opt(
        None,
        "branch, tag or commit of a Hub model.path; null: main. The run's config.yaml records "
        "the commit used",
    )
    dtype: str = _opt(
        "auto",
        "weights and compute dtype; auto: bfloat16 on a GPU that supports it, else float32",
        choices=("auto", "float32", "bfloat16"),
    )
    trust_remote_code: bool = _opt(False, "allow custom modelling code shipped with the model")
    gradient_checkpointing: bool | None = _opt(
        None,
        "recompute activations in backward to save memory; null: off on CPU, from the memory "
        "plan on CUDA",
    )
    share_prompt_forward: bool = _opt(
        True,
        "in the update and the reference pass, run each group's prompt once and share its KV "
        "cache with the group's completions (not under gradient checkpointing or FSDP)",
    )
    logprob_chunk_size: int | None = _opt(
        None,
        "positions per chunk when forming logits, bounding the [chunk, vocab] peak; null: 1024, "
        "on CUDA fewer where a chunk's float32 logits would pass 256 MiB",
        POSITIVE,
    )
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class DataConfig:
    task: str | None = _opt(
        "arith",
        "built-in task (arith, countdown, sums, code, gym:<name>); its generator and rewards",
    )
    path: str | None = _opt(
        None,
        "JSONL/CSV/Parquet file, saved dataset dir, or Hugging Face Hub dataset id (owner/name, "
        "extra `data`; a local path wins); overrides task",
    )
    config: str | None = _opt(None, "config name of a Hub dataset (e.g. main for openai/gsm8k)")
    split: str = _opt("train", "split of a Hub dataset to train on")
    prompt_field: str = _opt("prompt", "column holding the prompt text")
    answer_field: str = _opt("answer", "column holding the reference answer")
    prompts_per_step: int = _opt(16, "prompts (groups) per training step, B", POSITIVE)
    num_train: int = _opt(20000, "examples a built-in task generates for training", POSITIVE)
    system_prompt: str | None = _opt(None, "system message placed before each prompt")
    chat_template: bool = _opt(False, "format prompts with the tokenizer's chat template")
    max_prompt_tokens: int = _opt(512, "longest prompt accepted; longer is an error", POSITIVE)
    task_options: dict[str, Any] = _opt(
        {},
        "keyword arguments of the built-in task: arith max_digits, min_digits; countdown "
        "counts, max_number; gym:<name> its reasoning-gym dataset config",
    )
    curriculum: str = _opt(
        "none",
        "which prompts a step samples (oncurve.curriculum): none, the seeded order; pass_rate, "
        "fewer of those that every completion or none solved in their last visits; difficulty, "
        "the task's easiest level first, one up each time the rolling sampled accuracy reaches "
        "data.curriculum_threshold",
        choices=("none", "pass_rate", "difficulty"),
    )
    curriculum_threshold: float = _opt(
        0.8,
        "data.curriculum=difficulty: the rolling sampled accuracy that moves to the next level",
        _range(0, 1, low_open=True),
    )
    curriculum_floor: float = _opt(
        0.1,
        "data.curriculum=pass_rate: sampling weight, against 1 for an untried prompt, that a "
        "prompt every completion or none solved keeps, so that it is tried again",
        _range(0, 1, low_open=True),
    )


@dataclass
class RolloutConfig:
    group_size: int = _opt(8, "completions sampled per prompt, G", _range(2, None))
    max_new_tokens: int = _opt(64, "longest completion; longer ones are cut", POSITIVE)
    min_new_tokens: int = _opt(0, "EOS is suppressed until this many tokens", NON_NEGATIVE)
    temperature: float = _opt(1.0, "sampling temperature (also scales training logprobs)", POSITIVE)
    top_p: float = _opt(1.0, "nucleus sampling mass", _range(0, 1, low_open=True))
    top_k: int = _opt(0, "keep the k most likely tokens; 0 keeps all", NON_NEGATIVE)
    min_p: float = _opt(0.0, "drop tokens below min_p x the top probability", _range(0, 1))
    stop: list[str] = _opt([], "stop strings that end a completion")
    backend: str = _opt(
        "auto",
        "sampler backend (oncurve.rollout.BACKENDS: hf, cpu_llama, cuda_graph): auto picks "
        "cpu_llama on the CPU and cuda_graph on CUDA for the models they support, else hf",
    )
    env: str | None = _opt(
        None,
        "multi-turn environment: python_tool or a `module:Class` path (docs/environments.md); "
        "null samples one completion per episode",
    )
    env_args: dict[str, Any] = _opt({}, "keyword arguments of rollout.env's class")
    max_turns: int = _opt(
        1, "policy turns per episode with rollout.env; max_new_tokens bounds each", POSITIVE
    )
    max_observation_tokens: int = _opt(
        256, "an observation's text is cut to this many tokens before it is fed", POSITIVE
    )


@dataclass
class RewardFnConfig:
    name: str = _opt("correct", "built-in reward name or `module:function` import path")
    weight: float = _opt(1.0, "weight of this reward in the sum")


@dataclass
class RewardConfig:
    functions: list[RewardFnConfig] = _opt(
        [], "reward functions with weights; empty uses the task's own rewards"
    )
    timeout: float | None = _opt(
        10.0, "seconds a reward call may take before it is stopped; null waits forever", POSITIVE
    )
    timeout_score: float | None = _opt(
        None, "score of a reward call stopped by reward.timeout; null leaves the row out"
    )
    errors: str = _opt(
        "raise", "a reward fn that raises: stop the run, or score None", choices=("raise", "none")
    )
    overlong_buffer: int = _opt(
        0,
        "DAPO soft overlong penalty window in tokens, at most rollout.max_new_tokens; 0 off",
        NON_NEGATIVE,
    )
    overlong_penalty: float = _opt(1.0, "DAPO overlong penalty at max length", NON_NEGATIVE)
    sandbox_workers: int | None = _opt(
        None,
        "programs the code_tests reward runs at once in the sandbox; null: the CPUs this "
        "process may use (at most 64)",
        _range(1, 64),  # oncurve.sandbox.MAX_PARALLEL
    )
    sandbox_timeout_s: float = _opt(
        5.0, "seconds one code_tests test run may take; a longer one fails its test", POSITIVE
    )
    sandbox_memory_mb: int = _opt(
        512, "memory cap (MiB) of one code_tests test run; more fails its test", POSITIVE
    )


@dataclass
class AlgoConfig:
    preset: str = _opt(
        "grpo",
        "named bundle of the fields below (dapo also sets reward.overlong_buffer): grpo "
        "(DeepSeekMath), dr_grpo, dapo, gspo, ppo",
        choices=("grpo", "dr_grpo", "dapo", "gspo", "ppo"),
    )
    estimator: str = _opt(
        "grpo",
        "advantage estimator: grpo (group z-score), rloo (leave-one-out; algo.adv_scale "
        "defaults to none with it, whatever the preset), gae (PPO with a critic)",
        choices=("grpo", "rloo", "gae"),
    )
    adv_scale: str = _opt(
        "group",
        "divide advantages by the group std, the batch std, or not at all (none by default "
        "with algo.estimator=rloo)",
        choices=("group", "batch", "none"),
    )
    adv_eps: float = _opt(1e-6, "added to the std before dividing", POSITIVE)
    loss: str = _opt(
        "ppo_clip",
        "per-token policy loss (gspo only with loss_agg seq-mean-token-mean)",
        choices=("ppo_clip", "gspo", "cispo"),
    )
    loss_agg: str = _opt(
        "seq-mean-token-mean",
        "how token losses become one number",
        choices=("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"),
    )
    epsilon: float = _opt(0.2, "clip range below 1 (and above, unless epsilon_high)", UNIT_OPEN)
    epsilon_high: float | None = _opt(None, "clip range above 1 (DAPO clip-higher)", UNIT_OPEN)
    dual_clip: float | None = _opt(
        None, "dual-clip constant c > 1 bounding negative-A loss", _range(1, None, low_open=True)
    )
    tis_cap: float | None = _opt(
        None,
        "truncated importance-sampling cap: each token's policy loss is weighted by "
        "min(pi_old / pi_sampler, cap); null: 2.0 with the cuda_graph sampler, whose kernels "
        "differ from the training forward's, 0 (off) with the others, whose logprobs equal it "
        "to float rounding; 0 off",
        _tis_cap_check,
    )
    beta: float = _opt(
        0.04, "weight of KL(pi || pi_ref) in the loss; 0 loads no reference", NON_NEGATIVE
    )
    kl_estimator: str = _opt(
        "k3",
        "per-token KL estimator; in the loss, k3's gradient is that of KL(pi_ref || pi) (as in "
        "TRL and verl) and k2's that of KL(pi || pi_ref); k1's is zero in expectation, so k1 "
        "only with algo.kl_in_reward=true (or beta=0)",
        choices=("k1", "k2", "k3"),
    )
    mu: int = _opt(1, "optimisation passes over each sampled batch", POSITIVE)
    minibatches: int = _opt(1, "optimizer steps per pass (the batch split in this many)", POSITIVE)
    norm_len: int | None = _opt(
        None, "Dr.GRPO constant length normaliser; default max_new_tokens", POSITIVE
    )
    beta_warmup_steps: int = _opt(
        0,
        "ramp the KL weight linearly from 0 to algo.beta over this many steps (logged as "
        "kl/beta; the reference is loaded from step 1); 0 keeps algo.beta constant",
        NON_NEGATIVE,
    )
    ref_sync_every: int = _opt(
        0,
        "copy the policy into the reference every N steps; 0 never (must be 0 with LoRA, whose "
        "reference is the adapter switched off)",
        NON_NEGATIVE,
    )
    dynamic_sampling: bool = _opt(False, "DAPO: drop all-equal groups and sample more")
    max_resample: int = _opt(4, "dynamic sampling: extra sampling rounds at most", NON_NEGATIVE)
    gamma: float = _opt(1.0, "PPO/GAE discount", _range(0, 1))
    lam: float = _opt(0.95, "PPO/GAE lambda", _range(0, 1))
    value_clip: float = _opt(0.2, "PPO value-loss clip range", POSITIVE)
    value_coef: float = _opt(0.5, "PPO value-loss weight", POSITIVE)
    value_lr: float | None = _opt(None, "critic learning rate; default optim.lr", POSITIVE)
    kl_in_reward: bool = _opt(
        False,
        "PPO: subtract beta x per-token KL (kl_estimator) from the reward instead of adding it "
        "to the loss",
    )


@dataclass
class OptimConfig:
    lr: float = _opt(1e-4, "AdamW learning rate", POSITIVE)
    weight_decay: float = _opt(0.0, "AdamW weight decay", NON_NEGATIVE)
    beta1: float = _opt(0.9, "AdamW beta1", _range(0, 1, high_open=True))
    beta2: float = _opt(0.99, "AdamW beta2", _range(0, 1, high_open=True))
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this; 0 off", NON_NEGATIVE)
    stochastic_rounding: bool = _opt(
        True,
        "bfloat16 weights: write each AdamW update stochastically rounded (oncurve.optim), so "
        "that updates below bfloat16's precision add up instead of being lost; false uses "
        "torch's AdamW, which rounds to nearest (not under FSDP, which always does)",
    )
    schedule: str = _opt("constant", "LR schedule", choices=("constant", "cosine"))
    warmup_steps: int = _opt(10, "linear warmup steps", NON_NEGATIVE)
    microbatch_size: int | None = _opt(
        None,
        "rows per forward/backward (gradient accumulation); null: 64 on CPU, from the memory "
        "plan on CUDA",
        POSITIVE,
    )
    microbatch_tokens: int | None = _opt(
        None,
        "at most this many tokens (rows x padded length) per forward/backward; default: on CPU "
        "as many as keep a layer's widest activation within 16 MB (larger blocks are mapped "
        "afresh and every page zeroed), from the memory plan on CUDA; 0 counts rows only",
        NON_NEGATIVE,
    )


@dataclass
class EvalConfig:
    every: int = _opt(
        0, "evaluate on held-out prompts every N steps; 0 only at start and end", NON_NEGATIVE
    )
    num_prompts: int = _opt(500, "held-out prompts per evaluation", NON_NEGATIVE)
    samples: int = _opt(
        1, "completions per prompt for mean@K (K > 1 samples at temperature)", POSITIVE
    )
    path: str | None = _opt(
        None,
        "held-out JSONL/CSV/Parquet file, or Hub dataset id (with data.config), when data.path "
        "is used",
    )
    split: str = _opt("test", "split of a Hub dataset eval.path")
    at_start_end: bool = _opt(True, "evaluate before the first and after the last step")


@dataclass
class LogConfig:
    tensorboard: bool = _opt(False, "also write TensorBoard scalars (extra `tb`)")
    samples_per_step: int = _opt(4, "completions per step written to samples.jsonl", NON_NEGATIVE)


@dataclass
class RunConfig:
    steps: int = _opt(150, "training steps", POSITIVE)
    seed: int = _opt(0, "seed for data order, sampling and initialisation")
    dir: str | None = _opt(None, "run directory; default runs/<timestamp>")
    save_every: int = _opt(
        0, "checkpoint every N steps (and at the end); 0 only at the end", NON_NEGATIVE
    )
    keep_last: int = _opt(
        2, "checkpoints kept; older ones deleted after a new one completes", POSITIVE
    )
    resume: str | None = _opt(None, "`auto` (newest checkpoint of run.dir) or a checkpoint path")
    overwrite: bool = _opt(
        False, "start a fresh run in the directory of a previous one (deletes only its files)"
    )
    max_skipped_steps: int = _opt(
        3, "stop after this many consecutive non-finite updates", POSITIVE
    )
    device: str = _opt(
        "auto", "cpu, cuda, cuda:N, or auto (cuda when torch sees a GPU)", _device_check
    )
    gpu_memory_gb: float | None = _opt(
        None,
        "GiB of GPU memory this run may use: the memory plan fits it and torch is capped at it "
        "(to run as on a smaller card); null: the device's free memory",
        POSITIVE,
    )
    threads: int = _opt(0, "torch CPU threads; 0 leaves torch's default", NON_NEGATIVE)
    preflight: bool = _opt(
        True,
        "before step 1, check on a few prompts that the gradient does not depend on the "
        "microbatching, that the sampler's logprobs are the training forward's and that the chat "
        "template keeps the prompt (oncurve.preflight); a failure stops the run",
    )
    deterministic: bool = _opt(
        True,
        "on CUDA, deterministic kernels (torch.use_deterministic_algorithms), so that a resumed "
        "run repeats an uninterrupted one bit for bit; false trades that for some speed",
    )


@dataclass
class DistConfig:
    nproc: int = _opt(
        1, "ranks to launch with torchrun from `oncurve train` (data parallel)", POSITIVE
    )
    fsdp: bool = _opt(False, "FSDP2: shard weights, gradients and AdamW state across ranks")
    timeout_s: float = _opt(300.0, "seconds a collective may wait before the job fails", POSITIVE)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    run: RunConfig = field(default_factory=RunConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    @property
    def epsilon_high(self) -> float:
        return self.algo.epsilon if self.algo.epsilon_high is None else self.algo.epsilon_high


# Each preset is a nested mapping of sections, as in a YAML file: it may set keys of any section.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # DeepSeekMath: group z-score, per-sequence token mean, k3 KL in the loss, symmetric clip.
    "grpo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "ppo_clip",
            "loss_agg": "seq-mean-token-mean",
            "beta": 0.04,
            "epsilon": 0.2,
        },
    },
    # Dr.GRPO: no std division, constant length normaliser, no KL.
    "dr_grpo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "none",
            "loss": "ppo_clip",
            "loss_agg": "seq-mean-token-sum-norm",
            "beta": 0.0,
            "epsilon": 0.2,
        },
    },
    # DAPO: token-level loss, clip-higher, dynamic sampling, soft overlong penalty, no KL.
    "dapo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "ppo_clip",
            "loss_agg": "token-mean",
            "beta": 0.0,
            "epsilon": 0.2,
            "epsilon_high": 0.28,
            "dynamic_sampling": True,
        },
        "reward": {"overlong_buffer": 16},
    },
    # GSPO: sequence-level ratio with its much smaller clip range.
    "gspo": {
        "algo": {
            "estimator": "grpo",
            "adv_scale": "group",
            "loss": "gspo",
            "loss_agg": "seq-mean-token-mean",
            "beta": 0.0,
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
    },
    # PPO with a learned critic (the baseline GRPO is measured against).
    "ppo": {
        "algo": {
            "estimator": "gae",
            "adv_scale": "none",
            "loss": "ppo_clip",
            "loss_agg": "token-mean",
            "beta": 0.04,
            "epsilon": 0.2,
            # The classic RLHF penalty: -beta * log(pi/pi_ref) on every token's reward.
            "kl_in_reward": True,
            "kl_estimator": "k1",
        },
    },
}


# Layered above the preset, below the user's keys: a preset's adv_scale is chosen for its own
# estimator, and group-std scaling would turn RLOO into GRPO x k/(k-1) (TRL and verl divide
# RLOO advantages by no std). Keys of the algo section.
ESTIMATOR_DEFAULTS: dict[str, dict[str, Any]] = {"rloo": {"adv_scale": "none"}}


# Keys that were renamed or moved, old dotted key -> new dotted key: a config that still uses
# one stops with a line naming the new key. A future rename is one more line here.
RENAMED: dict[str, str] = {
    "rewards": "reward.functions",
    "run.reward_timeout": "reward.timeout",
    "run.reward_timeout_score": "reward.timeout_score",
    "run.reward_errors": "reward.errors",
    "algo.overlong_buffer": "reward.overlong_buffer",
    "algo.overlong_penalty": "reward.overlong_penalty",
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Config from defaults, the preset, an optional YAML file and `key=value` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_yaml(Path(path))
    for item in overrides or []:
        key, value = _parse_override(item)
        _set_dotted(raw, key, value)
    return build_config(raw)


def build_config(raw: dict[str, Any]) -> Config:
    """Config from a nested dict (YAML layout), with the preset applied below the user's keys."""
    if not isinstance(raw, dict):
        raise UserError(f"config must be a mapping of sections, got {type(raw).__name__}")
    _check_renamed(raw)
    algo = raw.get("algo")
    user_algo = algo if isinstance(algo, dict) else {}
    preset = user_algo.get("preset", "grpo")
    if preset not in PRESETS:
        raise UserError(f"algo.preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    merged = _merge({}, PRESETS[preset])
    estimator = user_algo.get("estimator", merged["algo"]["estimator"])
    if isinstance(estimator, str):
        merged = _merge(merged, {"algo": ESTIMATOR_DEFAULTS.get(estimator, {})})
    merged = _merge(merged, raw)
    config = _from_dict(Config, merged, "")
    _check_cross_fields(config)
    return config


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s keys on top, mappings merged key by key (copies, neither changed)."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            out[key] = _merge(below, value)
        else:
            out[key] = dict(value) if isinstance(value, dict) else value
    return out


def _check_renamed(raw: dict[str, Any]) -> None:
    """A one-line error for the first key of `raw` that `RENAMED` lists."""
    for old, new in RENAMED.items():
        *sections, key = old.split(".")
        node: Any = raw
        for section in sections:
            node = node.get(section) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node:
            same_name = key == new.rsplit(".", 1)[-1]
            raise UserError(f"{old} {'moved to' if same_name else 'was renamed'} {new}")


def to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict of every field (what `config.yaml` in a run directory holds)."""
    return dataclasses.asdict(config)


def save_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def describe() -> str:
    """Every field with its default and help text, one per line."""
    lines = []

    def walk(cls: type, prefix: str) -> None:
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{prefix}{f.name}"
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, name + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"{name} = {default!r}  # {f.metadata.get('help', '')}")
            item = typing.get_args(hint)
            if item and dataclasses.is_dataclass(item[0]):  # the keys of each list entry
                walk(item[0], f"{name}[].")

    walk(Config, "")
    return "\n".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"config file {path}{where} is not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of sections")
    return data


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise UserError(f"override {item!r} must look like section.key=value")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"{key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_dict(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(raw, dict):
        raise UserError(f"{where} must be a mapping, got {type(raw).__name__}")
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            choices = ", ".join(known)
            raise UserError(f"unknown key {prefix}{key}; {where} has: {choices}")
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, f"{prefix}{name}", known[name])
    return cls(**values)


def _coerce(hint: Any, value: Any, name: str, spec: dataclasses.Field) -> Any:
    if dataclasses.is_dataclass(hint):
        if isinstance(value, str) and hint is RewardFnConfig:
            value = {"name": value}
        return _from_dict(hint, value if value is not None else {}, name + ".")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        hint = options[0]
        origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise UserError(f"{name} must be a mapping of names to values, got {value!r}")
        return dict(value)
    if origin is list:
        (item_hint,) = typing.get_args(hint)
        if isinstance(value, str | dict) or not isinstance(value, list):
            value = [value]
        return [_coerce(item_hint, v, f"{name}[{i}]", spec) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return _coerce(hint, value, name, spec)
    value = _scalar(hint, value, name)
    choices = spec.metadata.get("choices")
    if choices and value not in choices:
        raise UserError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    check = spec.metadata.get("check")
    problem = check(value) if check else None
    if problem:
        raise UserError(f"{name} {problem}, got {value!r}")
    return value


def _scalar(hint: type, value: Any, name: str) -> Any:
    if hint is float and isinstance(value, str):
        # YAML 1.1 reads `1e-5` (no dot) as a string; users mean the number.
        try:
            return float(value)
        except ValueError:
            pass
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise UserError(f"{name} must be {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _check_cross_fields(config: Config) -> None:
    if config.algo.kl_in_reward and config.algo.estimator != "gae":
        raise UserError(
            f"algo.kl_in_reward needs algo.estimator=gae (a critic), got {config.algo.estimator!r}"
        )
    if config.data.task is None and config.data.path is None:
        raise UserError("data.task or data.path must be set")
    # every rank must hold a group of every minibatch (`trainer.optimise`); torchrun launched
    # by hand is checked again in `trainer.setup`, with the real number of ranks
    per_rank = config.data.prompts_per_step // config.dist.nproc
    if config.algo.minibatches > per_rank:
        raise UserError(
            f"algo.minibatches must be at most data.prompts_per_step per rank "
            f"({config.data.prompts_per_step} / {config.dist.nproc} = {per_rank}), "
            f"got {config.algo.minibatches}"
        )
    if config.dist.fsdp and config.model.lora.r:
        raise UserError("dist.fsdp=true with model.lora.r > 0 is not supported; use one of them")
    if config.rollout.min_new_tokens > config.rollout.max_new_tokens:
        raise UserError(
            f"rollout.min_new_tokens must be at most rollout.max_new_tokens "
            f"({config.rollout.max_new_tokens}), got {config.rollout.min_new_tokens}"
        )
    if config.rollout.max_turns > 1 and config.rollout.env is None:
        raise UserError("rollout.max_turns > 1 needs rollout.env (what answers the turns)")
    _check_algo(config)
    _check_reward(config)
    _check_data(config)


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
