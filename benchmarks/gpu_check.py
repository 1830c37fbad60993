"""`make gpu-check`: one command that verifies a CUDA GPU, written as one table.

Each stage is a child process with its own time limit (`LIMITS`), run by `harness.stages`: by
default the GPU tests and a step against TRL; `job` and `rollout` in the device call after;
`ppo`, `profile` and the workloads `long` and `curve` when named. A stage against TRL is skipped
with a line saying how to add TRL when neither the interpreter nor the GPU bundle has it; one
that fails or runs out of time still gets its rows, and its log's tail. The table, a section per
GPU (and per other choice of stages), is printed and recorded (`results/gpu_check.md`). Exit
status: 0 when every stage run exited 0, 1 otherwise, 2 without a CUDA device.

    .venv/bin/python benchmarks/gpu_check.py --prepare        # or: make gpu-bundle
    python3 benchmarks/gpu_check.py                           # any Python with a CUDA torch
    python3 benchmarks/gpu_check.py --stages job,rollout      # the second call (or ppo, profile)
    python3 benchmarks/gpu_check.py --stages long             # a session's one call (or curve)
    .venv/bin/python benchmarks/gpu_check.py --dry-run        # the commands, nothing run
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from harness import gpu_comparison, gpu_stages
from harness.checkout import ROOT, checkout_env
from harness.gpu_bundle import prepare

# the records name this module as their renderer (`harness.tables`, `harness.figures`)
from harness.gpu_stages import section as section
from harness.gpu_stages import summary as summary
from harness.machine import gpu_name
from harness.stages import Stage, run_stage, table, tails
from harness.tables import publish

NAME = "gpu_check"
TITLE = "GPU check\n\nWritten by `benchmarks/gpu_check.py` (`make gpu-check`), one section per GPU."
# Seconds per stage, from what each took on an H200 and an H100 cold (benchmarks/LOG.md); `long`
# and `curve` are estimates until their first GPU run (`long`: TRL generates 4,096 tokens every
# step, as one row of 128 almost always reaches the cap). A GPU is checked in two device calls of
# a 15-minute session: `DEFAULT_STAGES` in a 10-minute call (TOTAL_LIMIT, with 10 s left for this
# process), then on the machine still warm `SECOND_STAGES`, `ppo` or `profile` (SECOND_LIMIT); a
# workload (`WORKLOAD_STAGES`) fills a call of its own.
LIMITS = {"tests": 270, "job": 90, "rollout": 120, "trl": 230, "ppo": 220, "profile": 210,
          "long": 500, "curve": 500}  # fmt: skip
TOTAL_LIMIT = 510  # a 10-minute device call, less the machine's start and transfers
DEFAULT_STAGES = ("tests", "trl")
SECOND_STAGES = ("job", "rollout")
SECOND_LIMIT = 230  # what a 15-minute session has left after the first call
WORKLOAD_STAGES = ("long", "curve")
TRL_STAGES = ("trl", "long", "curve")  # skipped with `TRL_MISSING` without TRL at hand
# The stages whose benchmark script writes its results to `--json WORK/<name>.json`: each one's
# title, the script's command line before `--json`, and the reader of those results
JSON_STAGES = {
    "rollout": ("rollout (rows x tokens)", "rollout.py --device cuda --backends cuda_graph "
                "--quick --cuda-shapes 64x256 --repeats 1 --no-gaps", gpu_stages.rollout_rows),
    "trl": ("one step against TRL (256 tokens)", "gpu_vs_trl.py --tokens 256 --steps 3 --runs 1",
            gpu_comparison.trl_rows),
    "ppo": ("GRPO against PPO, 0.5B shape", "grpo_vs_ppo.py --model qwen2.5-0.5b --device cuda "
            "--eval-n 0 --microbatch 16", gpu_stages.ppo_rows),
    "long": ("long reasoning against TRL (1.5B shape, EOS within 4,096 tokens)",
             "gpu_vs_trl.py --long --runs 1", gpu_comparison.trl_rows),
    "curve": ("time to accuracy against TRL (30M, 6-digit sums)", "gpu_curve.py",
              gpu_stages.curve_rows),
}  # fmt: skip


def stages(args: argparse.Namespace) -> list[Stage]:
    """The stages `args.stages` names, in the order of `LIMITS`."""
    made = {name: partial(gpu_stages.json_stage, name, *spec, name in TRL_STAGES)
            for name, spec in JSON_STAGES.items()}  # fmt: skip
    made |= {"tests": gpu_stages.tests_stage, "profile": gpu_stages.profile_stage}
    made["job"] = partial(gpu_stages.job_stage, steps=args.steps)
    return [made[name](LIMITS[name] * args.time_scale) for name in LIMITS if name in args.stages]


def stage_names(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if unknown := sorted(set(names) - set(LIMITS)):
        raise argparse.ArgumentTypeError(
            f"unknown stages {unknown}; choose from {','.join(LIMITS)}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=None, help="run.steps of the default job")
    add("--stages", type=stage_names, default=list(DEFAULT_STAGES),
        help=f"comma-separated subset of {','.join(LIMITS)} (default: {','.join(DEFAULT_STAGES)})")  # fmt: skip
    add("--time-scale", type=float, default=1.0, help="multiply every stage's time limit")
    add("--dry-run", action="store_true", help="print the commands, run none")
    add("--prepare", action="store_true", help="fill benchmarks/.gpu-bundle (tokenizer, wheels)")
    args = parser.parse_args()
    if args.prepare:
        return prepare()
    chosen = stages(args)
    if args.dry_run:
        for stage in chosen:
            command = stage.command()
            shown = command if isinstance(command, str) else " ".join(command)
            print(f"{stage.name} (limit {stage.limit:.0f} s): {shown}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: error: no CUDA device: this torch ({torch.__version__}) sees none; "
              "run it on a machine with an NVIDIA GPU and a CUDA build of torch", file=sys.stderr)  # fmt: skip
        return 2
    budget = sum(stage.limit for stage in chosen)
    print(f"gpu_check: {len(chosen)} stages, time limits {budget:.0f} s in all (the whole "
          f"check's budget: {TOTAL_LIMIT} s)")  # fmt: skip
    env = checkout_env(PYTHONUNBUFFERED="1")
    reports = [run_stage(stage, env, gpu_stages.WORK / "logs", ROOT) for stage in chosen]
    print(f"\n{table(reports)}\n\n{tails(reports)}")
    default = set(args.stages) == set(DEFAULT_STAGES)
    key = gpu_name() + ("" if default else f", --stages {','.join(args.stages)}")
    publish(NAME, TITLE, key, {"renderer": NAME, "cuda": torch.version.cuda, "stages": reports})
    return 0 if all(r["code"] == 0 for r in reports if r["seconds"] is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
