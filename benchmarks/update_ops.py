"""The ops one GRPO update and one reference pass dispatch, by the training forward's layout:
padded rows (every row whole, as TRL runs them, or each group's prompt once through its KV
cache) against packed rows (`model.pack_rows`, every row whole or each prompt once).

On a GPU each op that is not a view is about one kernel launch; where the update runs far
slower than its arithmetic, the count is a CPU-measurable stand-in for launch overhead. The model has the layer
structure of `gpu_vs_trl.py`'s Qwen2.5-0.5B shape (24 layers, 14 query and 2 key-value heads,
its vocabulary, tied embeddings) at a narrow width, which changes no count; the batch is that
script's step: 8 prompts x G=8 of 67-83 tokens, completions forced to 256.

Packed rows run CUDA's path with the variable-length attention replaced by a stand-in of one
op forward and three backward (the real one is one each way), so their count errs high by
two ops a layer. The logprob head runs its CPU path (float32 blocks, not the bfloat16 head
read in place), the same for every layout.

A second table takes completions of sampled lengths (geometric, mean 256, at most 1,024, as
`rollout.py`'s varying scenario) and the microbatches CUDA's memory plan sets for them
(`memory.plan_memory` for the 0.5B shape, 80 GiB): its token budget alone, or as before also
capped at the rows of the widest length that budget holds, padded and packed; it counts the
microbatches, the tokens their forwards run (padding and each prompt's runs included) and the
update's ops, over `--batches` draws (ops of the first).

    .venv/bin/python benchmarks/update_ops.py [--microbatch 16] [--chunk 256] [--batches 20]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import transformers
from harness.models import qwen2_config
from harness.tables import markdown_table, measured, publish
from harness.updates import OpCount, count_packed_as_on_cuda, default_loss_fns, update_of

from oncurve.model import packed_attention
from oncurve.model.forward import PolicyLogprobs
from oncurve.run.memory_plan import GIB, ModelShape, plan_memory
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs, microbatches
from oncurve.update.step import LossFns

VOCAB = 151_936
# Qwen2.5-0.5B's layers (24, 14 heads, 2 key-value heads) at 112 wide instead of 896
SHAPE = (112, 224, 24, 14, 2)
PROMPTS, GROUP, COMPLETION = 8, 8, 256
# sampled lengths: geometric with this mean, cut at this many tokens
MEAN_LENGTH, MAX_NEW_TOKENS = 256, 1024
QWEN_05B = ModelShape(
    params=494_032_768, trainable=494_032_768, layers=24, hidden=896, intermediate=4864,
    kv_dim=128, vocab=VOCAB, weight_bytes=2, tied=True,
)  # fmt: skip


def the_step(seed: int = 0) -> tuple[torch.nn.Module, TrainBatch]:
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(qwen2_config(SHAPE, VOCAB))
    return model, a_batch(torch.full((PROMPTS * GROUP,), COMPLETION))


def a_batch(lengths: torch.Tensor) -> TrainBatch:
    """8 groups of 8 rows, prompts of 67-83 tokens, completions of `lengths` `[64]` tokens."""
    rows, width = PROMPTS * GROUP, int(lengths.max())
    prompt_lengths = torch.randint(67, 84, (PROMPTS,)).repeat_interleave(GROUP)
    longest = int(prompt_lengths.max())
    prompt_mask = (torch.arange(longest) >= longest - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, VOCAB, (PROMPTS, longest)).repeat_interleave(GROUP, 0)
    completion_mask = (torch.arange(width) < lengths[:, None]).long()
    mask = torch.cat([prompt_mask, completion_mask], 1)
    ids = torch.cat([prompts, torch.randint(3, VOCAB, (rows, width))], 1) * mask
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
    draws = torch.rand(PROMPTS * GROUP, generator=generator)
    lengths = torch.log1p(-draws) / torch.log1p(torch.tensor(-1.0 / MEAN_LENGTH))
    return lengths.ceil().long().clamp(1, MAX_NEW_TOKENS)


def tokens_run(batch: TrainBatch, max_rows: int, max_tokens: int, packed: bool) -> list[int]:
    """Each microbatch's tokens through the forward: padded, rows x (longest prompt + longest
    completion); packed, real tokens with each group's prompt once."""
    cuts = microbatches(batch, max_rows, max_tokens, packed)
    if not packed:
        return [len(c.lengths.prompts) * (c.longest_prompt + c.longest_completion) for c in cuts]
    out = []
    for cut in cuts:
        lengths = cut.lengths
        prompts = dict(zip(lengths.groups or (), lengths.prompts, strict=True))
        out.append(sum(prompts.values()) + sum(lengths.completions))
    return out


def counts(
    policy: PolicyLogprobs, step: TrainBatch, fns: LossFns, forward: ForwardSettings
) -> list:
    """Kernel-launching ops of the reference pass and of the update, and the update's ops."""
    with OpCount() as reference:
        batch_logprobs(policy, step, forward)
    one_update = update_of(policy, step, forward, fns)
    with OpCount() as update:
        one_update()
    return [reference.kernels, update.kernels, update.ops]


