"""oncurve against TRL's GRPOTrainer (no vLLM) on one GPU, the same GRPO job
(`harness.spec.Job`): seconds per step and per phase and peak GPU memory, on a random
Qwen2.5-0.5B-shaped model with the real Qwen3 tokenizer. 8 word problems a step (the arith
task's operands and answers in a chat prompt) x G=8 completions forced to `--tokens`, beta
0.04, lr 1e-6 constant, bf16; oncurve's memory settings its defaults, TRL's 8 rows a microbatch.
The trainers alternate, each run a fresh process; a failed run (OOM) is recorded as such.
`--long` (`gpu_check.py`'s `long` stage): the Qwen2.5-1.5B shape, 16 prompts x G=8, completions
of up to 4,096 tokens ending where the model samples EOS, with probability 1/2,048 at every
position (`harness.models.end_at_eos`: a mean of about 1,770 with the cap, the same draw in both
trainers), target `LONG_SPEED_TARGET`. `--profile`: `profile_step.py` on the job instead.

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


def job_parser(doc: str) -> argparse.ArgumentParser:
    """The command line's options that make the job, here and in `profile_step.py`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, help="completion tokens (default 256; 16 --smoke)")
    add("--steps", type=int, help="steps per run (default 5; 3 over 256 tokens; 2 --smoke)")
    add("--gpu-memory-gb", type=float, help="GiB both trainers are capped at (run.gpu_memory_gb)")
    add("--tokenizer", help="Qwen3 tokenizer dir to copy into the cache")
    add("--smoke", action="store_true", help="2-layer model on the CPU, 16 tokens (development)")
    add("--long", action="store_true", help="the long-reasoning workload (gpu_vs_trl.py's doc)")
    return parser


def make_job(args: argparse.Namespace) -> tuple[str, Job]:
    """The model's name and the job both trainers run, its model prepared."""
    model = "smoke" if args.smoke else "qwen2.5-1.5b" if args.long else "qwen2.5-0.5b"
    tokens = args.tokens or (32 if args.smoke and args.long else 16 if args.smoke else
                             4096 if args.long else 256)  # fmt: skip
    eos_mean_length = tokens / 2 if args.long else None
    rewards = [{"name": f"{fn.__module__}:{fn.__qualname__}", "weight": w}
               for _, fn, w in Job({}).rewards()]  # fmt: skip
    path = gpu.prepare(model, args.tokenizer, PROMPTS_FILE, eos_mean_length)
    settings = {
        "run.device": "cpu" if args.smoke else "cuda", "run.seed": 0,
        "run.steps": args.steps or (2 if args.smoke or args.long else 5 if tokens <= 256 else 3),
        "model.path": str(path), "data.path": str(PROMPTS_FILE), "data.chat_template": True,
        "data.prompts_per_step": 16 if args.long else 8,
        "reward.functions": json.dumps(rewards), "rollout.group_size": 8,
        "rollout.max_new_tokens": tokens, "rollout.min_new_tokens": 0 if args.long else tokens,
        "rollout.temperature": 1.0, "algo.preset": "grpo", "algo.beta": 0.04, "algo.mu": 1,
        "optim.lr": 1e-6, "optim.warmup_steps": 0, "eval.at_start_end": False,
        "log.samples_per_step": 0,
    }  # fmt: skip
    # TRL's own default per_device_train_batch_size: 8 rows a forward/backward
    return model, Job(settings, trl_microbatch=8, gpu_memory_gb=args.gpu_memory_gb)


def benchmark(args: argparse.Namespace) -> tuple[str, dict]:
    """Run the trainers alternately; returns (section key, the row's figures)."""
    import transformers

    model, job = make_job(args)
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

    def run_one(label: str, run: int) -> dict:  # each trainer makes its folder
        return gpu.run_trainer(label, job, work / f"{label}-{run}", pythons[label], envs[label])

    def after(results: dict[str, list[dict]]) -> None:
        if args.json:  # after each run: a caller's time limit may stop the next one
            figures = {"job": job.settings, "stats": gpu.figures(results)["stats"]}
            Path(args.json).write_text(json.dumps(figures | {"speed_target": target}))

    results = comparison.alternate(envs, args.runs, run_one, after)
    versions = {"oncurve": interpreter_versions(pythons["oncurve"], envs["oncurve"],
                                                ("torch", "transformers"))}  # fmt: skip
    if "TRL" in envs:
        versions["TRL"] = trl_versions(pythons["TRL"], envs["TRL"])
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
        **gpu.figures(results),
    }


def main() -> None:
    parser = job_parser(__doc__)
    add = parser.add_argument
    add("--runs", type=int, help="runs per trainer, alternating (default 2; 1 --smoke)")
    add("--oncurve-python", default=sys.executable, help="runs `-m oncurve`")
    add("--trl-python", default=sys.executable, help="runs the TRL child (default: this one; "
        "with the GPU bundle's wheels if it lacks trl)")  # fmt: skip
    add("--json", help="also write the summary of each trainer to this file")
    add("--prepare", action="store_true", help="copy the tokenizer, write prompts, build the model")
    add("--profile", action="store_true", help="profile_step.py on this job: oncurve alone, its "
        "seconds per phase and the ops with the most GPU and CPU time")  # fmt: skip
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.smoke else 2)
    if args.prepare:
        path = make_job(args)[1].settings["model.path"]
        print(f"tokenizer {TOKENIZER}\nprompts {PROMPTS_FILE}\nmodel {path}")
        return
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_vs_trl.py: no CUDA device (use --prepare or --smoke here)", file=sys.stderr)
        raise SystemExit(2)
    if args.profile:
        from profile_step import profile

        profile(make_job(args)[1], WORK / "profile")
        return
    key, row = benchmark(args)
    if args.smoke:
        print(gpu.section(context() | row) + "\n(--smoke: not written to results)")
    else:
        publish("gpu_vs_trl", TITLE, key, {"renderer": "harness.gpu_comparison", **row})


if __name__ == "__main__":
    main()
