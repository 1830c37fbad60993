"""The host's time for one GRPO update whose arithmetic is negligible, by the training
forward's layout and with the decoder layers compiled (`model.compile_layers`).

On a GPU, when the update runs far longer than its arithmetic, the device waits for the host to
issue its kernels. This measures that host side on the CPU: the layer structure of the
Qwen2.5-0.5B shape (24 layers, 14 query and 2 key-value heads, gradient checkpointing, as the
memory plan sets it for that model) at a width of 28 and a 512-token vocabulary, on 16 rows of
6 prompt and 8 completion tokens (two groups of 8), so that what it times is Python, the
dispatcher and autograd, which a GPU's host pays too. (Padded rows share no prompt under
gradient checkpointing: the trainer runs them whole.) Packed rows' variable-length attention is
a stand-in of one op (`harness.updates.one_op_varlen`). Medians of `--repeats` updates after one
warm-up; the compiled variant first compiles (its seconds are reported apart). Counts of ops
that are not views come after the timing (compiled code does not run under a dispatch mode, so
the compiled variant has none).

    .venv/bin/python benchmarks/update_host_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
import transformers
from harness.models import qwen2_config
from harness.tables import markdown_table, measured, publish
from harness.updates import OpCount, count_packed_as_on_cuda, default_loss_fns, update_of

from oncurve.model import packed_attention
from oncurve.model.compiled_layers import compile_decoder_layers
from oncurve.model.forward import PolicyLogprobs
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings

VOCAB = 512
SHAPE = (28, 56, 24, 14, 2)  # Qwen2.5-0.5B's layers and heads, 2 dimensions a head
ROWS, GROUP, PROMPT, COMPLETION = 16, 8, 6, 8
# name, packed, each prompt once, compiled layers
VARIANTS = (
    ("padded, every row whole (TRL's layout)", False, False, False),
    ("packed, every row whole", True, False, False),
    ("packed, each prompt once (the GPU default)", True, True, False),
    ("packed, each prompt once, compiled layers", True, True, True),
)


def the_update() -> tuple[transformers.PreTrainedModel, TrainBatch]:
    """The model (seed 0, gradient checkpointing) and the batch of two groups of 8 rows."""
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


def seconds(update: Callable[[], None]) -> float:
    """The wall seconds of `update()`."""
    start = time.perf_counter()
    update()
    return time.perf_counter() - start


def measure(repeats: int) -> dict:
    """Each variant's median seconds and ops (None compiled), and the compilation's seconds, on
    one thread (the host's share of a GPU's update is one thread's)."""
    torch.set_num_threads(1)
    count_packed_as_on_cuda()
    model, batch = the_update()
    policy, fns = PolicyLogprobs(model), default_loss_fns()
    variants, compile_seconds = [], 0.0
    for name, packed, shared, compiled in VARIANTS:
        if packed and model.config._attn_implementation != packed_attention.ATTENTION:
            packed_attention.use_packed_attention(model)
        if compiled:
            compile_decoder_layers(model)
        forward = ForwardSettings(1.0, 256, ROWS, pack_rows=packed, compile_layers=compiled)
        step = dataclasses.replace(batch, prompt_index=batch.prompt_index if shared else None)
        update = update_of(policy, step, forward, fns)
        warm_up = seconds(update)  # and the compilation
        compile_seconds = warm_up if compiled else compile_seconds
        median = statistics.median(seconds(update) for _ in range(repeats))
        ops = None
        if not compiled:  # under a dispatch mode compiled code does not run: no count
            with OpCount() as count:
                update()
            ops = count.kernels
        variants.append({"name": name, "seconds": median, "ops": ops})
        print(f"{name}: {median * 1e3:.1f} ms, {ops} ops", flush=True)
    return {"repeats": repeats, "compile_seconds": compile_seconds, "variants": variants}


def section(row: dict) -> str:
    """The markdown section of one row."""
    base = row["variants"][0]["seconds"]
    table = markdown_table(
        ["update", "host ms (median)", "vs TRL's layout", "ops (not views)"],
        [[v["name"], f"{v['seconds'] * 1e3:.1f}", f"{v['seconds'] / base:.2f}x",
          "-" if v["ops"] is None else f"{v['ops']:,}"] for v in row["variants"]],
    )  # fmt: skip
    shape = f"{ROWS} rows ({ROWS // GROUP} groups) of {PROMPT} + {COMPLETION} tokens"
    compiling = f"the compiled layers' first update (compiling) took {row['compile_seconds']:.1f} s"
    return f"{measured(row)}, 1 thread. {shape}, 24 layers 28 wide, gradient checkpointing; {compiling}, left out\n\n{table}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="updates timed per variant")
    row = measure(parser.parse_args().repeats)
    publish(
        "update_host_time",
        "The host's time for one update",
        "host",
        {"renderer": "update_host_time", **row},
    )


if __name__ == "__main__":
    main()
