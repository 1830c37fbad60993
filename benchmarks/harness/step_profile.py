"""oncurve's training step under `torch.profiler`, in this process, with each of a list of
settings (`gpu_vs_trl.py --profile`, `gpu_check.py`'s `profile` stage): what each variant's
steps took by phase and which ops took the GPU's and the CPU's time in its last step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def profile_oncurve(job: Job, out: Path) -> None:
    """The oncurve job in this process under each of `VARIANTS`, its last step under
    `torch.profiler`; prints each step's phases (`time/*`, lines `<variant>: step N: {...}`),
    the ops with the most GPU and CPU time in that step, and on a GPU how long its kernels ran
    (`<variant>: the last step's kernels ran ...`). Only the last step is profiled: the whole
    run would record every compile and capture, and summing that many events takes minutes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import oncurve.loop.trainer
    from oncurve.config import load_config
    from oncurve.errors import error_line
    from oncurve.run.metrics import read_jsonl

    steps = job.settings["run.steps"]
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    device_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    step_of_the_run = oncurve.loop.trainer.training_step
    for variant, settings in VARIANTS.items():
        run_dir = [f"run.dir={out / 'run'}", "run.overwrite=true"]
        config = load_config(None, job.oncurve_args() + run_dir + settings)
        profiles = []

        def profiled_step(s: Any, step: int, profiles: list = profiles) -> dict:
            if step < steps:
                return step_of_the_run(s, step)
            with profile(activities=activities) as prof:
                metrics = step_of_the_run(s, step)
            profiles.append(prof)
            return metrics

        oncurve.loop.trainer.training_step = profiled_step
        try:
            oncurve.loop.trainer.train(config, quiet=True)
        except Exception as error:  # noqa: BLE001 - one variant's failure: on to the next
            print(f"{variant}: failed: {error_line(error)}", flush=True)
            continue
        finally:
            oncurve.loop.trainer.training_step = step_of_the_run
            if cuda:
                torch.cuda.empty_cache()
        rows = [r for r in read_jsonl(out / "run" / "metrics.jsonl") if "time/step" in r]
        for row in rows:
            times = {k.removeprefix("time/"): round(v, 3) for k, v in row.items() if "time/" in k}
            peak = row.get("memory/gpu_peak_gb")
            print(f"{variant}: step {row['step']}: {times}, peak {peak} GiB", flush=True)
        averages = profiles[0].key_averages()
        print(f"{variant}: the last step's ops", flush=True)
        print(averages.table(sort_by=device_key, row_limit=30), flush=True)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
        if cuda:  # far below the step's time: the GPU waits for the CPU
            busy = sum(event.self_device_time_total for event in averages) / 1e6
            last = rows[-1]["time/step"]
            print(f"{variant}: the last step's kernels ran {busy:.2f} s of its {last:.2f} s",
                  flush=True)  # fmt: skip
