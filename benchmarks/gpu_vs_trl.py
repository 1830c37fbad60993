"""oncurve against TRL's GRPOTrainer (no vLLM) on one GPU, the same GRPO job
(`harness.spec.Job`): seconds per step and per phase and peak GPU memory, on a random
Qwen2.5-0.5B-shaped model with the real Qwen3 tokenizer. 8 word problems a step (the arith
task's operands and answers in a chat prompt) x G=8 completions forced to `--tokens`, beta
0.04, lr 1e-6 constant, bf16; oncurve's memory settings its defaults, TRL's 8 rows a microbatch.
The trainers alternate, each run a fresh process; a failed run (OOM) is recorded as such.
`--long` (`gpu_check.py`'s `long` stage): the Qwen2.5-1.5B shape, 16 prompts x G=8, completions
of up to 4,096 tokens ending where the model samples EOS, with probability 1/2,048 at every
position (`harness.models.end_at_eos`: a mean of about 1,770 with the cap, the same draw in both
trainers), target `LONG_SPEED_TARGET`. The job (`harness.gpu_comparison.make_job`) is
`profile_step.py`'s too.

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
from harness.machine import gpu_name, interpreter_versions, require_cuda
from harness.models import TOKENIZER
from harness.records import context
from harness.tables import page_title, publish
from harness.trl_env import trl_versions

SPEED_TARGET = 0.35  # issue 39: oncurve's s/step <= 0.35x TRL's at 256 tokens
LONG_SPEED_TARGET = 0.3  # the long-reasoning workload's
TITLE = page_title(
    "oncurve vs TRL's GRPOTrainer on one GPU", "gpu_vs_trl", "completion length and memory cap"
)


def benchmark(args: argparse.Namespace) -> tuple[str, dict]:
    """Run the trainers alternately; returns (section key, the row's figures)."""
    import transformers

    model, job = gpu.make_job(args)
    target = LONG_SPEED_TARGET if args.long else SPEED_TARGET
    tokenizer = transformers.AutoTokenizer.from_pretrained(job.settings["model.path"])
    prompt_tokens = statistics.mean(len(r["prompt_ids"]) for r in job.step_rows(tokenizer))
    print(f"mean prompt length {prompt_tokens:.1f} tokens (chat template included)", flush=True)
    pythons = {"oncurve": args.oncurve_python, "TRL": args.trl_python}
    envs = gpu.environments(args.trl_python, trl_required=not args.smoke)
    cap = f"-{args.gpu_memory_gb:g}gib" if args.gpu_memory_gb else ""
    key = f"{model}-{job.settings['rollout.max_new_tokens']}{cap}"
    work = gpu.WORK / "runs" / key
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
    parser = gpu.job_parser(__doc__)
    add = parser.add_argument
    add("--runs", type=int, help="runs per trainer, alternating (default 2; 1 --smoke)")
    add("--oncurve-python", default=sys.executable, help="runs `-m oncurve`")
    add("--trl-python", default=sys.executable, help="runs the TRL child (default: this one; "
        "with the GPU bundle's wheels if it lacks trl)")  # fmt: skip
    add("--json", help="also write the summary of each trainer to this file")
    add("--prepare", action="store_true", help="copy the tokenizer, write prompts, build the model")
    args = parser.parse_args()
    args.runs = args.runs or (1 if args.smoke else 2)
    if args.prepare:
        path = gpu.make_job(args)[1].settings["model.path"]
        print(f"tokenizer {TOKENIZER}\nprompts {gpu.PROMPTS_FILE}\nmodel {path}")
        return
    if not args.smoke:
        require_cuda("gpu_vs_trl.py", "--prepare or --smoke")
    key, row = benchmark(args)
    if args.smoke:
        print(gpu.section(context() | row) + "\n(--smoke: not written to results)")
    else:
        publish("gpu_vs_trl", TITLE, key, {"renderer": "harness.gpu_comparison", **row})


if __name__ == "__main__":
    main()
