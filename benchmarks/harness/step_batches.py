"""`gpu_vs_trl.py`'s step as a batch for the CPU micro-benchmarks (`update_ops.py`): 8 prompts x
G=8 of 67-83 tokens with completions of given or sampled lengths, a model of the layer
structure of its Qwen2.5-0.5B shape at a narrow width (which changes no op count), the memory
plan's view of the whole shape, and the tokens a batch's microbatches run."""

from __future__ import annotations

from typing import Any

import torch

from harness.models import SHAPES, VOCAB, qwen2_config

# Qwen2.5-0.5B's layers (24, 14 heads, 2 key-value heads) at 112 wide instead of 896
NARROW = (112, 224, 24, 14, 2)
PROMPTS, GROUP, COMPLETION = 8, 8, 256
ROWS = PROMPTS * GROUP
SHORTEST_PROMPT, LONGEST_PROMPT = 67, 83
# sampled lengths: geometric with this mean, cut at this many tokens
MEAN_LENGTH, MAX_NEW_TOKENS = 256, 1024


def full_shape() -> Any:
    """The memory plan's `ModelShape` of the whole Qwen2.5-0.5B shape in bfloat16 (built on no
    device)."""
    import transformers

    from oncurve.run.memory_plan import ModelShape

    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(qwen2_config(SHAPES["qwen2.5-0.5b"], VOCAB))
    return ModelShape.of(model.to(torch.bfloat16))


def narrow_model(seed: int = 0) -> Any:
    """A random float32 model of the layer structure of Qwen2.5-0.5B at `NARROW` width (seeded
    with `seed`, which also seeds the batches drawn after it)."""
    import transformers

    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(qwen2_config(NARROW, VOCAB))


def a_batch(lengths: torch.Tensor) -> Any:
    """8 groups of 8 rows, prompts of 67-83 tokens, completions of `lengths` `[64]` tokens."""
    rows, width = ROWS, int(lengths.max())
    prompt_lengths = torch.randint(
        SHORTEST_PROMPT, LONGEST_PROMPT + 1, (PROMPTS,)
    ).repeat_interleave(GROUP)
    longest = int(prompt_lengths.max())
    prompt_mask = (torch.arange(longest) >= longest - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, VOCAB, (PROMPTS, longest)).repeat_interleave(GROUP, 0)
    completion_mask = (torch.arange(width) < lengths[:, None]).long()
    mask = torch.cat([prompt_mask, completion_mask], 1)
    ids = torch.cat([prompts, torch.randint(3, VOCAB, (rows, width))], 1) * mask
    from oncurve.types import TrainBatch

    return TrainBatch(
        ids,
        mask,
        completion_mask,
        torch.linspace(-1.0, 1.0, rows),
        ref_logprobs=torch.full((rows, width), -3.0) * completion_mask,
        prompt_index=torch.arange(rows) // GROUP,
    )


def sampled_lengths(generator: torch.Generator) -> torch.Tensor:
    """`[64]` completion lengths, geometric with mean `MEAN_LENGTH`, 1 to `MAX_NEW_TOKENS`."""
    draws = torch.rand(ROWS, generator=generator)
    lengths = torch.log1p(-draws) / torch.log1p(torch.tensor(-1.0 / MEAN_LENGTH))
    return lengths.ceil().long().clamp(1, MAX_NEW_TOKENS)


def tokens_run(batch: Any, max_rows: int, max_tokens: int, packed: bool) -> list[int]:
    """Each microbatch's tokens through the forward of the `TrainBatch` `batch` cut as a run
    cuts it: padded, rows x (longest prompt + longest completion); packed, real tokens with each
    group's prompt once."""
    from oncurve.update.microbatches import microbatches

    cuts = microbatches(batch, max_rows, max_tokens, packed)
    if not packed:
        return [len(c.lengths.prompts) * (c.longest_prompt + c.longest_completion) for c in cuts]
    out = []
    for cut in cuts:
        lengths = cut.lengths
        prompts = dict(zip(lengths.groups or (), lengths.prompts, strict=True))
        out.append(sum(prompts.values()) + sum(lengths.completions))
    return out
