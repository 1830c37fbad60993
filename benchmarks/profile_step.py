"""oncurve's step of `gpu_vs_trl.py`'s job (`harness.gpu_comparison.make_job`, with its job
options) under `torch.profiler`, `gpu_check.py`'s `profile` stage: oncurve alone in this process
under each of `VARIANTS`, the last step of each run profiled (the whole run would record every
compile and capture, and summing that many events takes minutes). Prints each step's phases and
peak (`<variant>: step N: {...}, peak X GiB`), the last step's ops with the most GPU and CPU time,
and on a GPU how long its kernels ran (`<variant>: the last step's kernels ran A s of its B s`).
A variant that fails is a line, and the next one runs.

    python3 benchmarks/profile_step.py --tokens 256 --steps 3     # GPU machine
    .venv/bin/python benchmarks/profile_step.py --smoke           # here: 2-layer model, CPU
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

from harness import gpu_comparison
from harness.machine import require_cuda
from harness.spec import Job

# The settings the job is profiled with, by name, the likeliest to explain the update's time
# first (the stage's limit may stop the last): the memory plan's own choices; decoder layers
# compiled (fewer kernel launches, `update_host_time.py`); nondeterministic kernels (what
# bit-exact resume costs); the reference kept on the GPU (what its offload costs); rows padded
# with each group's prompt through its KV cache (more launches, `update_ops.py`); four times
# the token budget (a quarter of the microbatches); packed with every row whole (fewer
# launches, more arithmetic).
VARIANTS = {
    "memory plan": [],
    "memory plan, compiled layers": ["model.compile_layers=true"],
    "memory plan, nondeterministic kernels": ["run.deterministic=false"],
    "memory plan, reference kept on the GPU": ["model.offload_reference=false"],
    "memory plan, rows padded, prompts shared": ["model.pack_rows=false"],
    "memory plan, 16,384 tokens a microbatch": ["optim.microbatch_tokens=16384"],
    "memory plan, every row whole": ["model.share_prompt_forward=false"],
}


def last_step_ops(job: Job, settings: list[str], run_dir: Path) -> Any:
    """oncurve's run of `job` with `settings` in `run_dir`, its trainer's `training_step` wrapped
    so that the last step runs under `torch.profiler`; that step's ops (`key_averages()`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import oncurve.loop.trainer as trainer
    from oncurve.config import load_config

    cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    step_of_the_run, profiles = trainer.training_step, []

    def profiled_step(s: Any, step: int) -> dict:
        if step < job.settings["run.steps"]:
            return step_of_the_run(s, step)
        with profile(activities=[ProfilerActivity.CPU, *cuda]) as prof:
            metrics = step_of_the_run(s, step)
        profiles.append(prof)
        return metrics

    run = [f"run.dir={run_dir}", "run.overwrite=true", *settings]
    config = load_config(None, job.oncurve_args() + run)
    with mock.patch.object(trainer, "training_step", profiled_step):
        trainer.train(config, quiet=True)
    return profiles[0].key_averages()


def profile(job: Job, out: Path) -> None:
    """`job` under each of `VARIANTS` in turn, in `out`; prints what the module docstring says."""
    import torch

    from oncurve.errors import error_line
    from oncurve.run.metrics import read_jsonl

    cuda = torch.cuda.is_available()
    for variant, settings in VARIANTS.items():
        try:
            ops = last_step_ops(job, settings, out / "run")
        except Exception as error:  # noqa: BLE001 - one variant's failure: on to the next
            print(f"{variant}: failed: {error_line(error)}", flush=True)
            continue
        finally:
            if cuda:
                torch.cuda.empty_cache()
        rows = [r for r in read_jsonl(out / "run" / "metrics.jsonl") if "time/step" in r]
        for row in rows:
            times = {k.removeprefix("time/"): round(v, 3) for k, v in row.items() if "time/" in k}
            peak = row.get("memory/gpu_peak_gb")
            print(f"{variant}: step {row['step']}: {times}, peak {peak} GiB", flush=True)
        print(f"{variant}: the last step's ops", flush=True)
        by_device = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(ops.table(sort_by=by_device, row_limit=30), flush=True)
        print(ops.table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
        if cuda:  # far below the step's time: the GPU waits for the CPU
            busy = sum(event.self_device_time_total for event in ops) / 1e6
            ran = f"{busy:.2f} s of its {rows[-1]['time/step']:.2f} s"
            print(f"{variant}: the last step's kernels ran {ran}", flush=True)


def main() -> None:
    args = gpu_comparison.job_parser(__doc__).parse_args()
    if not args.smoke:
        require_cuda("profile_step.py")
    profile(gpu_comparison.make_job(args)[1], gpu_comparison.WORK / "profile")


if __name__ == "__main__":
    main()
