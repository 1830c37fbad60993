"""One policy update on a scored batch: microbatch forward -> logprobs -> loss -> backward.

No I/O and no optimizer here; the trainer owns those.
"""

from __future__ import annotations

import torch

from oncurve.algo.logprobs import logprobs_from_hidden


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `completion_len` tokens of each row under `model`.

    The decoder trunk runs once; logits are formed only at the completion positions and in
    chunks (see `oncurve.algo.logprobs`). Position ids count real tokens only, so a left-padded
    prompt sees the same positions as an unpadded one; the sampler uses the same convention,
    which is what makes its logprobs equal these.

    Args:
        model: a Hugging Face causal LM (`base_model` trunk + output embeddings).
        input_ids: `[N, P+T]` left-padded prompt followed by right-padded completion.
        attention_mask: `[N, P+T]` 1 on real tokens.
        completion_len: T.
    Returns:
        (`[N, T]` float32 logprobs, `[N, T]` entropy or None); values on padding are meaningless
        and must be masked by the caller.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    trunk = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    hidden = trunk.last_hidden_state[:, -completion_len - 1 : -1]
    labels = input_ids[:, -completion_len:]
    head = model.get_output_embeddings()
    return logprobs_from_hidden(
        hidden, head.weight, labels, temperature, chunk_size, head.bias, with_entropy
    )
