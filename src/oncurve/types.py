"""Typed containers that flow between the stages of one training step.

Shapes use N = B*G rows (B prompts, G completions each, a group's rows contiguous), P prompt
positions (left-padded) and T completion positions (right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from oncurve.model.packing import RowLengths


@dataclass
class RolloutBatch:
    """What a sampler returns for B prompts x G completions.

    Attributes:
        prompt_ids: `[N, P]` prompt tokens, left-padded with the pad id; row i*G+g repeats prompt i.
        prompt_mask: `[N, P]` 1 on real prompt tokens, 0 on left padding.
        completion_ids: `[N, T]` sampled tokens, right-padded with the pad id after the end.
        completion_mask: `[N, T]` 1 on sampled tokens (the EOS or stop token that ended a row
            included), 0 on padding.
        logprobs: `[N, T]` log pi(token) under softmax(logits / temperature), truncated by
            top-k/top-p/min-p and renormalised (`oncurve.algo.truncation`), the quantity the
            trainer's forward recomputes; 0 on padding.
        texts: N decoded completions (special tokens skipped, cut after a stop string).
        finish_reasons: N of "eos", "stop" (a stop string) or "length" (max_new_tokens reached).
        group_size: G.
        tool_mask: `[N, T]` 1 on tokens that the sampler did not draw but fed in (a multi-turn
            episode's observations, `oncurve.rollout.episodes`), 0 elsewhere; None when every
            completion token was sampled. Those tokens are read by the forward but have no
            loss, and their `logprobs` are 0.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    texts: list[str]
    finish_reasons: list[str]
    group_size: int
    tool_mask: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        """N = B*G."""
        return self.completion_ids.shape[0]

    @property
    def input_ids(self) -> torch.Tensor:
        """`[N, P+T]` prompt and completion, the trainer's forward input."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """`[N, P+T]` 1 on every real token (prompt or completion)."""
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def loss_mask(self) -> torch.Tensor:
        """`[N, T]` 1 on the tokens the policy sampled: the completion less any observations."""
        if self.tool_mask is None:
            return self.completion_mask
        return self.completion_mask * (1 - self.tool_mask)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """`[N]` completion tokens in each row, a multi-turn episode's observations included."""
        return self.completion_mask.sum(dim=1)

    def completion_token_lists(self) -> list[list[int]]:
        """Each row's completion token ids without its padding (N lists), as reward functions
        take them (`completion_ids`)."""
        lengths = self.completion_lengths.tolist()
        rows = self.completion_ids.tolist()
        return [row[:length] for row, length in zip(rows, lengths, strict=True)]

    @staticmethod
    def concat(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
        """Stack batches of one group size: prompts left-padded, completions right-padded to
        the widest."""
        width_p = max(b.prompt_ids.shape[1] for b in batches)
        width_t = max(b.completion_ids.shape[1] for b in batches)

        def pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
            extra = width - t.shape[1]
            return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

        return RolloutBatch(
            prompt_ids=torch.cat([pad(b.prompt_ids, width_p, pad_id, True) for b in batches]),
            prompt_mask=torch.cat([pad(b.prompt_mask, width_p, 0, True) for b in batches]),
            completion_ids=torch.cat(
                [pad(b.completion_ids, width_t, pad_id, False) for b in batches]
            ),
            completion_mask=torch.cat([pad(b.completion_mask, width_t, 0, False) for b in batches]),
            logprobs=torch.cat([pad(b.logprobs, width_t, 0.0, False) for b in batches]),
            texts=[text for b in batches for text in b.texts],
            finish_reasons=[r for b in batches for r in b.finish_reasons],
            group_size=batches[0].group_size,
            tool_mask=(
                None
                if all(b.tool_mask is None for b in batches)
                else torch.cat(
                    [
                        pad(
                            torch.zeros_like(b.completion_mask)
                            if b.tool_mask is None
                            else b.tool_mask,
                            width_t,
                            0,
                            False,
                        )
                        for b in batches
                    ]
                )
            ),
        )

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The batch restricted to `rows` (a 1-D index tensor of whole groups), same group size."""
        index = rows.tolist()
        return RolloutBatch(
            prompt_ids=self.prompt_ids[rows],
            prompt_mask=self.prompt_mask[rows],
            completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows],
            logprobs=self.logprobs[rows],
            texts=[self.texts[i] for i in index],
            finish_reasons=[self.finish_reasons[i] for i in index],
            group_size=self.group_size,
            tool_mask=None if self.tool_mask is None else self.tool_mask[rows],
        )


@dataclass
class TrainBatch:
    """A scored rollout, ready for the policy update.

    Attributes:
        input_ids: `[N, P+T]` prompt and completion tokens.
        attention_mask: `[N, P+T]` 1 on real tokens.
        completion_mask: `[N, T]` 1 on tokens that count in the loss.
        advantages: `[N]` one advantage per completion, given to each of its tokens, or `[N, T]`
            one per token (PPO's GAE).
        old_logprobs: `[N, T]` pi_old, or None when mu = 1 (the update's own detached logprobs).
        ref_logprobs: `[N, T]` pi_ref, or None when beta = 0.
        sample_logprobs: `[N, T]` the sampler's logprobs, compared with pi_old as a health check
            and the denominator of the importance weight (`algo.is_correction`).
        prompt_index: `[N]` equal for rows with the same prompt (a group), so that the forward
            can run each prompt once; None to run every row whole.
        row_lengths: the rows' real lengths and prompt numbers, when known on the host (a
            microbatch's, `update.step.Microbatch.of`), for a forward of the rows packed
            (`oncurve.model.packing.RowLengths`); else None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    sample_logprobs: torch.Tensor | None = None
    prompt_index: torch.Tensor | None = None
    row_lengths: RowLengths | None = None

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> TrainBatch:
        """A minibatch of consecutive rows (a slice) or of any rows (a 1-D index tensor)."""

        def part(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return TrainBatch(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            completion_mask=self.completion_mask[index],
            advantages=self.advantages[index],
            old_logprobs=part(self.old_logprobs),
            ref_logprobs=part(self.ref_logprobs),
            sample_logprobs=part(self.sample_logprobs),
            prompt_index=part(self.prompt_index),
        )
