"""Per-rank peak memory of data parallelism (DDP) against FSDP2 on the same job.

Both runs are `oncurve train` under torchrun on `--ranks` CPU ranks (gloo); only `dist.fsdp`
differs. Each rank reports its own peak RSS (Linux `VmHWM`, start-up included). Why FSDP2 can
take more at few ranks and a small model: docs/gpu.md.

    .venv/bin/python benchmarks/fsdp_memory.py --model 30m --gradient-checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness.checkout import CACHE
from harness.children import own_peak_rss, run_child
from harness.machine import cpu_name, load_note
from harness.models import model_dir
from harness.spec import Job
from harness.tables import markdown_table, page_title, publish

WORK = CACHE / "fsdp_memory"
INT_OPTIONS = {"ranks": 2, "prompts": 8, "group": 8, "tokens": 64, "microbatch": 8, "steps": 2}
TITLE = page_title("Per-rank peak memory: DDP vs FSDP2", "fsdp_memory", "model and setting")


def child(out: Path, overrides: list[str]) -> None:
    """One rank of one run: train, then write this rank's peak RSS in MB to `out`."""
    from oncurve.config import load_config
    from oncurve.loop.trainer import train

    train(load_config(None, overrides), quiet=True)
    rank = os.environ.get("RANK", "0")
    (out / f"rank{rank}.json").write_text(json.dumps({"rss_mb": own_peak_rss()}))


def make_job(args: argparse.Namespace) -> Job:
    """The job both runs train; only `dist.fsdp` differs."""
    return Job({
        "model.path": str(model_dir(args.model)),
        "model.gradient_checkpointing": args.gradient_checkpointing,
        "data.task": "arith",
        "data.prompts_per_step": args.prompts,
        "rollout.group_size": args.group,
        "rollout.max_new_tokens": args.tokens,
        "rollout.min_new_tokens": args.tokens,
        "optim.microbatch_size": args.microbatch,
        "run.steps": args.steps,
        "run.save_every": 0,
        "eval.at_start_end": False,
        "log.samples_per_step": 0,
        "run.device": "cpu",  # gloo ranks on the CPU, also on a machine with a GPU
    })  # fmt: skip


def run(job: Job, ranks: int, fsdp: bool) -> dict:
    """The peak RSS of each rank in MB and the wall seconds of one torchrun job; its output
    in `log.txt` beside the ranks' reports."""
    out = WORK / ("fsdp" if fsdp else "ddp")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    settings = [f"run.dir={out / 'run'}", "run.overwrite=true", f"dist.fsdp={str(fsdp).lower()}"]
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
               str(Path(__file__).resolve()), "--child", str(out), *job.oncurve_args(), *settings]  # fmt: skip
    wall, _, _ = run_child(command, dict(os.environ), out / "log.txt")
    rss = [json.loads((out / f"rank{r}.json").read_text())["rss_mb"] for r in range(ranks)]
    return {"rss": rss, "wall": wall}


def section(row: dict) -> str:
    """The markdown section of one row: each run's per-rank peaks against DDP's."""
    s, runs = row["settings"], row["runs"]
    base = max(runs["DDP"]["rss"])
    table = [[name, " / ".join(f"{mb:,.0f}" for mb in r["rss"]), f"{max(r['rss']):,.0f}",
              f"{max(r['rss']) / base:.2f}x", f"{r['wall']:.0f}"] for name, r in runs.items()]  # fmt: skip
    checkpointing = "on" if s["model.gradient_checkpointing"] else "off"
    return (
        f"### {row['key']}: {row['ranks']} ranks, {s['data.prompts_per_step']} prompts x "
        f"G={s['rollout.group_size']}, {s['rollout.max_new_tokens']} tokens (full length), "
        f"{s['run.steps']} steps\n\nMeasured {row['date']} at {row['commit']} on {row['cpu']}; "
        f"`{row['command']}`; microbatch {s['optim.microbatch_size']} rows, gradient "
        f"checkpointing {checkpointing}, fp32; {row['load_before']} before.\n\n"
        + markdown_table(["trainer", "peak RSS per rank MB", "largest", "vs DDP", "wall s"], table)
    )


def summary(row: dict) -> str:
    """The row in one line: FSDP2's largest per-rank peak against DDP's."""
    ddp, fsdp = (max(row["runs"][name]["rss"]) for name in ("DDP", "FSDP2"))
    return (f"{row['key']}: per-rank peak RSS FSDP2 {fsdp:,.0f} MB = {fsdp / ddp:.2f}x DDP's "
            f"{ddp:,.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="30m", help="default | tiny | 30m | PATH")
    for name, default in INT_OPTIONS.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        child(Path(args.child), rest)
        return
    job, load_before = make_job(args), load_note()
    runs = {name: run(job, args.ranks, fsdp) for name, fsdp in (("DDP", False), ("FSDP2", True))}
    checkpointing = "-gc" if args.gradient_checkpointing else ""
    key = f"{Path(args.model).name}-{args.ranks}ranks{checkpointing}"
    row = {"renderer": "fsdp_memory", "settings": job.settings, "ranks": args.ranks, "runs": runs}
    row |= {"cpu": f"{cpu_name()}, {os.cpu_count()} cores", "load_before": load_before}
    publish("fsdp_memory", TITLE, key, row)


if __name__ == "__main__":
    main()
