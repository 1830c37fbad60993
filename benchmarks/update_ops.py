"""The ops one GRPO update and one reference pass dispatch, by the training forward's layout:
padded or packed rows (`model.pack_rows`), every row whole (as TRL runs them) or each group's
prompt once.

On a GPU each op that is not a view is about one kernel launch, what an update far slower than
its arithmetic waits on. The step is `gpu_vs_trl.py`'s: 8 prompts x G=8 of 67-83 tokens,
completions of 256, its Qwen2.5-0.5B layers and vocabulary at a narrow width (which changes no
count). Packed rows take CUDA's path with a stand-in for the variable-length
attention of one op forward and three backward (two ops a layer too many); the logprob head
runs its CPU path in every layout.

A second table draws completions of sampled lengths (geometric, mean 256, at most 1,024) and
cuts them as CUDA's memory plan for the 0.5B shape at 80 GiB does: its token budget alone, or
also capped at the rows of the widest length (as before), padded and packed; it counts the
microbatches, the tokens their forwards run and the update's ops, over `--batches` draws (ops
of the first).

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
from oncurve.update.microbatches import ForwardSettings, batch_logprobs, microbatches
from oncurve.update.step import LossFns

# Qwen2.5-0.5B's layers (24, 14 heads, 2 key-value heads) at 112 wide instead of 896
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


def full_shape() -> ModelShape:
    """The memory plan's `ModelShape` of the whole Qwen2.5-0.5B shape in bfloat16 (built on no
    device)."""
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(qwen2_config(SHAPES["qwen2.5-0.5b"], VOCAB))
    return ModelShape.of(model.to(torch.bfloat16))


def tokens_run(batch: TrainBatch, max_rows: int, max_tokens: int, packed: bool) -> list[int]:
    """Each microbatch's tokens through the forward of `batch` cut as a run cuts it: padded,
    rows x (longest prompt + longest completion); packed, real tokens with each group's prompt
    once."""
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
    with updates.OpCount() as reference:
        batch_logprobs(policy, step, forward)
    one_update = updates.update_of(policy, step, forward, fns)
    with updates.OpCount() as update:
        one_update()
    return [reference.kernels, update.kernels, update.ops]


def layouts(model: torch.nn.Module, batch: TrainBatch, args: argparse.Namespace) -> list[list]:
    """The first table's rows: (layout, reference ops, update ops, update ops with views)."""
    fns, policy = updates.default_loss_fns(), PolicyLogprobs(model)
    rows = []
    for name, packed, shared in LAYOUTS:
        step = updates.in_layout(model, batch, packed, shared)
        forward = ForwardSettings(1.0, args.chunk, args.microbatch, pack_rows=packed)
        rows.append([name, *counts(policy, step, fns, forward)])
        print(f"{name}: reference {rows[-1][1]}, update {rows[-1][2]}", flush=True)
    return rows


def sampled_microbatches(
    model: torch.nn.Module, args: argparse.Namespace
) -> tuple[list[list], int, int]:
    """The second table's rows: (settings, microbatches, tokens run, update ops); and the plan's
    token budget and rows of the widest length."""
    longest = LONGEST_PROMPT + MAX_NEW_TOKENS
    plan = plan_memory(full_shape(), seq_len=longest, rows_per_step=ROWS, sample_rows=ROWS,
                       budget_bytes=80 * GIB, reference=True)  # fmt: skip
    budget = plan.microbatch_tokens
    widest = budget // longest
    generator = torch.Generator().manual_seed(0)
    batches = [a_batch(sampled_lengths(generator)) for _ in range(args.batches)]
    fns, policy = updates.default_loss_fns(), PolicyLogprobs(model)
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
    torch.set_num_threads(2)
    updates.count_packed_as_on_cuda()
    model = updates.random_model(NARROW, VOCAB)
    rows = layouts(model, a_batch(torch.full((ROWS,), COMPLETION)), args)
    sampled, budget, widest = sampled_microbatches(model, args)
    row = {"renderer": "update_ops", "args": vars(args), "layouts": rows, "sampled": sampled}
    row |= {"budget": budget, "widest": widest}
    publish("update_ops", "Ops one GRPO update dispatches", "ops", row)


if __name__ == "__main__":
    main()
