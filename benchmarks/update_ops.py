"""The ops one GRPO update and one reference pass dispatch, by the training forward's layout
(padded or packed rows, every row whole or each group's prompt once), and the microbatches of
sampled lengths under CUDA's memory plan; on a GPU each op that is not a view is about one kernel
launch. The step and both tables: benchmarks/README.md.

    .venv/bin/python benchmarks/update_ops.py [--microbatch 16] [--chunk 256] [--batches 20]
"""

from __future__ import annotations

import argparse

import torch
import transformers
from harness import updates
from harness.models import SHAPES, VOCAB, qwen2_config
from harness.tables import markdown_table, measured, publish

from oncurve.model.forward import PolicyLogprobs
from oncurve.run.memory_plan import GIB, ModelShape, plan_memory
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs
from oncurve.update.step import LossFns

# Qwen2.5-0.5B's layers (24, 14 heads, 2 key-value heads) at 112 wide instead of 896: the width
# changes no count
NARROW = (112, 224, 24, 14, 2)
PROMPTS, GROUP, COMPLETION = 8, 8, 256
ROWS = PROMPTS * GROUP
SHORTEST_PROMPT, LONGEST_PROMPT = 67, 83
# sampled lengths: geometric with this mean, cut at this many tokens
MEAN_LENGTH, MAX_NEW_TOKENS = 256, 1024
LAYOUTS = (  # name, packed, each prompt once
    ("padded, every row whole (TRL's layout)", False, False),
    ("padded, each prompt once (KV cache; the default before packing)", False, True),
    ("packed, every row whole", True, False),
    ("packed, each prompt once (`model.pack_rows`, null on CUDA)", True, True),
)


def a_batch(lengths: torch.Tensor) -> TrainBatch:
    """The step's 8 groups of 8 rows, prompts of 67-83 tokens, completions of `lengths`."""
    prompt_lengths = torch.randint(SHORTEST_PROMPT, LONGEST_PROMPT + 1, (PROMPTS,))
    return updates.group_batch(prompt_lengths, GROUP, lengths, VOCAB)


def sampled_lengths(generator: torch.Generator) -> torch.Tensor:
    """`[64]` completion lengths, geometric with mean `MEAN_LENGTH`, 1 to `MAX_NEW_TOKENS`."""
    draws = torch.rand(ROWS, generator=generator)
    lengths = torch.log1p(-draws) / torch.log1p(torch.tensor(-1.0 / MEAN_LENGTH))
    return lengths.ceil().long().clamp(1, MAX_NEW_TOKENS)


def layouts(policy: PolicyLogprobs, fns: LossFns, args: argparse.Namespace) -> list[list]:
    """The first table's rows, completions of `COMPLETION` tokens: (layout, reference ops, update
    ops, update ops with views)."""
    batch, rows = a_batch(torch.full((ROWS,), COMPLETION)), []
    for name, packed, shared in LAYOUTS:
        step = updates.in_layout(policy.model, batch, packed, shared)
        forward = ForwardSettings(1.0, args.chunk, args.microbatch, pack_rows=packed)
        reference = updates.OpCount.of(batch_logprobs, policy, step, forward)
        update = updates.OpCount.of(updates.update_of(policy, step, forward, fns))
        rows.append([name, reference.kernels, update.kernels, update.ops])
        print(f"{name}: reference {reference.kernels}, update {update.kernels}", flush=True)
    return rows


def sampled_microbatches(policy: PolicyLogprobs, fns: LossFns, args: argparse.Namespace) -> dict:
    """The second table's rows ("sampled": settings, microbatches, tokens run, update ops), the
    plan's token budget ("budget") and widest length's rows ("widest"), 0.5B shape in bfloat16."""
    longest = LONGEST_PROMPT + MAX_NEW_TOKENS
    with torch.device("meta"):
        full = transformers.Qwen2ForCausalLM(qwen2_config(SHAPES["qwen2.5-0.5b"], VOCAB))
    shape = ModelShape.of(full.to(torch.bfloat16))
    plan = plan_memory(shape, seq_len=longest, rows_per_step=ROWS, sample_rows=ROWS,
                       budget_bytes=80 * GIB, reference=True)  # fmt: skip
    budget = plan.microbatch_tokens
    widest = budget // longest
    generator = torch.Generator().manual_seed(0)
    batches = [a_batch(sampled_lengths(generator)) for _ in range(args.batches)]
    rows = []
    for name, max_rows, packed in (
        (f"padded, at most {widest} rows (the plan before)", widest, False),
        (f"packed, at most {widest} rows", widest, True),
        ("padded, the token budget alone (the plan now)", plan.microbatch_rows, False),
        ("packed, the token budget alone (the plan now, CUDA's default)", plan.microbatch_rows, True),
    ):  # fmt: skip
        cuts = [updates.tokens_run(batch, max_rows, budget, packed) for batch in batches]
        forward = ForwardSettings(1.0, args.chunk, max_rows, budget, pack_rows=packed)
        update = updates.OpCount.of(updates.update_of(policy, batches[0], forward, fns)).kernels
        count = sum(map(len, cuts)) / len(cuts)
        tokens = sum(map(sum, cuts)) / len(cuts)
        rows.append([name, count, tokens, update])
        print(f"{name}: {count:.1f} microbatches, {tokens:,.0f} tokens, {update:,} ops", flush=True)
    return {"sampled": rows, "budget": budget, "widest": widest}


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
        f"{measured(row)} (counts, not times: the machine's load does not enter). {PROMPTS} "
        f"prompts x G={GROUP}, completions {COMPLETION} tokens, "
        f"{-(-ROWS // a['microbatch'])} microbatches of {a['microbatch']} rows, "
        f"logprob chunk {a['chunk']}; ops that are not views (about one kernel launch each on a "
        f"GPU)\n\n{layouts}\n\nCompletions of sampled lengths (geometric, mean {MEAN_LENGTH}, "
        f"at most {MAX_NEW_TOKENS}), mean of {a['batches']} draws (`--batches`); the memory "
        f"plan's budget for the 0.5B shape: {row['budget']:,} tokens a microbatch, "
        f"{row['widest']} rows of the widest length\n\n{sampled}\n"
    )


def summary(row: dict) -> str:
    """The row in one line: the update's ops by layout, and the sampled microbatches."""
    base = row["layouts"][0][2]
    layouts = "; ".join(f"{name} {upd:,} ({upd / base:.2f}x)" for name, _, upd, _ in row["layouts"])
    sampled = "; ".join(f"{name} {count:.1f} microbatches, {update:,} ops"
                        for name, count, _, update in row["sampled"])  # fmt: skip
    return f"update ops: {layouts}. Sampled lengths: {sampled}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatch", type=int, default=16, help="rows per microbatch")
    parser.add_argument("--chunk", type=int, default=256, help="logprob chunk (CUDA's at 152k)")
    parser.add_argument("--batches", type=int, default=20, help="draws of sampled lengths")
    args = parser.parse_args()
    policy, fns = updates.setup(NARROW, VOCAB, threads=2)
    row = {"renderer": "update_ops", "args": vars(args), "layouts": layouts(policy, fns, args)}
    row |= sampled_microbatches(policy, fns, args)
    publish("update_ops", "Ops one GRPO update dispatches", "ops", row)


if __name__ == "__main__":
    main()
