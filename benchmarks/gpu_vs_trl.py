"""oncurve against TRL's GRPOTrainer (no vLLM) on one GPU, the same GRPO job
(`harness.spec.Job`): seconds per step and per phase and peak GPU memory, on a random
Qwen2.5-0.5B-shaped model with the real Qwen3 tokenizer. 8 word problems a step (the arith
task's operands and answers in a chat prompt) x G=8 completions forced to `--tokens`, beta
0.04, lr 1e-6 constant, bf16; oncurve's memory settings its defaults, TRL's 8 rows a microbatch.
The trainers alternate, each run a fresh process; a failed run (OOM) is recorded as such.
`--profile` runs oncurve alone in this process under each of `VARIANTS`, its last step under
`torch.profiler` (`gpu_check.py`'s `profile` stage). `--long` is the long-reasoning workload
(`gpu_check.py`'s `long` stage): the Qwen2.5-1.5B shape, 16 prompts x G=8, completions of up to
4,096 tokens that end where the model samples EOS, with probability 1/2,048 at every
position (`harness.models.end_at_eos`: a mean of about 1,770 with the cap, the same draw in both
trainers, whose mean lengths the section shows), target `LONG_SPEED_TARGET`.

    .venv/bin/python benchmarks/gpu_vs_trl.py --prepare      # here: tokenizer, prompts, model
    .venv/bin/python benchmarks/gpu_vs_trl.py --smoke        # here: 2-layer model, CPU, 16 tokens
    python3 benchmarks/gpu_vs_trl.py                         # GPU machine: 256 tokens
    python3 benchmarks/gpu_vs_trl.py --tokens 1024 --gpu-memory-gb 16
    python3 benchmarks/gpu_vs_trl.py --long --runs 1           # the long-reasoning workload
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from harness import comparison
from harness import gpu_comparison as gpu
from harness.checkout import CACHE
from harness.machine import gpu_name, interpreter_versions
from harness.models import TOKENIZER
from harness.records import context
from harness.spec import Job
from harness.tables import publish
from harness.trl_env import trl_versions

WORK = CACHE / "gpu_vs_trl"
PROMPTS_FILE = WORK / "prompts.jsonl"
SPEED_TARGET = 0.35  # issue 39: oncurve's s/step <= 0.35x TRL's at 256 tokens
LONG_SPEED_TARGET = 0.3  # the long-reasoning workload's
TITLE = (
    "oncurve vs TRL's GRPOTrainer on one GPU\n\n"
    "Written by `benchmarks/gpu_vs_trl.py`, one section per completion length and memory cap."
)
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


def make_job(args: argparse.Namespace, model: str) -> Job:
    """The job both trainers run, its model prepared."""
    tokens = args.tokens or (32 if args.smoke and args.long else 16 if args.smoke else
                             4096 if args.long else 256)  # fmt: skip
    eos_mean_length = tokens / 2 if args.long else None
    rewards = [{"name": f"{fn.__module__}:{fn.__qualname__}", "weight": w}
               for _, fn, w in Job({}).rewards()]  # fmt: skip
    settings = {
        "run.device": "cpu" if args.smoke else "cuda", "run.seed": 0,
        "run.steps": args.steps or (2 if args.smoke or args.long else 5 if tokens <= 256 else 3),
        "model.path": str(gpu.prepare(model, args.tokenizer, PROMPTS_FILE, eos_mean_length)),
        "data.path": str(PROMPTS_FILE), "data.chat_template": True,
        "data.prompts_per_step": 16 if args.long else 8,
        "reward.functions": json.dumps(rewards), "rollout.group_size": 8,
        "rollout.max_new_tokens": tokens, "rollout.min_new_tokens": 0 if args.long else tokens,
        "rollout.temperature": 1.0, "algo.preset": "grpo", "algo.beta": 0.04, "algo.mu": 1,
        "optim.lr": 1e-6, "optim.warmup_steps": 0, "eval.at_start_end": False,
        "log.samples_per_step": 0,
    }  # fmt: skip
    # TRL's own default per_device_train_batch_size: 8 rows a forward/backward
    return Job(settings, trl_microbatch=8, gpu_memory_gb=args.gpu_memory_gb)


def benchmark(args: argparse.Namespace, model: str) -> tuple[str, dict]:
    """Run the trainers alternately; returns (section key, the row's figures)."""
    import transformers

    job = make_job(args, model)
    target = LONG_SPEED_TARGET if args.long else SPEED_TARGET
    tokenizer = transformers.AutoTokenizer.from_pretrained(job.settings["model.path"])
    prompt_tokens = statistics.mean(len(r["prompt_ids"]) for r in job.step_rows(tokenizer))
    print(f"mean prompt length {prompt_tokens:.1f} tokens (chat template included)", flush=True)
    pythons = {"oncurve": args.oncurve_python, "TRL": args.trl_python}
    envs = gpu.environments(args.trl_python, trl_required=not args.smoke)
    cap = f"-{args.gpu_memory_gb:g}gib" if args.gpu_memory_gb else ""
    key = f"{model}-{job.settings['rollout.max_new_tokens']}{cap}"
    work = WORK / "runs" / key
    shutil.rmtree(work, ignore_errors=True)

    def run_one(label: str, run: int) -> dict:
        out = work / f"{label}-{run}"
        out.mkdir(parents=True)
        return gpu.run_trainer(label, job, out, pythons[label], envs[label])

    def after(results: dict[str, list[dict]]) -> None:
        if args.json:  # after each run: a caller's time limit may stop the next one
            stats = {label: gpu.summarize(runs) for label, runs in results.items()}
            figures = {"job": job.settings, "stats": stats, "speed_target": target}
            Path(args.json).write_text(json.dumps(figures))

    results = comparison.alternate(envs, args.runs, run_one, after)
    versions = {"oncurve": interpreter_versions(pythons["oncurve"], envs["oncurve"],
                                                ("torch", "transformers"))}  # fmt: skip
    if "TRL" in envs:
        versions["TRL"] = trl_versions(pythons["TRL"], envs["TRL"])
    stats = {label: gpu.summarize(runs) for label, runs in results.items()}
    return key, {
        "model": model,
        "settings": job.settings | {"reward.functions": "the arith task's"},
        "gpu_memory_gb": args.gpu_memory_gb,
        "runs_per_trainer": args.runs,
        "prompt_tokens": prompt_tokens,
        "gpu": gpu_name(),
        "python_versions": versions,
        "speed_target": target,
        **({"workload": "long"} if args.long else {}),
        **gpu.figures(stats, results),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, help="completion tokens (default 256; 16 --smoke)")
    add("--steps", type=int, help="steps per run (default 5; 3 over 256 tokens; 2 --smoke)")
    add("--runs", type=int, help="runs per trainer, alternating (default 2; 1 --smoke)")
    add("--gpu-memory-gb", type=float, help="GiB both trainers are capped at (run.gpu_memory_gb)")
    add("--tokenizer", help="Qwen3 tokenizer dir to copy into the cache")
    add("--oncurve-python", default=sys.executable, help="runs `-m oncurve`")
    add("--trl-python", default=sys.executable, help="runs the TRL child (default: this one; "
        "with the GPU bundle's wheels if it lacks trl)")  # fmt: skip
    add("--json", help="also write the summary of each trainer to this file")
    add("--prepare", action="store_true", help="copy the tokenizer, write prompts, build the model")
    add("--smoke", action="store_true", help="2-layer model on the CPU, 16 tokens (development)")
    add("--long", action="store_true", help="the long-reasoning workload (module docstring)")
    add("--profile", action="store_true",
        help="oncurve alone, in this process, under each of the settings `VARIANTS` lists: "
        "seconds per phase and the ops that take the most GPU and CPU time")  # fmt: skip
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.smoke else 2)
    model = "smoke" if args.smoke else "qwen2.5-1.5b" if args.long else "qwen2.5-0.5b"
    if args.prepare:
        path = make_job(args, model).settings["model.path"]
        print(f"tokenizer {TOKENIZER}\nprompts {PROMPTS_FILE}\nmodel {path}")
        return
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_vs_trl.py: no CUDA device (use --prepare or --smoke here)", file=sys.stderr)
        raise SystemExit(2)
    if args.profile:
        profile_oncurve(make_job(args, model), WORK / "profile")
        return
    key, row = benchmark(args, model)
    if args.smoke:
        print(gpu.section(context() | row) + "\n(--smoke: not written to results)")
    else:
        publish("gpu_vs_trl", TITLE, key, {"renderer": "harness.gpu_comparison", **row})


if __name__ == "__main__":
    main()
