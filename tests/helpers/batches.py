"""Training batches built by hand (rows cut through groups, rows of given lengths, a fixed
batch of ragged groups), the loss functions and one GRPO accumulation that train on them, and
a batch moved to a device."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch

from helpers.models import make_model
from oncurve.algo import group_advantages
from oncurve.algo.registry import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from oncurve.model.forward import PolicyLogprobs
from oncurve.model.packing import RowLengths
from oncurve.types import RolloutBatch, TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs
from oncurve.update.step import LossFns, accumulate_gradients

# grouped_rows: 4 prompts of 6 tokens, 3 completions of 7 each
GROUP, PROMPTS, PROMPT_LEN, COMPLETION_LEN = 3, 4, 6, 7


def grouped_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """8 of 12 rows (4 prompts x 3) in shuffled order, so the rows cut through groups: left-padded
    prompts, right-padded completions. Returns input_ids, attention_mask, completion mask and
    each row's prompt number."""
    g = torch.Generator().manual_seed(seed)
    rows = PROMPTS * GROUP
    prompts = torch.randint(3, 50, (PROMPTS, PROMPT_LEN), generator=g)
    prompt_mask = torch.ones(PROMPTS, PROMPT_LEN, dtype=torch.long)
    prompt_mask[0, :3] = 0
    prompt_mask[2, :1] = 0
    completions = torch.randint(3, 50, (rows, COMPLETION_LEN), generator=g)
    completion_mask = torch.ones(rows, COMPLETION_LEN, dtype=torch.long)
    completion_mask[::2, 4:] = 0
    ids = torch.cat([prompts.repeat_interleave(GROUP, 0), completions], 1)
    mask = torch.cat([prompt_mask.repeat_interleave(GROUP, 0), completion_mask], 1)
    pick = torch.randperm(rows, generator=g)[:8]
    index = torch.arange(rows) // GROUP
    return ids[pick], mask[pick], completion_mask[pick], index[pick]


def grpo_batch(seed: int, share_prompt: bool) -> tuple[torch.nn.Module, TrainBatch]:
    """A tiny Qwen2 and `grouped_rows(seed)` as a batch to train on."""
    model = make_model("qwen2")
    ids, mask, completion_mask, index = grouped_rows(seed)
    advantages = torch.linspace(-1.5, 1.5, ids.shape[0])
    ref = torch.full(completion_mask.shape, -3.0)
    batch = TrainBatch(ids, mask, completion_mask, advantages, ref_logprobs=ref)
    batch.prompt_index = index if share_prompt else None
    return model, batch


def accumulate_grpo(
    model: torch.nn.Module, batch: TrainBatch, forward: ForwardSettings, num_tokens: float
) -> None:
    accumulate_gradients(
        PolicyLogprobs(model), batch, loss_fns("seq-mean-token-mean"), forward,
        num_seqs=8.0, num_tokens=num_tokens,
    )  # fmt: skip


def lengths_batch(prompts: list[int], completions: list[int]) -> TrainBatch:
    """Rows with these real prompt (left-padded to 4) and completion (right-padded to 5)
    lengths."""
    rows = len(prompts)
    prompt_mask = (torch.arange(4) >= 4 - torch.tensor(prompts)[:, None]).long()
    completion_mask = (torch.arange(5) < torch.tensor(completions)[:, None]).long()
    mask = torch.cat([prompt_mask, completion_mask], 1)
    return TrainBatch(
        torch.randint(3, 50, (rows, 9)) * mask, mask, completion_mask, torch.ones(rows)
    )


def lengths_of(mask: torch.Tensor, groups: torch.Tensor | None) -> RowLengths:
    """What `microbatches` reads to the host for rows with this `[N, P+T]` attention mask."""
    prompt_len = mask.shape[1] - COMPLETION_LEN
    return RowLengths(
        tuple(mask[:, :prompt_len].sum(1).tolist()),
        tuple(mask[:, prompt_len:].sum(1).tolist()),
        None if groups is None else tuple(groups.tolist()),
    )


# fixed_batch: token ids below 40 (a `tiny_qwen2(VOCAB)`'s), 4 groups of 3, prompts of 5 and
# completions of 7 at most
VOCAB, GROUPS, G, P, T = 40, 4, 3, 5, 7


def fixed_batch(model: torch.nn.Module) -> TrainBatch:
    """12 rows in 4 groups of 3, a prompt each, ragged prompts and completions, advantages from
    random rewards."""
    g = torch.Generator().manual_seed(1)
    n = GROUPS * G
    prompt_lens = torch.randint(2, P + 1, (GROUPS,), generator=g).repeat_interleave(G)
    completion_lens = torch.randint(1, T + 1, (n,), generator=g)
    prompt_mask = (torch.arange(P) >= P - prompt_lens[:, None]).long()
    completion_mask = (torch.arange(T) < completion_lens[:, None]).long()
    input_ids = torch.randint(4, VOCAB, (n, P + T), generator=g)
    input_ids[:, :P] = input_ids[::G, :P].repeat_interleave(G, 0)  # a group's rows, one prompt
    attention = torch.cat([prompt_mask, completion_mask], 1)
    input_ids = torch.where(attention.bool(), input_ids, 0)
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    batch = TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion_mask,
        advantages=group_advantages(rewards, G),
    )
    batch.ref_logprobs = (
        batch_logprobs(PolicyLogprobs(model), batch, ForwardSettings(1.0, 16, n)) + 0.05
    )
    return batch


def loss_fns(aggregation: str) -> LossFns:
    return LossFns(
        policy_loss=POLICY_LOSSES["ppo_clip"],
        aggregate=AGGREGATIONS[aggregation],
        kl=KL_ESTIMATORS["k3"],
        beta=0.04,
        eps_low=0.2,
        eps_high=0.28,
        dual_clip=None,
        norm_len=float(T),
    )


BatchT = TypeVar("BatchT", TrainBatch, RolloutBatch)


def batch_to(batch: BatchT, device: str | torch.device) -> BatchT:
    """A copy of `batch` (a TrainBatch or RolloutBatch) with every tensor on `device`."""
    tensors = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return dataclasses.replace(
        batch, **{k: v.to(device) for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    )
