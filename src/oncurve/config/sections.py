"""The run configuration's sections: nested dataclasses in data-flow order, each field with its
default, its help text and the checks a value alone must pass (`_opt`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from oncurve.algo.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    IS_CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
)
from oncurve.config.presets import PRESETS

Check = Callable[[Any], str | None]


def _opt(
    default: Any,
    help: str,
    check: Check | None = None,
    choices: tuple | None = None,
    blank: Literal["refuse", "whitespace", "allow"] = "refuse",
    empty_list: str = "none",
) -> Any:
    """A field with its default, help text and the checks a value alone must pass (`check`
    returns the problem, None when there is none; `choices` the values allowed). `blank` is what
    loading does with empty text (for a list of text, an item): `refuse` refuses it, and
    whitespace-only text too; `whitespace` refuses "" only (a stop string "\\n" is text);
    `allow` takes it, for a field where "" means something. `empty_list` says what [] gives a
    list field, in the line that refuses null for it."""
    meta = {"help": help, "check": check, "choices": choices}
    meta |= {"blank": blank, "empty_list": empty_list}
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
        # nan passes every comparison; inf is no setting's value (an int, however large, is
        # finite and compares exactly: math.isfinite would overflow on it)
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be in {text}"
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        return f"must be in {text}" if too_low or too_high else None

    return check


POSITIVE = _range(0, None, low_open=True)


def _finite(value: Any) -> str | None:
    return None if value is None or math.isfinite(value) else "must be a finite number"


def _device_check(value: str) -> str | None:
    kind, _, index = value.partition(":")
    if kind in ("cpu", "auto") and not index or kind == "cuda" and (not index or index.isdigit()):
        return None
    return "must be cpu, cuda, cuda:N or auto"


NON_NEGATIVE = _range(0, None)
UNIT_OPEN = _range(0, 1, low_open=True, high_open=True)


def _is_cap_check(value: float | None) -> str | None:
    if value is not None and math.isinf(value):
        # no cap: a ratio past float range (exp overflows) would weight its token's loss by inf
        return "must be a finite number (0 is off)"
    if value is None or value == 0 or value >= 1:
        return None
    return (
        "must be 0 (off) or at least 1 (a cap below 1 scales every token's loss down, or masks "
        "every token the trainer finds likelier than the sampler)"
    )


# `apply_chat_template`'s own arguments and the variables its rendering sets: oncurve's rendering
# decides them (the prompt's ending, tokenization, the tools shown), so a template variable by
# one of these names would change or break it
RESERVED_TEMPLATE_KWARGS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "sanitize_control_tokens",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def _template_kwargs_check(value: dict[str, Any]) -> str | None:
    reserved = [key for key in value if key in RESERVED_TEMPLATE_KWARGS]
    if reserved:
        return f"must not set {reserved[0]} (oncurve's own rendering sets it)"
    return None


@dataclass
class LoraConfig:
    r: int = _opt(0, "LoRA rank; 0 trains every weight (extra `lora` installs peft)", NON_NEGATIVE)
    alpha: float = _opt(16.0, "LoRA scaling numerator (scale = alpha / r)", POSITIVE)
    dropout: float = _opt(
        0.0,
        "dropout on the LoRA input; no forward applies it (a step's forwards run without "
        "dropout, so that the update's ratios compare like with like), and the run says so",
        _range(0, 1, high_open=True),
    )
    target_modules: list[str] = _opt(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "module names that get adapters; each must match a module, and not the output head or "
        "an embedding tied to it",
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
        "weights and compute dtype; auto: bfloat16 on a GPU that computes in it (Ampere or later), "
        "else float32",
        choices=("auto", "float32", "bfloat16"),
    )
    trust_remote_code: bool = _opt(False, "allow custom modelling code shipped with the model")
    gradient_checkpointing: bool | None = _opt(
        None,
        "recompute activations in backward to save memory; null: off on CPU, from the memory "
        "plan on CUDA",
    )
    compile_layers: bool = _opt(
        False,
        "compile each decoder layer for the update and the reference and old-policy forwards "
        "(torch.compile, inductor, one compilation for all layers, torch 2.5 or later; a "
        "failure falls back to the eager layers with one warning)",
    )
    pack_rows: bool | None = _opt(
        None,
        "in the update and the reference and old-policy passes, run each microbatch's rows "
        "packed end to end by their real tokens, with no padding (attention by the rows' "
        "bounds: torch's variable-length flash attention on CUDA, one sdpa call a row "
        "elsewhere); null: on with CUDA where torch has it and the model uses sdpa "
        "attention without logit soft-capping",
    )
    share_prompt_forward: bool = _opt(
        True,
        "in the update and the reference pass, run each group's prompt once for the group's "
        "completions: with packed rows, in the same forward; padded, by sharing its KV cache "
        "(not under gradient checkpointing, FSDP or compiled layers)",
    )
    logprob_chunk_size: int | None = _opt(
        None,
        "positions per chunk when forming logits, bounding the [chunk, vocab] peak; null: 1024, "
        "on CUDA fewer where a chunk's float32 logits would pass 256 MiB",
        POSITIVE,
    )
    offload_reference: bool | None = _opt(
        None,
        "keep the frozen reference's weights (algo.beta > 0 without LoRA) in pinned host "
        "memory and copy them to the GPU for the reference pass only, so that the sampler and "
        "the update do not hold them (one host-to-device copy of the weights a step); null: "
        "on CUDA while every local process's copy fits in half the host's memory (a container's "
        "cgroup limit where lower)",
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
        "extra `data`; a local path wins); overrides task; given:train_dataset: the rows passed "
        "to oncurve.train(train_dataset=...)",
    )
    config: str | None = _opt(None, "config name of a Hub dataset (e.g. main for openai/gsm8k)")
    split: str = _opt("train", "split of a Hub dataset to train on")
    prompt_field: str = _opt(
        "prompt",
        "column holding the prompt: text, or a list of {role, content} messages (rendered with "
        "the tokenizer's chat template)",
    )
    prompt_template: str | None = _opt(
        None,
        "the prompt as a format string over the row's columns, e.g. \"{question}\\nPut your "
        'final answer within \\\\boxed{}." ({column} is replaced; {{ and }} are braces, other '
        "braces stay as written); null: the prompt_field column as it is",
    )
    answer_field: str | None = _opt(
        None,
        "column holding the reference answer; needed only when a reward that reads it (correct) "
        "is used; null: answer, else solution (TRL's name), whichever the data has",
    )
    answer_format: str = _opt(
        "auto",
        "how the reference answer is read off answer_field (the original, where that differs, "
        "in answer_raw): "
        "gsm8k, the text after a last `#### ` line; boxed, the last \\boxed{}; last_number; "
        "raw, the whole value; auto: gsm8k when the value ends in a `#### x` line, boxed when "
        "it holds a \\boxed{}, else raw",
        choices=("auto", "raw", "gsm8k", "boxed", "last_number"),
    )
    prompts_per_step: int = _opt(16, "prompts (groups) per training step, B", POSITIVE)
    num_train: int = _opt(20000, "examples a built-in task generates for training", POSITIVE)
    system_prompt: str | None = _opt(
        None, "system message placed before each prompt; null or empty: none", blank="allow"
    )
    chat_template: bool = _opt(False, "format prompts with the tokenizer's chat template")
    chat_template_kwargs: dict[str, Any] = _opt(
        {},
        "variables the chat template is rendered with, for every prompt the policy is given "
        "(training, held-out, an episode's turns, the endpoint's; TRL's chat_template_kwargs), "
        "and a reward model's template, as TRL does: e.g. {enable_thinking: false} (Qwen3)",
        _template_kwargs_check,
    )
    max_prompt_tokens: int = _opt(512, "longest prompt accepted; longer is an error", POSITIVE)
    task_options: dict[str, Any] = _opt(
        {},
        "keyword arguments of the built-in task: arith max_digits, min_digits; countdown "
        "counts, max_number; gym:<name> its reasoning-gym dataset config",
    )
    curriculum: str = _opt(
        "none",
        "which prompts a step samples (oncurve.data.curriculum): none, the seeded order; "
        "pass_rate, fewer of those that every completion or none solved in their last visits; "
        "difficulty, the task's easiest level first, one up each time the rolling sampled "
        "accuracy reaches data.curriculum_threshold",
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
    max_new_tokens: int = _opt(
        256, "longest completion; longer ones are cut (64 with model.path=default)", POSITIVE
    )
    min_new_tokens: int = _opt(
        0, "EOS is suppressed until this many tokens (in each turn of an episode)", NON_NEGATIVE
    )
    temperature: float = _opt(1.0, "sampling temperature (also scales training logprobs)", POSITIVE)
    top_p: float = _opt(1.0, "nucleus sampling mass", _range(0, 1, low_open=True))
    top_k: int = _opt(0, "keep the k most likely tokens; 0 keeps all", NON_NEGATIVE)
    min_p: float = _opt(0.0, "drop tokens below min_p x the top probability", _range(0, 1))
    stop: list[str] = _opt(
        [],
        "stop strings that end a completion, matched in its text without special tokens",
        blank="whitespace",
    )
    backend: str = _opt(
        "auto",
        "sampler backend (oncurve.rollout.BACKENDS: hf, cpu_llama, cuda_graph): auto picks "
        "cpu_llama on the CPU and cuda_graph on CUDA for the models they support, else hf",
    )
    cuda_graphs: bool | None = _opt(
        None,
        "capture the cuda_graph sampler's decode step as CUDA graphs; null: with that sampler "
        "on CUDA. A capture that fails turns it off for the rest of the run, with a warning, "
        "and the run's config.yaml then records false (metric rollout/graphs)",
    )
    compile: bool | None = _opt(
        None,
        "compile the cuda_graph sampler's decode step (torch.compile, inductor) before it is "
        "captured, so that norms, rotary embeddings, activations and the draw become a few fused "
        "kernels; null (auto): with that sampler on CUDA. A compilation that fails turns it off "
        "for the rest of the run, with a warning, and config.yaml then records false",
    )
    keep_cache: bool | None = _opt(
        None,
        "keep the cuda_graph sampler's KV cache and graphs from one step's sampling to the "
        "next (no capture each step) instead of freeing them before the update; null: from "
        "the memory plan on CUDA, kept while that cache is at most 64 MiB",
    )
    env: str | None = _opt(
        None,
        "multi-turn environment: python_tool, a game `textarena:<id>` or `gem:<id>`, an OpenEnv "
        "server `openenv:<url>`, an agent harness `harness:module:function` (plays against "
        "oncurve's OpenAI-compatible endpoint), a verifiers environment `verifiers:NAME` (its "
        "dataset, rollouts and rubric), or a "
        "`module:Class` path (docs/environments.md); null samples one completion per episode",
    )
    env_args: dict[str, Any] = _opt(
        {}, "keyword arguments of rollout.env's class (of a verifiers environment's loader)"
    )
    max_turns: int = _opt(
        1, "policy turns per episode with rollout.env; max_new_tokens bounds each", POSITIVE
    )
    max_observation_tokens: int = _opt(
        256,
        "an observation's text is cut to its last this many tokens (its newest) before it is "
        "fed (a harness's messages "
        "between turns are its own, not cut: an episode whose are longer, beyond the template's "
        "tokens around them, is dropped)",
        POSITIVE,
    )
    env_timeout_s: float | None = _opt(
        60.0,
        "seconds an episode's environment steps may take in all (a harness's: its time outside "
        "its calls to the endpoint, whose sampling is not counted); past it the episode ends and "
        "scores reward.timeout_score (a reset past it stops the run); null waits forever",
        POSITIVE,
    )
    prompts_per_call: int | None = _opt(
        None,
        "prompts handed to the sampler at once (their G rows each); null: all of a sampling "
        "round's. Halved when sampling runs out of memory",
        POSITIVE,
    )


@dataclass
class RewardFnConfig:
    name: str = _opt("correct", "built-in reward name or `module:function` import path")
    weight: float = _opt(1.0, "weight of this reward in the sum", _finite)


@dataclass
class RewardConfig:
    functions: list[RewardFnConfig] = _opt(
        [],
        "reward functions with weights; empty: the environment's or the task's own rewards, "
        "or for data.path the correct reward (the answer column decides)",
        empty_list=(
            "the environment's or the task's own rewards, or the correct reward for data.path"
        ),
    )
    timeout: float | None = _opt(
        10.0, "seconds a reward call may take before it is stopped; null waits forever", POSITIVE
    )
    timeout_score: float | None = _opt(
        0.0,
        "score of a reward call stopped by reward.timeout (or a verifier that gave up on a row); "
        "null leaves the row out, which pays a policy for slow answers over wrong ones",
        _finite,
    )
    errors: str = _opt(
        "raise", "a reward fn that raises: stop the run, or score None", choices=("raise", "none")
    )
    answer_match: str = _opt(
        "strict",
        "how `correct` matches a numeric reference: strict pays only for a stated number (an "
        "expression equal to it scores 0); lenient also pays for any expression math-verify "
        "finds equal, such as the question restated",
        choices=("strict", "lenient"),
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
        "named bundle of the fields below (dapo also sets reward.overlong_buffer, to 20% of "
        "rollout.max_new_tokens): grpo (DeepSeekMath), dr_grpo, dapo, gspo, cispo "
        "(MiniMax-M1), ppo; dapo, gspo and cispo set algo.minibatches=4 (their clip binds "
        "only off-policy)",
        choices=tuple(PRESETS),
    )
    estimator: str = _opt(
        "grpo",
        "advantage estimator: grpo (group z-score), rloo (leave-one-out; algo.adv_scale "
        "defaults to none with it, whatever the preset), gae (PPO with a critic)",
        choices=(*ADVANTAGE_ESTIMATORS, "gae"),
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
        choices=tuple(POLICY_LOSSES),
    )
    loss_agg: str = _opt(
        "seq-mean-token-mean",
        "how token losses become one number",
        choices=tuple(AGGREGATIONS),
    )
    epsilon: float = _opt(
        0.2,
        "clip range below 1 (and above, unless epsilon_high); 1 sets no lower bound (CISPO)",
        _range(0, 1, low_open=True),
    )
    epsilon_high: float | None = _opt(
        None,
        "clip range above 1 (DAPO clip-higher; CISPO's cap on the weight is 1 + epsilon_high)",
        _range(0, None, low_open=True),
    )
    dual_clip: float | None = _opt(
        None, "dual-clip constant c > 1 bounding negative-A loss", _range(1, None, low_open=True)
    )
    is_correction: str = _opt(
        "token_truncate",
        "importance-sampling correction for a sampler whose logprobs differ from the training "
        "forward's: each token's policy loss is weighted by ratio = pi_old / pi_sampler, with "
        "algo.is_cap: token_truncate (min(ratio, cap), TIS), token_mask (the ratio, 0 above "
        "the cap), sequence_truncate and sequence_mask (the same with the sequence's ratio, the "
        "product of its tokens', for all its tokens; TRL's default is sequence_mask with cap "
        "3), none (off)",
        choices=(*IS_CORRECTIONS, "none"),
    )
    is_cap: float | None = _opt(
        None,
        "the cap of algo.is_correction; null: 2.0 with the cuda_graph sampler, whose kernels "
        "differ from the training forward's, and in bfloat16; 0 (off) with the others in "
        "float32, whose logprobs equal it to float rounding; 0 off",
        _is_cap_check,
    )
    beta: float = _opt(
        0.04, "weight of KL(pi || pi_ref) in the loss; 0 loads no reference", NON_NEGATIVE
    )
    kl_estimator: str = _opt(
        "k3",
        "per-token KL estimator; in the loss, k3's gradient is that of KL(pi_ref || pi) (as in "
        "TRL and verl) and k2's that of KL(pi || pi_ref); k1's is zero in expectation, so k1 "
        "only with algo.kl_in_reward=true (or beta=0)",
        choices=tuple(KL_ESTIMATORS),
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
        "reference is the adapter switched off, and with algo.beta=0, which holds none)",
        NON_NEGATIVE,
    )
    dynamic_sampling: bool = _opt(
        False,
        "DAPO: drop groups whose verifier scores (else rewards) are all equal; sample more",
    )
    max_resample: int = _opt(4, "dynamic sampling: extra sampling rounds at most", NON_NEGATIVE)
    gamma: float = _opt(1.0, "PPO/GAE discount", _range(0, 1))
    lam: float = _opt(0.95, "PPO/GAE lambda", _range(0, 1))
    value_clip: float = _opt(0.2, "PPO value-loss clip range", POSITIVE)
    value_coef: float = _opt(
        0.5,
        "PPO value-loss weight; the critic has an AdamW of its own, which undoes a constant "
        "weight except against its epsilon and optim.grad_clip: tune algo.value_lr instead",
        POSITIVE,
    )
    value_lr: float | None = _opt(None, "critic learning rate; default optim.lr", POSITIVE)
    kl_in_reward: bool = _opt(
        False,
        "PPO: subtract beta x per-token KL (kl_estimator) from the reward instead of adding it "
        "to the loss",
    )


@dataclass
class OptimConfig:
    lr: float = _opt(1e-6, "AdamW learning rate (1e-4 with model.path=default)", POSITIVE)
    weight_decay: float = _opt(0.0, "AdamW weight decay", NON_NEGATIVE)
    beta1: float = _opt(0.9, "AdamW beta1", _range(0, 1, high_open=True))
    beta2: float = _opt(0.99, "AdamW beta2", _range(0, 1, high_open=True))
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this; 0 off", NON_NEGATIVE)
    stochastic_rounding: bool = _opt(
        True,
        "bfloat16 weights: write each AdamW update stochastically rounded "
        "(oncurve.update.adamw), so that updates below bfloat16's precision add up instead of "
        "being lost; false uses torch's AdamW, which rounds to nearest (not under FSDP, which "
        "always does)",
    )
    schedule: str = _opt(
        "constant",
        "LR schedule after the warmup: constant, or a half cosine that would reach 0 at step "
        "run.steps (the last step trains just above 0, as Hugging Face's schedule)",
        choices=("constant", "cosine"),
    )
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
    num_prompts: int | None = _opt(
        None,
        "held-out prompts per evaluation; null: all of eval.path, or 500 of a built-in task's "
        "(500 with model.path=default); a task with fewer test problems gives them all; 0: no "
        "held-out evaluation",
        NON_NEGATIVE,
    )
    samples: int = _opt(
        1, "completions per prompt for mean@K (K > 1 samples at temperature)", POSITIVE
    )
    path: str | None = _opt(
        None,
        "held-out JSONL/CSV/Parquet file, or Hub dataset id (with data.config), when data.path "
        "is used; given:eval_dataset: the rows passed to oncurve.train(eval_dataset=...)",
    )
    split: str = _opt("test", "split of a Hub dataset eval.path")
    at_start_end: bool = _opt(True, "evaluate before the first and after the last step")
    batch_rows: int = _opt(
        256, "rows sampled at once in an evaluation; halved when it runs out of memory", POSITIVE
    )


@dataclass
class WandbConfig:
    project: str | None = _opt(
        None, "Weights & Biases project to log metrics and config to (extra `wandb`); null: off"
    )
    name: str | None = _opt(None, "the W&B run's name; null: the run directory's name")
    mode: str | None = _opt(
        None,
        "online, or offline: written under RUN/wandb only, for `wandb sync` later; null: W&B's "
        "own choice (WANDB_MODE, else online)",
        choices=("online", "offline"),
    )


@dataclass
class TrackioConfig:
    project: str | None = _opt(
        None,
        "trackio project to log metrics and config to (extra `trackio`), in trackio's local "
        "directory (TRACKIO_DIR); null: off",
    )
    name: str | None = _opt(None, "the trackio run's name; null: the run directory's name")


@dataclass
class LogConfig:
    tensorboard: bool = _opt(False, "also write TensorBoard scalars (extra `tb`)")
    wandb: WandbConfig = field(default_factory=WandbConfig)
    trackio: TrackioConfig = field(default_factory=TrackioConfig)
    samples_per_step: int = _opt(4, "completions per step written to samples.jsonl", NON_NEGATIVE)


@dataclass
class RunConfig:
    steps: int = _opt(150, "training steps", POSITIVE)
    seed: int = _opt(0, "seed for data order, sampling and initialisation", _range(0, 2**63 - 1))
    dir: str | None = _opt(None, "run directory; default runs/<timestamp>")
    save_every: int = _opt(
        0, "checkpoint every N steps (and at the end); 0 only at the end", NON_NEGATIVE
    )
    keep_last: int = _opt(
        2, "checkpoints kept; older ones deleted after a new one completes", POSITIVE
    )
    resume: str | None = _opt(None, "`auto` (newest checkpoint of run.dir) or a checkpoint path")
    force_changes: list[str] = _opt(
        [],
        "settings a resume may change although they define the run (oncurve.config.resume_settings."
        "FORCEABLE: model.path after moving the model, data.rows for edited training rows, ...); "
        "each change is said and kept in the run's history",
    )
    overwrite: bool = _opt(
        False, "start a fresh run in the directory of a previous one (deletes only its files)"
    )
    max_skipped_steps: int = _opt(
        3, "stop after this many consecutive non-finite updates", POSITIVE
    )
    dead_steps: int = _opt(
        10,
        "warn (one line) when every group has been all-equal (no gradient) this many steps in a "
        "row; 0 never",
        NON_NEGATIVE,
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
        "template keeps the prompt (oncurve.loop.preflight); a failure stops the run",
    )
    deterministic: bool = _opt(
        True,
        "on CUDA, deterministic kernels (torch.use_deterministic_algorithms; strict in the "
        "update's backward until an op lacks a deterministic kernel), so that a resumed run "
        "repeats an uninterrupted one bit for bit; false trades that for some speed",
    )


@dataclass
class DistConfig:
    nproc: int = _opt(
        1, "ranks to launch with torchrun from `oncurve train` (data parallel)", POSITIVE
    )
    fsdp: bool = _opt(False, "FSDP2: shard weights, gradients and AdamW state across ranks")
    timeout_s: float = _opt(
        300.0,
        "seconds a collective may wait before the job fails; the other ranks wait as long for "
        "rank 0 to write a checkpoint or the final model, so a save must fit in it",
        POSITIVE,
    )


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
    def frozen_reference(self) -> bool:
        """Whether a frozen copy of the policy is held as pi_ref: with a KL term, but not under
        LoRA, whose reference is the base model with the adapter switched off."""
        return self.algo.beta > 0 and not self.model.lora.r

    @property
    def epsilon_high(self) -> float:
        return self.algo.epsilon if self.algo.epsilon_high is None else self.algo.epsilon_high
