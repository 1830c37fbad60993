"""How much accelerator memory a run needs, and the microbatching that fits it.

`plan_memory` is a pure function of the model's shape, the sequence length and a budget: it
picks the rows and tokens of a training microbatch, whether to recompute activations in the
backward (gradient checkpointing) and how many positions form logits at once, and predicts the
peak. The trainer applies it on CUDA to every setting the user left unset.

The policy is to be lean rather than to fill the card (a GRPO run shares its GPU with the
sampler's KV cache, and TRL's peak memory is the bar it is measured against): a microbatch of
about `MICROBATCH_TOKENS` tokens keeps the matmuls busy, and activations are recomputed whenever
storing them would cost more than `ACTIVATION_ALLOWANCE` of the model state (weights, reference,
gradients, AdamW moments), or more than the budget leaves. Only when even that does not fit are
microbatches made smaller.

What the estimates count (bytes; b = bytes per weight element):
- model state: weights (params x b), the reference copy, gradients (trainable x b), AdamW's
  two moments (trainable x b each: torch keeps them in the parameter's dtype), for PPO the
  critic's float32 trunk with its gradients and moments, and a reward model's weights
  (`extra_state_bytes`); the policy's gradients exist during the update only
  (`update.step.releasing_gradients`), so the sampling and reference peaks leave them out;
- activations kept for the backward, per token and decoder layer: about
  `9 hidden + 2 kv + 4 intermediate` elements of a Llama-style layer (the two RMSNorms in float32,
  q/k/v, attention out, the gated MLP's four); with checkpointing one `hidden` per layer plus two
  layers' worth for the layer being recomputed and its gradients;
- logits: a chunk's `[chunk, vocab]` float32 logits and one temporary of that size, and the
  float32 block of the output embedding and its gradient (`logits_bytes`);
- sampling: the KV cache of every sampled row at full length and `[rows, vocab]` buffers; the
  cuda_graph sampler's cache is present during the update too when it is kept between steps
  (`keeps_sampler_cache`);
- the reference pass: the state but the gradients, its logits and one decoder layer's
  activations a token (a forward without gradients keeps no more), as many tokens as a
  training microbatch's activations take the memory of (`forward_only_tokens`). With the
  reference's weights offloaded to host memory (`offload_reference`) they are on the device
  for that pass only, in the room the gradients leave: the sampling and training peaks leave
  them out.
These are estimates of `torch.cuda.max_memory_allocated`, not of what `nvidia-smi` shows (the
CUDA context and the allocator's cached blocks come on top); the budget keeps
`RESERVED_FRACTION` of it free for those.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncurve.algo.logprobs import HEAD_BLOCK_ROWS

if TYPE_CHECKING:
    import torch

GIB = 2**30
MICROBATCH_TOKENS = 4096
# Activations may take this share of the model state before checkpointing turns on, but never
# need to be under ACTIVATION_FLOOR: below that recomputation saves too little to pay for it.
ACTIVATION_ALLOWANCE = 0.25
ACTIVATION_FLOOR = 1 * GIB
LOGITS_CHUNK_BYTES = 256 * 2**20
DEFAULT_LOGITS_CHUNK = 1024
CPU_MICROBATCH_ROWS = 64  # the CPU's microbatches are cut by tokens (`kv_cache.microbatch_tokens`)
RESERVED_FRACTION = 0.1
# The cuda_graph sampler's training KV cache, at most this, stays allocated between steps: a
# capture each step is a large share of the short steps of a model whose cache is this small
# (benchmarks/LOG.md has the figure), and the memory a small share of any card.
KEPT_CACHE_BYTES = 64 * 2**20
# The reference's weights are offloaded only while every local process's pinned copy takes at
# most this share of the host's memory: pinned pages cannot be swapped out.
OFFLOAD_HOST_SHARE = 0.5


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need of a decoder-only causal LM.

    Attributes:
        params: every parameter of the policy.
        trainable: parameters the optimizer updates (all of them, or LoRA's adapters).
        layers, hidden, intermediate, vocab: the decoder's sizes.
        kv_dim: key (= value) width of a layer, KV heads x head dim.
        weight_bytes: bytes per weight element (2 for bfloat16, 4 for float32).
        tied: whether the output embedding is the input embedding.
    """

    params: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int
    vocab: int
    weight_bytes: int
    tied: bool

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape:
        """The shape of a Hugging Face causal LM, read from its config and parameters."""
        config = model.config
        hidden = config.hidden_size
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        weight = model.get_input_embeddings().weight
        return cls(
            params=sum(p.numel() for p in model.parameters()),
            trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
            layers=config.num_hidden_layers,
            hidden=hidden,
            intermediate=getattr(config, "intermediate_size", None) or 4 * hidden,
            kv_dim=kv_heads * head_dim,
            vocab=weight.shape[0],
            weight_bytes=weight.element_size(),
            tied=model.get_output_embeddings().weight is weight,
        )


