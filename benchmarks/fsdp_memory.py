"""Per-rank peak memory of data parallelism (DDP) against FSDP2 on the same job.

Both runs are `oncurve train` under torchrun on `--ranks` CPU ranks (gloo) with the same model,
task, batch and steps; only `dist.fsdp` differs. Each rank reports its own peak RSS (Linux
`VmHWM`, the Python, torch and transformers start-up included); the table shows the largest
rank's and the ratio FSDP2 / DDP, and is written to `benchmarks/results/fsdp_memory.md`.

What to expect: FSDP2 divides the trained weights, their gradients and the AdamW state by the
number of ranks, but every rank keeps a whole copy of the policy for sampling and the whole
reference, and FSDP2 gathers each layer's weights around its forward and backward. With few
ranks and a small model those costs can outweigh the saving; it grows with both.

    .venv/bin/python benchmarks/fsdp_memory.py --model 30m --gradient-checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.checkout import CACHE
from harness.children import own_peak_rss
from harness.machine import cpu_name, load_note
from harness.models import model_dir
from harness.tables import markdown_table, publish

WORK = CACHE / "fsdp_memory"
TITLE = (
    "Per-rank peak memory: DDP vs FSDP2\n\nWritten by `benchmarks/fsdp_memory.py`, one section "
    "per model and setting."
)


def child(out: Path, overrides: list[str]) -> None:
    """One rank of one run: train, then write this rank's peak RSS in MB to `out`."""
    from oncurve.config import load_config
    from oncurve.loop.trainer import train

    train(load_config(None, overrides), quiet=True)
    rank = os.environ.get("RANK", "0")
    (out / f"rank{rank}.json").write_text(json.dumps({"rss_mb": own_peak_rss()}))


def run(args: argparse.Namespace, fsdp: bool) -> tuple[list[float], float]:
    """(peak RSS of each rank in MB, wall seconds) of one torchrun job."""
    out = WORK / ("fsdp" if fsdp else "ddp")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    overrides = [
        f"model.path={model_dir(args.model)}",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        "data.task=arith",
        f"data.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.tokens}",
        f"rollout.min_new_tokens={args.tokens}",
        f"optim.microbatch_size={args.microbatch}",
        f"run.steps={args.steps}",
        "run.save_every=0",
        "eval.at_start_end=false",
        "log.samples_per_step=0",
        f"run.dir={out / 'run'}",
        "run.overwrite=true",
        "run.device=cpu",  # gloo ranks on the CPU, also on a machine with a GPU
        f"dist.fsdp={str(fsdp).lower()}",
    ]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={args.ranks}",
        str(Path(__file__).resolve()),
        "--child",
        str(out),
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{'FSDP2' if fsdp else 'DDP'} run failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text())["rss_mb"] for r in range(args.ranks)]
    return ranks, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="30m", help="default | tiny | 30m | PATH")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        child(Path(args.child), rest)
        return
    before = load_note()
    results = {name: run(args, fsdp) for name, fsdp in (("DDP", False), ("FSDP2", True))}
    base = max(results["DDP"][0])
    rows = [
        [
            name,
            " / ".join(f"{mb:,.0f}" for mb in ranks),
            f"{max(ranks):,.0f}",
            f"{max(ranks) / base:.2f}x",
            f"{wall:.0f}",
        ]
        for name, (ranks, wall) in results.items()
    ]
    setting = "on" if args.gradient_checkpointing else "off"
    key = f"{Path(args.model).name}-{args.ranks}ranks" + (
        "-gc" if args.gradient_checkpointing else ""
    )
    section = "\n\n".join(
        [
            f"### {key}: {args.ranks} ranks, {args.prompts} prompts x G={args.group}, "
            f"{args.tokens} tokens (full length), {args.steps} steps",
            f"Measured {time.strftime('%Y-%m-%d')} on {cpu_name()}, {os.cpu_count()} cores; "
            f"`python benchmarks/fsdp_memory.py {' '.join(sys.argv[1:])}`; microbatch "
            f"{args.microbatch} rows, gradient checkpointing {setting}, fp32; {before} before.",
            markdown_table(
                ["trainer", "peak RSS per rank MB", "largest", "vs DDP", "wall s"], rows
            ),
        ]
    )
    print(section)
    publish("fsdp_memory", TITLE, key, {"markdown": section})


if __name__ == "__main__":
    main()
