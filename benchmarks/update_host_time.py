"""The host's time for one GRPO update whose arithmetic is negligible, by the training
forward's layout and with the decoder layers compiled (`model.compile_layers`).

On a GPU the update of `gpu_vs_trl.py`'s step ran far longer than its arithmetic (2.25 s for
about 0.5 s of matmuls on an H200): the device waited for the host to issue its kernels. This
script measures that host side on the CPU: the layer structure of the Qwen2.5-0.5B shape (24
layers, 14 query and 2 key-value heads, gradient checkpointing, as the memory plan sets it for
that model) at a width of 28 and a 512-token vocabulary, on 16 rows of 6 prompt and 8
completion tokens (two groups of 8), so that what it times is Python, the dispatcher and
autograd, which a GPU's host pays too. (Padded rows share no prompt under gradient
checkpointing: the trainer runs them whole.) Packed rows' variable-length attention is a stand-in of
one op (`harness.op_count.one_op_varlen`). Medians of `--repeats` updates after one warm-up; the
compiled variant first compiles (its seconds are reported apart). Counts of ops that are not
views come from `harness.op_count.OpCount`, after the timing (compiled code does not run under a
dispatch mode, so the compiled variant has none).

    .venv/bin/python benchmarks/update_host_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch
import transformers
from harness.models import qwen2_config
from harness.op_count import OpCount, count_packed_as_on_cuda
from harness.tables import markdown_table, publish

from oncurve import load_config
from oncurve.model import packed_attention
from oncurve.model.compiled_layers import compile_decoder_layers
from oncurve.model.forward import PolicyLogprobs
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.run.setup import build_loss_fns
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings
from oncurve.update.step import accumulate, microbatch_loss

HERE = Path(__file__).resolve().parent

RESULTS = HERE / "results" / "update_host_time.md"
VOCAB = 512
SHAPE = (28, 56, 24, 14, 2)  # Qwen2.5-0.5B's layers and heads, 2 dimensions a head
ROWS, GROUP, PROMPT, COMPLETION = 16, 8, 6, 8


def the_update() -> tuple[transformers.PreTrainedModel, TrainBatch]:
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(qwen2_config(SHAPE, VOCAB))
    enable_gradient_checkpointing(model)
    ids = torch.randint(3, VOCAB, (ROWS, PROMPT + COMPLETION))
    ids[:, :PROMPT] = ids[::GROUP, :PROMPT].repeat_interleave(GROUP, 0)  # a group, a prompt
    batch = TrainBatch(
        ids,
        torch.ones(ROWS, PROMPT + COMPLETION, dtype=torch.long),
        torch.ones(ROWS, COMPLETION, dtype=torch.long),
        torch.linspace(-1.0, 1.0, ROWS),
        ref_logprobs=torch.full((ROWS, COMPLETION), -3.0),
        prompt_index=torch.arange(ROWS) // GROUP,
    )
    return model, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="updates timed per variant")
    args = parser.parse_args()
    torch.set_num_threads(1)
    count_packed_as_on_cuda()
    model, batch = the_update()
    policy = PolicyLogprobs(model)
    fns = build_loss_fns(load_config(None, []))  # the default GRPO objective
    tokens = float(batch.completion_mask.sum())

    def update(forward: ForwardSettings, shared: bool) -> float:
        step = dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)

        def loss(micro: TrainBatch, _: torch.Tensor) -> tuple:
            return microbatch_loss(
                policy, micro, fns=fns, forward=forward, num_seqs=float(ROWS), num_tokens=tokens
            )

        start = time.perf_counter()
        accumulate(policy, step, forward, loss)
        seconds = time.perf_counter() - start
        policy.zero_grad(set_to_none=True)
        return seconds

    rows, compile_seconds = [], 0.0
    for name, packed, shared, compiled in (
        ("padded, every row whole (TRL's layout)", False, False, False),
        ("packed, every row whole", True, False, False),
        ("packed, each prompt once (the GPU default)", True, True, False),
        ("packed, each prompt once, compiled layers", True, True, True),
    ):
        if packed and model.config._attn_implementation != packed_attention.ATTENTION:
            packed_attention.use_packed_attention(model)
        if compiled:
            compile_decoder_layers(model)
        forward = ForwardSettings(1.0, 256, ROWS, pack_rows=packed, compile_layers=compiled)
        start = time.perf_counter()
        update(forward, shared)  # warm-up (and the compilation)
        if compiled:
            compile_seconds = time.perf_counter() - start
        median = statistics.median(update(forward, shared) for _ in range(args.repeats))
        ops = "-"
        if not compiled:  # under a dispatch mode compiled code does not run: no count
            with OpCount() as count:
                update(forward, shared)
            ops = f"{count.kernels:,}"
        rows.append([name, median, ops])
        print(f"{name}: {median * 1e3:.1f} ms, {ops} ops", flush=True)
    base = rows[0][1]
    table = markdown_table(
        ["update", "host ms (median)", "vs TRL's layout", "ops (not views)"],
        [[name, f"{ms * 1e3:.1f}", f"{ms / base:.2f}x", ops] for name, ms, ops in rows],
    )
    command = f"benchmarks/update_host_time.py --repeats {args.repeats}"
    section = (
        f"{time.strftime('%Y-%m-%d')}, `{command}`, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, 1 thread. {ROWS} rows ({ROWS // GROUP} groups) of "
        f"{PROMPT} + {COMPLETION} tokens, 24 layers 28 wide, gradient checkpointing; the "
        f"compiled layers' first update (compiling) took {compile_seconds:.1f} s, left out"
        f"\n\n{table}\n"
    )
    print(section)
    publish(RESULTS.stem, "The host's time for one update", "host", {"markdown": section})


if __name__ == "__main__":
    main()