@dataclass(frozen=True)
class MemoryPlan:
    """The microbatching of a run and the peak it predicts.

    Attributes:
        microbatch_rows: rows per forward/backward at most (chosen: all of a step's, the
            tokens being the bound).
        microbatch_tokens: tokens per forward/backward at most (`update.step.microbatches`
            counts them padded, or real where rows are packed); chosen: a whole number of rows
            of the widest length.
        gradient_checkpointing: recompute activations in the backward.
        logprob_chunk_size: positions whose logits are formed at once.
        state_bytes: model state, present all run long.
        train_peak_bytes: state (but an offloaded reference) + the largest microbatch's
            activations and logits.
        sample_peak_bytes: state but the gradients (and an offloaded reference) + the
            sampler's KV cache and logits (an evaluation's beside a held one).
        reference_peak_bytes: state but the gradients + the reference pass's activations and
            logits (0: no reference is held).
        offload_reference: the reference's weights stay in host memory but for its pass.
        budget_bytes: what the plan had to fit in.
    """

    microbatch_rows: int
    microbatch_tokens: int
    gradient_checkpointing: bool
    logprob_chunk_size: int
    state_bytes: int
    train_peak_bytes: int
    sample_peak_bytes: int
    reference_peak_bytes: int
    offload_reference: bool
    budget_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(self.train_peak_bytes, self.sample_peak_bytes, self.reference_peak_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget_bytes * (1 - RESERVED_FRACTION)

    def describe(self) -> str:
        """One line for the run's log."""
        reference = ""
        if self.reference_peak_bytes:
            reference = f", reference pass {self.reference_peak_bytes / GIB:.1f}"
            if self.offload_reference:
                reference += " with its weights offloaded between passes"
        return (
            f"memory plan: {self.microbatch_rows} rows / {self.microbatch_tokens:,} tokens per "
            f"microbatch, gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}, "
            f"logits in chunks of {self.logprob_chunk_size}; predicted peak "
            f"{self.peak_bytes / GIB:.1f} GiB (state {self.state_bytes / GIB:.1f}, training "
            f"{self.train_peak_bytes / GIB:.1f}, sampling {self.sample_peak_bytes / GIB:.1f}"
            f"{reference}) of a {self.budget_bytes / GIB:.1f} GiB budget"
        )


def state_bytes(shape: ModelShape, *, reference: bool, critic: bool) -> int:
    """Weights, reference copy, gradients and AdamW moments (+ a float32 critic for PPO)."""
    b = shape.weight_bytes
    total = shape.params * b + 3 * shape.trainable * b
    if reference:
        total += shape.params * b
    if critic:
        head = 0 if shape.tied else shape.vocab * shape.hidden
        total += 4 * 4 * (shape.params - head)
    return total


def activation_bytes_per_token(shape: ModelShape, checkpointing: bool) -> int:
    """Bytes the backward keeps per token of a microbatch (see the module docstring)."""
    layer = (9 * shape.hidden + 2 * shape.kv_dim + 4 * shape.intermediate) * shape.weight_bytes
    if checkpointing:
        return shape.layers * shape.hidden * shape.weight_bytes + 2 * layer
    return shape.layers * layer


def forward_only_bytes_per_token(shape: ModelShape) -> int:
    """Bytes a forward without gradients holds per token: one decoder layer's activations, one
    layer at a time."""
    return activation_bytes_per_token(dataclasses.replace(shape, layers=1), False)


def forward_only_tokens(shape: ModelShape, tokens: int, checkpointing: bool) -> int:
    """Tokens a forward without gradients (the reference pass) may run at once in the memory
    that a training microbatch of `tokens` keeps for its backward (0: no cap, as `tokens`):
    that one keeps `activation_bytes_per_token` a token, this one
    `forward_only_bytes_per_token`."""
    return (
        tokens
        * activation_bytes_per_token(shape, checkpointing)
        // forward_only_bytes_per_token(shape)
    )


def logits_bytes(shape: ModelShape, chunk: int, trainable_head: bool) -> int:
    """The logprob head's peak (`oncurve.algo.logprobs`): two `[chunk, vocab]` float32
    buffers, plus one vocabulary block's float32 copy and gradient when the weights are not
    float32, or the whole head's float32 gradient when they are and it trains."""
    total = 2 * chunk * shape.vocab * 4
    if shape.weight_bytes != 4:
        total += 2 * min(HEAD_BLOCK_ROWS, shape.vocab) * shape.hidden * 4
    elif trainable_head:
        total += shape.vocab * shape.hidden * 4
    return total


def kv_cache_bytes(shape: ModelShape, rows: int, seq_len: int) -> int:
    """Keys and values of `rows` rows of `seq_len` positions in every layer."""
    return rows * seq_len * shape.layers * 2 * shape.kv_dim * shape.weight_bytes


def keeps_sampler_cache(shape: ModelShape, rows: int, seq_len: int) -> bool:
    """Whether the cuda_graph sampler keeps its training workspace (KV cache and graphs)
    between steps, unless told: when its cache of `rows` rows is at most `KEPT_CACHE_BYTES`.
    Else it is freed after each step's sampling, so that the update does not hold it, and
    captured again at the next step (compiled once all the same)."""
    return kv_cache_bytes(shape, rows, seq_len) <= KEPT_CACHE_BYTES


def offloads_reference(shape: ModelShape, processes: int, host_bytes: int) -> bool:
    """Whether a held reference's weights stay in host memory but for the reference pass,
    unless told: when `processes` pinned copies fit in `OFFLOAD_HOST_SHARE` of `host_bytes`.
    The cost is one host-to-device copy of the weights a step, from pinned memory (about
    1 GB for the 0.5B shape in bfloat16)."""
    return processes * shape.params * shape.weight_bytes <= OFFLOAD_HOST_SHARE * host_bytes


def sampling_bytes(shape: ModelShape, rows: int, seq_len: int) -> int:
    """The sampler's KV cache at full length, a float32 block of the output embedding and
    three `[rows, vocab]` float32 buffers (logits, probabilities, their sort)."""
    cache = kv_cache_bytes(shape, rows, seq_len)
    head = min(HEAD_BLOCK_ROWS, shape.vocab) * shape.hidden * 4 if shape.weight_bytes != 4 else 0
    return cache + head + 3 * rows * shape.vocab * 4


def logits_chunk(vocab: int) -> int:
    """Positions per logits chunk: `DEFAULT_LOGITS_CHUNK`, fewer when a chunk's float32 logits
    would pass `LOGITS_CHUNK_BYTES` (a power of two, at least 64)."""
    fits = LOGITS_CHUNK_BYTES // (vocab * 4)
    if fits >= DEFAULT_LOGITS_CHUNK:
        return DEFAULT_LOGITS_CHUNK
    return max(64, 2 ** int(math.log2(max(fits, 1))))


def plan_memory(
    shape: ModelShape,
    *,
    seq_len: int,
    rows_per_step: int,
    sample_rows: int,
    budget_bytes: int,
    reference: bool,
    critic: bool = False,
    held_cache_rows: int = 0,
    eval_rows: int = 0,
    microbatch_rows: int | None = None,
    gradient_checkpointing: bool | None = None,
    logprob_chunk_size: int | None = None,
    extra_state_bytes: int = 0,
    offload_reference: bool = False,
) -> MemoryPlan:
    """The microbatching of a run: the user's settings where given (not None), the rest chosen.

    Args:
        shape: the policy's `ModelShape`.
        seq_len: longest prompt + `rollout.max_new_tokens`, the widest row a step can hold.
        rows_per_step: rows this process trains on per step (B x G / ranks).
        sample_rows: rows a training step samples at once at most.
        budget_bytes: memory the run may use (free device memory, or the user's cap).
        reference: a frozen reference copy is held (beta > 0 without LoRA).
        critic: PPO's critic is held.
        held_cache_rows: rows of KV cache the sampler keeps between rollouts (the
            `cuda_graph` backend's graphs point into theirs), present during the update and
            an evaluation too.
        eval_rows: rows an evaluation samples at once (0: none); more than `held_cache_rows`
            take a workspace of their own beside the held one, freed after the evaluation.
        extra_state_bytes: other weights held on the device all run long (a reward model's),
            counted in the state and the peaks, not in the activation allowance.
        offload_reference: the reference's weights are in host memory but for the reference
            pass (with `reference`).
    Returns:
        the plan; `plan.fits` is False when even one row per microbatch with checkpointing
        is predicted to exceed the budget.
    """
    chunk = logprob_chunk_size or logits_chunk(shape.vocab)
    policy_state = state_bytes(shape, reference=reference, critic=critic)
    state = policy_state + extra_state_bytes
    trainable_head = shape.trainable == shape.params
    held = kv_cache_bytes(shape, held_cache_rows, seq_len)
    fixed = state + held + logits_bytes(shape, chunk, trainable_head)
    # on the device only for the reference pass when offloaded
    offloaded = shape.params * shape.weight_bytes if reference and offload_reference else 0
    gradients = shape.trainable * shape.weight_bytes  # made for the update, freed after it
    usable = budget_bytes * (1 - RESERVED_FRACTION)

    evaluation = sampling_bytes(shape, eval_rows, seq_len) if eval_rows else 0
    if eval_rows > held_cache_rows:
        evaluation += held

    def train_peak(rows: int, checkpointing: bool) -> int:
        stored = rows * seq_len * activation_bytes_per_token(shape, checkpointing)
        return fixed - offloaded + stored

    def reference_peak(rows: int, checkpointing: bool) -> int:
        """Within the update's: the weights it may hold were the gradients' room."""
        if not reference:
            return 0
        tokens = forward_only_tokens(shape, rows * seq_len, checkpointing)
        return fixed - gradients + tokens * forward_only_bytes_per_token(shape)

    most_rows = max(1, rows_per_step)
    # the token budget, in rows of the widest length
    rows = microbatch_rows or min(most_rows, max(1, MICROBATCH_TOKENS // seq_len))
    checkpointing = gradient_checkpointing
    if checkpointing is None:
        # with very few layers, the recomputed layer costs more than the inputs it saves
        helps = activation_bytes_per_token(shape, True) < activation_bytes_per_token(shape, False)
        stored = rows * seq_len * activation_bytes_per_token(shape, False)
        # the policy's own state: a reward model's weights do not make room for activations
        allowance = max(ACTIVATION_FLOOR, ACTIVATION_ALLOWANCE * policy_state)
        checkpointing = helps and (stored > allowance or train_peak(rows, False) > usable)
    if microbatch_rows is None:
        while rows > 1 and train_peak(rows, checkpointing) > usable:
            rows = max(1, rows // 2)
    return MemoryPlan(
        # Unset, rows are not capped: the token budget bounds what a microbatch holds. Rows
        # shorter than the widest then share a microbatch (sampled lengths vary; packed rows
        # run a shared prompt once), and an update on a GPU, which waits on its kernels'
        # launches more than on their arithmetic, runs fewer microbatches.
        microbatch_rows=microbatch_rows or most_rows,
        microbatch_tokens=rows * seq_len,
        gradient_checkpointing=checkpointing,
        logprob_chunk_size=chunk,
        state_bytes=state,
        train_peak_bytes=train_peak(rows, checkpointing),
        sample_peak_bytes=(
            state
            - offloaded
            - gradients
            + max(sampling_bytes(shape, sample_rows, seq_len), evaluation)
        ),
        reference_peak_bytes=reference_peak(rows, checkpointing),
        offload_reference=bool(offloaded),
        budget_bytes=budget_bytes,
    )


def device_budget(device: torch.device, gpu_memory_gb: float | None) -> int:
    """Bytes a run may use on a CUDA `device`: `gpu_memory_gb` GiB when set, else what is
    free now plus what this process already holds there (its loaded weights)."""
    import torch

    if gpu_memory_gb is not None:
        return int(gpu_memory_gb * GIB)
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_allocated(device)
