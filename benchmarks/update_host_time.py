"""The host's time for one GRPO update whose arithmetic is negligible, by the training
forward's layout and with the decoder layers compiled (`model.compile_layers`).

What a GPU's update waits on when it is launch-bound (Python, the dispatcher, autograd),
measured on the CPU; what it runs: benchmarks/README.md.

    .venv/bin/python benchmarks/update_host_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from harness import updates
from harness.sampling import time_call
from harness.tables import markdown_table, measured, publish

from oncurve.model.compiled_layers import compile_decoder_layers
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.update.microbatches import ForwardSettings

VOCAB = 512
SHAPE = (28, 56, 24, 14, 2)  # Qwen2.5-0.5B's layers and heads, 2 dimensions a head
ROWS, GROUP, PROMPT, COMPLETION = 16, 8, 6, 8
# name, packed, each prompt once, compiled layers; padded rows run whole: under gradient
# checkpointing (as the memory plan sets it for that model) the trainer shares no prompt
VARIANTS = (
    ("padded, every row whole (TRL's layout)", False, False, False),
    ("packed, every row whole", True, False, False),
    ("packed, each prompt once (the GPU default)", True, True, False),
    ("packed, each prompt once, compiled layers", True, True, True),
)


def measure(repeats: int) -> dict:
    """Each variant's median seconds and ops (None compiled), and the compilation's seconds, on
    one thread (the host's share of a GPU's update is one thread's)."""
    policy, fns = updates.setup(SHAPE, VOCAB, threads=1)
    enable_gradient_checkpointing(policy.model)
    batch = updates.group_batch(
        torch.full((ROWS // GROUP,), PROMPT), GROUP, torch.full((ROWS,), COMPLETION), VOCAB
    )
    variants, compile_seconds = [], 0.0
    for name, packed, shared, compiled in VARIANTS:
        step = updates.in_layout(policy.model, batch, packed, shared)
        if compiled:
            compile_decoder_layers(policy.model)
        forward = ForwardSettings(1.0, 256, ROWS, pack_rows=packed, compile_layers=compiled)
        update = updates.update_of(policy, step, forward, fns)
        times = [time_call(update)[1] for _ in range(repeats + 1)]  # the first warms up, compiles
        compile_seconds = times[0] if compiled else compile_seconds
        median = statistics.median(times[1:])
        # under a dispatch mode compiled code does not run: no count
        ops = None if compiled else updates.OpCount.of(update).kernels
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


def summary(row: dict) -> str:
    """The row in one line: each variant's host time against TRL's layout."""
    base = row["variants"][0]["seconds"]
    return "host time of one update against TRL's padded layout: " + "; ".join(
        f"{v['name']} {v['seconds'] / base:.2f}x" for v in row["variants"][1:]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="updates timed per variant")
    row = {"renderer": "update_host_time", **measure(parser.parse_args().repeats)}
    publish("update_host_time", "The host's time for one update", "host", row)


if __name__ == "__main__":
    main()