def layouts(model: torch.nn.Module, batch: TrainBatch, args: argparse.Namespace) -> list[list]:
    """The first table's rows: (layout, reference ops, update ops, update ops with views)."""
    fns, policy = default_loss_fns(), PolicyLogprobs(model)
    rows = []
    for name, packed, shared in (
        ("padded, every row whole (TRL's layout)", False, False),
        ("padded, each prompt once (KV cache; the default before packing)", False, True),
        ("packed, every row whole", True, False),
        ("packed, each prompt once (`model.pack_rows`, null on CUDA)", True, True),
    ):
        if packed and model.config._attn_implementation != packed_attention.ATTENTION:
            packed_attention.use_packed_attention(model)
        step = dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)
        forward = ForwardSettings(1.0, args.chunk, args.microbatch, pack_rows=packed)
        rows.append([name, *counts(policy, step, fns, forward)])
        print(f"{name}: reference {rows[-1][1]}, update {rows[-1][2]}", flush=True)
    return rows


def sampled_microbatches(
    model: torch.nn.Module, args: argparse.Namespace
) -> tuple[list[list], int, int]:
    """The second table's rows: (settings, microbatches, tokens run, update ops); and the plan's
    token budget and rows of the widest length."""
    plan = plan_memory(
        QWEN_05B, seq_len=83 + MAX_NEW_TOKENS, rows_per_step=PROMPTS * GROUP,
        sample_rows=PROMPTS * GROUP, budget_bytes=80 * GIB, reference=True,
    )  # fmt: skip
    budget = plan.microbatch_tokens
    widest = budget // (83 + MAX_NEW_TOKENS)
    generator = torch.Generator().manual_seed(0)
    batches = [a_batch(sampled_lengths(generator)) for _ in range(args.batches)]
    fns, policy = default_loss_fns(), PolicyLogprobs(model)
    rows = []
    for name, max_rows, packed in (
        (f"padded, at most {widest} rows (the plan before)", widest, False),
        (f"packed, at most {widest} rows", widest, True),
        ("padded, the token budget alone (the plan now)", plan.microbatch_rows, False),
        ("packed, the token budget alone (the plan now, CUDA's default)", plan.microbatch_rows, True),
    ):  # fmt: skip
        cuts = [tokens_run(batch, max_rows, budget, packed) for batch in batches]
        forward = ForwardSettings(1.0, args.chunk, max_rows, budget, pack_rows=packed)
        update = counts(policy, batches[0], fns, forward)[1]
        count = sum(map(len, cuts)) / len(cuts)
        tokens = sum(map(sum, cuts)) / len(cuts)
        rows.append([name, count, tokens, update])
        print(f"{name}: {count:.1f} microbatches, {tokens:,.0f} tokens, {update:,} ops", flush=True)
    return rows, budget, widest


def section(row: dict) -> str:
    """The markdown section of one row: ops by layout, microbatches of sampled lengths."""
    base = row["layouts"][1][2]
    layouts = markdown_table(
        ["forward layout", "reference pass", "update (fwd + bwd)", "vs each prompt once, padded",
         "update, views included"],
        [[name, f"{ref:,}", f"{upd:,}", f"{upd / base:.2f}x", f"{total:,}"]
         for name, ref, upd, total in row["layouts"]],
    )  # fmt: skip
    base = row["sampled"][0][3]
    sampled = markdown_table(
        ["microbatches", "per update", "tokens run", "update ops (first draw)", "ops vs before"],
        [[name, f"{count:.1f}", f"{tokens:,.0f}", f"{update:,}", f"{update / base:.2f}x"]
         for name, count, tokens, update in row["sampled"]],
    )  # fmt: skip
    a = row["args"]
    return (
        f"{measured(row)} (counts, not times: the machine's load does not enter). {PROMPTS} prompts x G={GROUP}, completions {COMPLETION} tokens, "
        f"{-(-PROMPTS * GROUP // a['microbatch'])} microbatches of {a['microbatch']} rows, "
        f"logprob chunk {a['chunk']}; ops that are not views (about one kernel launch each on a "
        f"GPU)\n\n{layouts}\n\nCompletions of sampled lengths (geometric, mean {MEAN_LENGTH}, "
        f"at most {MAX_NEW_TOKENS}), mean of {a['batches']} draws (`--batches`); the memory "
        f"plan's budget for the 0.5B shape: {row['budget']:,} tokens a microbatch, "
        f"{row['widest']} rows of the widest length\n\n{sampled}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatch", type=int, default=16, help="rows per microbatch")
    parser.add_argument("--chunk", type=int, default=256, help="logprob chunk (CUDA's at 152k)")
    parser.add_argument("--batches", type=int, default=20, help="draws of sampled lengths")
    args = parser.parse_args()
    torch.set_num_threads(2)
    count_packed_as_on_cuda()
    model, batch = the_step()
    rows = layouts(model, batch, args)
    sampled, budget, widest = sampled_microbatches(model, args)
    row = {"renderer": "update_ops", "args": vars(args), "layouts": rows, "sampled": sampled}
    row |= {"budget": budget, "widest": widest}
    publish("update_ops", "Ops one GRPO update dispatches", "ops", row)


if __name__ == "__main__":
    main()
