"""The ops one GRPO update and one reference pass dispatch, by the training forward's layout:
padded rows (every row whole, as TRL runs them, or each group's prompt once through its KV
cache) against packed rows (`model.pack_rows`, every row whole or each prompt once).

On a GPU each op that is not a view is about one kernel launch, and the first GPU session
found the update far slower than its arithmetic (2.25 s for about 0.5 s of matmuls on an H200),
so the count is a CPU-measurable stand-in for launch overhead. The model has the layer
structure of `gpu_vs_trl.py`'s Qwen2.5-0.5B shape (24 layers, 14 query and 2 key-value heads,
its vocabulary, tied embeddings) at a narrow width, which changes no count; the batch is that
script's step: 8 prompts x G=8 of 67-83 tokens, completions forced to 256.

Packed rows run CUDA's path with the variable-length attention replaced by a stand-in of one
op forward and three backward (the real one is one each way), so their count errs high by
two ops a layer. The logprob head runs its CPU path (float32 blocks, not the bfloat16 head
read in place), the same for every layout.

    .venv/bin/python benchmarks/update_ops.py [--microbatch 16] [--chunk 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from common import markdown_table, qwen2_config, write_section  # noqa: E402

from oncurve import packing  # noqa: E402
from oncurve.build import build_loss_fns  # noqa: E402
from oncurve.config import load_config  # noqa: E402
from oncurve.train_step import (  # noqa: E402
    ForwardSettings,
    LossFns,
    PolicyLogprobs,
    accumulate,
    batch_logprobs,
    microbatch_loss,
)
from oncurve.types import TrainBatch  # noqa: E402

RESULTS = HERE / "results" / "update_ops.md"
VOCAB = 151_936
# Qwen2.5-0.5B's layers (24, 14 heads, 2 key-value heads) at 112 wide instead of 896
SHAPE = (112, 224, 24, 14, 2)
PROMPTS, GROUP, COMPLETION = 8, 8, 256


class OpCount(TorchDispatchMode):
    """Counts the ops dispatched inside it: all of them, and those that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        self.ops += 1
        self.kernels += not func.is_view
        return func(*args, **(kwargs or {}))


class OneOpAttention(torch.autograd.Function):
    """Stands in for torch's variable-length attention on the CPU: one op forward, three
    backward (its gradients' values are not the attention's; only the count matters)."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[override]
        ctx.shapes = (k, v)
        return q.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        k, v = ctx.shapes
        return grad.clone(), torch.zeros_like(k), torch.zeros_like(v)


def the_step(seed: int = 0) -> tuple[torch.nn.Module, TrainBatch]:
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(qwen2_config(SHAPE, VOCAB))
    rows = PROMPTS * GROUP
    prompt_lengths = torch.randint(67, 84, (PROMPTS,)).repeat_interleave(GROUP)
    width = int(prompt_lengths.max())
    prompt_mask = (torch.arange(width) >= width - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, VOCAB, (PROMPTS, width)).repeat_interleave(GROUP, 0)
    completions = torch.randint(3, VOCAB, (rows, COMPLETION))
    mask = torch.cat([prompt_mask, torch.ones(rows, COMPLETION, dtype=torch.long)], 1)
    ids = torch.cat([prompts, completions], 1) * mask
    batch = TrainBatch(
        ids,
        mask,
        torch.ones(rows, COMPLETION, dtype=torch.long),
        torch.linspace(-1.0, 1.0, rows),
        ref_logprobs=torch.full((rows, COMPLETION), -3.0),
        prompt_index=torch.arange(rows) // GROUP,
    )
    return model, batch


def counted(fn: Callable[[], object]) -> OpCount:
    with OpCount() as count:
        fn()
    return count


def counts(
    policy: PolicyLogprobs, step: TrainBatch, fns: LossFns, forward: ForwardSettings
) -> tuple[int, int, int]:
    """Kernel-launching ops of the reference pass and of the update, and the update's ops."""
    reference = counted(lambda: batch_logprobs(policy, step, forward))
    tokens = float(step.completion_mask.sum())

    def loss(micro: TrainBatch, _: torch.Tensor) -> tuple:
        return microbatch_loss(policy, micro, fns, forward, float(step.num_rows), tokens)

    update = counted(lambda: accumulate(policy, step, forward, loss))
    policy.zero_grad(set_to_none=True)
    return reference.kernels, update.kernels, update.ops


def layouts(model: torch.nn.Module, batch: TrainBatch, args: argparse.Namespace) -> list[list]:
    fns = build_loss_fns(load_config(None, []))  # the default GRPO objective
    policy = PolicyLogprobs(model)
    rows = []
    for name, packed, shared in (
        ("padded, every row whole (TRL's layout)", False, False),
        ("padded, each prompt once (KV cache; the default before packing)", False, True),
        ("packed, every row whole", True, False),
        ("packed, each prompt once (`model.pack_rows`, null on CUDA)", True, True),
    ):
        if packed and model.config._attn_implementation != packing.ATTENTION:
            packing.use_packed_attention(model)
        step = dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)
        forward = ForwardSettings(1.0, args.chunk, args.microbatch, pack_rows=packed)
        reference, update, total = counts(policy, step, fns, forward)
        rows.append([name, reference, update, total])
        print(f"{name}: reference {reference}, update {update}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatch", type=int, default=16, help="rows per microbatch")
    parser.add_argument("--chunk", type=int, default=256, help="logprob chunk (CUDA's at 152k)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    packing.VARLEN_DEVICES = ("cpu",)
    packing._varlen_attention = lambda q, k, v, *rest: OneOpAttention.apply(q, k, v)
    model, batch = the_step()
    rows = layouts(model, batch, args)
    base = rows[1]
    table = markdown_table(
        ["forward layout", "reference pass", "update (fwd + bwd)", "vs each prompt once, padded",
         "update, views included"],
        [[name, f"{ref:,}", f"{upd:,}", f"{upd / base[2]:.2f}x", f"{total:,}"]
         for name, ref, upd, total in rows],
    )  # fmt: skip
    microbatches = -(-PROMPTS * GROUP // args.microbatch)
    command = f"benchmarks/update_ops.py --microbatch {args.microbatch} --chunk {args.chunk}"
    section = (
        f"{time.strftime('%Y-%m-%d')}, `{command}`, torch {torch.__version__}, transformers "
        f"{transformers.__version__} (counts, not times: the machine's load does not enter). "
        f"{PROMPTS} prompts x G={GROUP}, completions {COMPLETION} tokens, {microbatches} "
        f"microbatches of {args.microbatch} rows, logprob chunk {args.chunk}; ops that are "
        f"not views (about one kernel launch each on a GPU)\n\n{table}\n"
    )
    print(section)
    write_section(RESULTS, "Ops one GRPO update dispatches", "ops", section)


if __name__ == "__main__":
    main()
