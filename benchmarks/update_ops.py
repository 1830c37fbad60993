"""The ops one GRPO update and one reference pass dispatch, by the training forward's layout:
padded rows (every row whole, as TRL runs them, or each group's prompt once through its KV
cache) against packed rows (`model.pack_rows`, every row whole or each prompt once).

On a GPU each op that is not a view is about one kernel launch; where the update runs far
slower than its arithmetic, the count is a CPU-measurable stand-in for launch overhead. The
model has the layer structure of `gpu_vs_trl.py`'s Qwen2.5-0.5B shape (24 layers, 14 query and
2 key-value heads, its vocabulary, tied embeddings) at a narrow width, which changes no count;
the batch is that script's step: 8 prompts x G=8 of 67-83 tokens, completions forced to 256.

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
from harness import step_batches
from harness.tables import markdown_table, measured, publish
from harness.updates import OpCount, count_packed_as_on_cuda, default_loss_fns, update_of

from oncurve.model import packed_attention
from oncurve.model.forward import PolicyLogprobs
from oncurve.run.memory_plan import GIB, plan_memory
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs
from oncurve.update.step import LossFns


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
    for packed, names in (
        (False, ("padded, every row whole (TRL's layout)",
                 "padded, each prompt once (KV cache; the default before packing)")),
        (True, ("packed, every row whole",
                "packed, each prompt once (`model.pack_rows`, null on CUDA)")),
    ):  # fmt: skip
        if packed:  # the padded layouts ran with the model's own attention
            packed_attention.use_packed_attention(model)
        for name, shared in zip(names, (False, True), strict=True):
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
    longest, rows = step_batches.LONGEST_PROMPT + step_batches.MAX_NEW_TOKENS, step_batches.ROWS
    plan = plan_memory(step_batches.full_shape(), seq_len=longest, rows_per_step=rows,
                       sample_rows=rows, budget_bytes=80 * GIB, reference=True)  # fmt: skip
    budget = plan.microbatch_tokens
    widest = budget // longest
    generator = torch.Generator().manual_seed(0)
    batches = [
        step_batches.a_batch(step_batches.sampled_lengths(generator)) for _ in range(args.batches)
    ]
    fns, policy = default_loss_fns(), PolicyLogprobs(model)
    rows = []
    for name, max_rows, packed in (
        (f"padded, at most {widest} rows (the plan before)", widest, False),
        (f"packed, at most {widest} rows", widest, True),
        ("padded, the token budget alone (the plan now)", plan.microbatch_rows, False),
        ("packed, the token budget alone (the plan now, CUDA's default)", plan.microbatch_rows, True),
    ):  # fmt: skip
        cuts = [step_batches.tokens_run(batch, max_rows, budget, packed) for batch in batches]
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
    a, b = row["args"], step_batches
    return (
        f"{measured(row)} (counts, not times: the machine's load does not enter). {b.PROMPTS} "
        f"prompts x G={b.GROUP}, completions {b.COMPLETION} tokens, "
        f"{-(-b.ROWS // a['microbatch'])} microbatches of {a['microbatch']} rows, "
        f"logprob chunk {a['chunk']}; ops that are not views (about one kernel launch each on a "
        f"GPU)\n\n{layouts}\n\nCompletions of sampled lengths (geometric, mean {b.MEAN_LENGTH}, "
        f"at most {b.MAX_NEW_TOKENS}), mean of {a['batches']} draws (`--batches`); the memory "
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
    model = step_batches.narrow_model()
    batch = step_batches.a_batch(torch.full((step_batches.ROWS,), step_batches.COMPLETION))
    rows = layouts(model, batch, args)
    sampled, budget, widest = sampled_microbatches(model, args)
    row = {"renderer": "update_ops", "args": vars(args), "layouts": rows, "sampled": sampled}
    row |= {"budget": budget, "widest": widest}
    publish("update_ops", "Ops one GRPO update dispatches", "ops", row)


if __name__ == "__main__":
    main()
