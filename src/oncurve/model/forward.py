"""The training forward: log-probabilities (and entropy) of the completion tokens of each row
under a causal LM, the prompt shared by a group's rows run once, rows packed or padded."""

from __future__ import annotations

import torch
import transformers

from oncurve.algo.logprobs import logprobs_from_hidden
from oncurve.algo.truncation import KEEP_ALL, Truncation
from oncurve.model.kv_cache import cache_argument, real_token_positions
from oncurve.model.packing import RowLengths, packed_hidden


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    prompt_index: torch.Tensor | None = None,
    packed: RowLengths | None = None,
    truncation: Truncation = KEEP_ALL,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `completion_len` tokens of each row under `model`, at
    `temperature` and under the sampler's `truncation` (top-k, top-p, min-p: the truncated,
    renormalised distribution it draws from, `oncurve.algo.truncation`).

    The decoder trunk runs once; logits are formed only at the completion positions and in
    chunks (see `oncurve.algo.logprobs`). Position ids count real tokens only, so a left-padded
    prompt sees the same positions as an unpadded one; the sampler uses the same convention,
    which is what makes its logprobs equal these.

    With `prompt_index`, rows that share a prompt share its forward: each distinct prompt runs
    once and its KV cache (with its autograd graph) is expanded to its rows, which then run only
    their completion tokens. The G completions of a GRPO group have one prompt, so this saves
    (G - 1) / G of the prompt tokens' forward and backward; the result equals the plain forward
    up to float rounding (`tests/unit/update/test_step.py`).

    With `packed` (the rows' real lengths and prompt numbers, known on the host), the rows run
    packed end to end with no padding, each shared prompt once (`oncurve.model.packing`; the model's
    attention must be `packed_attention.ATTENTION`), and `prompt_index` is not used.

    Args:
        model: a Hugging Face causal LM (`base_model` trunk + output embeddings).
        input_ids: `[N, P+T]` left-padded prompt followed by right-padded completion.
        attention_mask: `[N, P+T]` 1 on real tokens.
        completion_len: T.
        prompt_index: `[N]` equal for rows whose P prompt columns are equal, or None.
    Returns:
        (`[N, T]` float32 logprobs, `[N, T]` entropy or None); values on padding are meaningless
        and must be masked by the caller.
    """
    hidden = completion_hidden(
        model.base_model, input_ids, attention_mask, completion_len, prompt_index, packed
    )
    labels = input_ids[:, -completion_len:]
    head = model.get_output_embeddings()
    return logprobs_from_hidden(
        hidden, head.weight, labels, temperature, chunk_size, head.bias, with_entropy, truncation
    )


def completion_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    prompt_index: torch.Tensor | None = None,
    packed: RowLengths | None = None,
) -> torch.Tensor:
    """`[N, T, H]` hidden states of a decoder `trunk` before each of the last `completion_len`
    tokens, position ids counting real tokens only; with `packed`, the rows packed, else with
    `prompt_index`, each distinct prompt run once (see `completion_logprobs`)."""
    if packed is not None:
        return packed_hidden(trunk, input_ids, completion_len, packed)
    position_ids = real_token_positions(attention_mask)
    if prompt_index is not None:
        prompts, row_prompt = torch.unique(prompt_index, return_inverse=True)
        # rows whose prompts are all distinct gain nothing from a second forward
        if len(prompts) < len(row_prompt):
            select = torch.nn.functional.one_hot(row_prompt, len(prompts))
            return _shared_prompt_hidden(
                trunk, input_ids, attention_mask, position_ids, completion_len, select
            )
    out = trunk(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    return out.last_hidden_state[:, -completion_len - 1 : -1]


def _shared_prompt_hidden(
    trunk: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_len: int,
    select: torch.Tensor,
) -> torch.Tensor:
    """`[N, T, H]` hidden states before each completion token, each distinct prompt run once;
    `select` `[N, U]` is one-hot: row n has prompt u."""
    prompt_len = input_ids.shape[1] - completion_len
    first_row = select.argmax(0)  # argmax takes the first of equal maxima: a prompt's first row
    cache = transformers.DynamicCache(config=trunk.config)
    prompt = trunk(
        input_ids=input_ids[first_row, :prompt_len],
        attention_mask=attention_mask[first_row, :prompt_len],
        position_ids=position_ids[first_row, :prompt_len],
        use_cache=True,
        **cache_argument(trunk, cache),
    )
    # Rows take their prompt's cache through a one-hot matmul, not indexing: the backward of an
    # index adds the G rows' gradients in an order that differs between processes, which made
    # two runs of one seed differ by 1e-7 and drift apart; a matmul sums in a fixed order.
    select = select.to(prompt.last_hidden_state.dtype)
    for layer in cache.layers:
        layer.keys = _rows_of(select, layer.keys)
        layer.values = _rows_of(select, layer.values)
    completion = trunk(
        input_ids=input_ids[:, prompt_len:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, prompt_len:],
        use_cache=True,
        **cache_argument(trunk, cache),
    )
    last_prompt = _rows_of(select, prompt.last_hidden_state[:, -1:])
    return torch.cat([last_prompt, completion.last_hidden_state[:, :-1]], dim=1)


def _rows_of(select: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`[N, ...]` row n of `values` `[U, ...]` picked by the one-hot `select` `[N, U]` (exact:
    a product with one 1 and zeros)."""
    picked = select @ values.flatten(1)
    return picked.view(select.shape[0], *values.shape[1:])


class PolicyLogprobs(torch.nn.Module):
    """`completion_logprobs` as a module, so that DDP or FSDP2 can wrap the training forward
    (their gradient hooks are armed by the wrapper's forward)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_len: int,
        temperature: float = 1.0,
        chunk_size: int = 1024,
        with_entropy: bool = False,
        prompt_index: torch.Tensor | None = None,
        packed: RowLengths | None = None,
        truncation: Truncation = KEEP_ALL,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return completion_logprobs(
            self.model,
            input_ids,
            attention_mask,
            completion_len,
            temperature,
            chunk_size,
            with_entropy,
            prompt_index,
            packed,
            truncation,
        )
