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
import importlib.util
import json
import math
import re
import statistics
import sys
from functools import partial

import yaml
from harness import pytest_outcomes, run_logs
from harness.checkout import BENCHMARKS, CACHE, ROOT, checkout_env
from harness.gpu_bundle import TRL_MISSING, prepare, trl_at_hand
from harness.machine import gpu_name
from harness.stages import Outcome, Stage, run_stage, status, table, tails
from harness.tables import cell, publish

NAME = "gpu_check"
TITLE = "GPU check\n\nWritten by `benchmarks/gpu_check.py` (`make gpu-check`), one section per GPU."
WORK = CACHE / NAME
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
COMPILE_CAPTURE_TARGET = 30  # seconds a run spends compiling and capturing its sampler, at most
FAILED = "its run failed or did not finish (log below)"


def gib(value: float | None) -> str:
    """`0.33 GiB`, or "n/a" when not measured."""
    return "n/a" if value is None else f"{value:.2f} GiB"


def against(value: float, target: float, unit: str = "x") -> str:
    """`(target <= 0.35x: met)`: whether `value` is within `target`."""
    return f"(target <= {target}{unit}: {'met' if value <= target else 'missed'})"


def phase_peaks(measured: dict[str, float], planned: dict[str, float]) -> str:
    """Each phase's measured peak against the plan's (`harness.run_logs.PEAK_PHASES`), GiB."""
    pairs = [
        f"{phase} {value:.2f} / {gib(planned.get(phase))}" for phase, value in measured.items()
    ]
    return ", ".join(pairs) or "n/a"


def plan_against(plan: float | None, measured: float | None) -> str:
    """The plan's predicted peak (GiB, to 0.1 as the trainer prints it) against the measured."""
    if plan is None or measured is None:
        return f"{gib(plan)} / {gib(measured)}"
    return f"{plan:.1f} / {measured:.2f} GiB ({plan - measured:+.2f} GiB)"


def compile_capture(seconds: float | None) -> str:
    """A run's compile plus capture seconds against `COMPILE_CAPTURE_TARGET`."""
    if seconds is None:
        return "n/a"
    return f"{seconds:.1f} s {against(seconds, COMPILE_CAPTURE_TARGET, ' s')}"


def script(name: str, *args: str) -> list[str]:
    """The command running the benchmark script `name` with `args`."""
    return [sys.executable, str(BENCHMARKS / name), *args]


def gpu_tests_stage(limit: float) -> Stage:
    xml, lines = WORK / "gpu-tests.xml", WORK / "logs" / "gpu-tests.jsonl"  # lines beside the logs

    def command() -> list[str]:
        workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
        return [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
                "-p", "harness.pytest_outcomes", f"--results-jsonl={lines}",
                f"--junitxml={xml}", *workers]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        found = pytest_outcomes.read(xml, lines)
        if not found:
            return [["`pytest -m gpu`", "no test finished"]]
        kinds = ("passed", "failed", "skipped")
        summary = ", ".join(f"{sum(r['outcome'] == k for r in found)} {k}" for k in kinds)
        if not xml.is_file():
            summary += " (pytest was stopped: the tests that finished before)"
        failed = [r for r in found if r["outcome"] == "failed"]
        rows = [["`pytest -m gpu`", summary]]
        rows += [[f"failed: `{r['test']}`", r.get("message", "")[:300] or "(no message)"]
                 for r in failed[:8]]  # fmt: skip
        if len(failed) > 8:
            rows.append(["failed", f"and {len(failed) - 8} more"])
        if failed:  # the reports, in the log and its printed tail
            with outcome.log.open("a") as log:
                log.writelines(f"\n--- {r['test']} ---\n{r.get('detail', '')}\n" for r in failed)
        return rows

    return Stage("tests", "GPU tests", limit, command, read, (xml, lines))


def default_job_stage(limit: float, steps: int | None) -> Stage:
    run_dir = WORK / "run"

    def command() -> list[str]:
        extra = [f"run.steps={steps}"] if steps else []
        return [sys.executable, "-m", "oncurve", "train", "--quiet", "run.device=cuda",
                f"run.dir={run_dir}", *extra]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        text = (run_dir / "metrics.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return job_rows(rows, outcome.log.read_text(errors="replace"), config)

    return Stage("job", "default job on cuda", limit, command, read, (run_dir,))


def job_rows(rows: list[dict], log: str, config: dict) -> list[list[str]]:
    """The default job's results from its metrics rows, its log and its config.yaml."""
    trained = [r for r in rows if "time/step" in r]
    evaluated = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    timed = [r["time/step"] for r in trained[1:] or trained]  # the first step warms up
    peaks = [r["memory/gpu_peak_gb"] for r in trained if "memory/gpu_peak_gb" in r]
    peak = max(peaks, default=None)

    def every_step(key: str) -> str:
        off = [r["step"] for r in trained if r.get(key) != 1.0]
        return f"off at steps {off[:5]}" if off else "every step" if trained else "n/a"

    before = cell(evaluated[0] if evaluated else None, ".1%")
    after = cell(evaluated[-1] if len(evaluated) > 1 else None, ".1%")
    why = re.search(r"warning: rows stay padded .*failed its check: (.*)", log)
    packed = "yes" if config["model"]["pack_rows"] else f"no: {why.group(1)}" if why else "no"
    setup = run_logs.sampler_setup_seconds(trained[-1]) if trained else None
    by_phase = run_logs.measured_phase_peaks_gb(trained), run_logs.planned_phase_peaks_gb(log)
    return [
        ["steps done", f"{len(trained)} of {config['run']['steps']}"],
        ["held-out greedy accuracy before / after", f"{before} / {after}"],
        ["s/step (median, first step left out)",
         f"{statistics.median(timed):.3f}" if timed else "n/a"],
        ["peak GPU memory (max `memory/gpu_peak_gb`)", gib(peak)],
        ["CUDA graphs (`rollout/graphs`)", every_step("rollout/graphs")],
        ["compiled decode step (`rollout/compiled`)", every_step("rollout/compiled")],
        ["rows packed in the update (`model.pack_rows`)", packed],
        ["reference on the GPU for its pass only (`model.offload_reference`)",
         "yes" if config["model"]["offload_reference"] else "no"],
        ["memory plan: predicted / measured peak",
         plan_against(run_logs.planned_peak_gb(log), peak)],
        ["peak by phase, measured / planned", phase_peaks(*by_phase)],
        ["sampler's compile + capture over the run (`time/sampler_*_total`)",
         compile_capture(setup)],
    ]  # fmt: skip


def rollout_rows(results: list[dict]) -> list[list[str]]:
    """`rollout.py --json`: each sampler's tokens/s, its first call's seconds and what of them
    compiling and capturing took."""
    rows = []
    for r in results:
        first = [f"{r['first_call_s']:.1f} s"] + [
            f"{what} {r[f'{what}_s']:.1f} s"
            for what in ("compile", "capture")
            if r.get(f"{what}_s") is not None
        ]
        rate = f"{r['tokens_per_s']:,.0f} tokens/s ({r['vs_static']:.2f}x static generate)"
        rows.append([f"{r['scenario']} `{r['sampler']}`", f"{rate}; first call {', '.join(first)}"])
    return rows


def trl_rows(figures: dict) -> list[list[str]]:
    """`gpu_vs_trl.py --json`: s/step, phases, peaks and mean lengths of both trainers against
    the targets the run wrote, oncurve's memory plan against its peaks."""
    stats, target = figures["stats"], figures["speed_target"]
    if "TRL" not in stats:
        return [["TRL", "not run: the interpreter could not import it"]]
    ours, base = stats["oncurve"], stats["TRL"]  # None: that run failed
    if ours is None:
        return [["oncurve", FAILED]]
    rows = [
        ["memory plan: predicted / measured peak",
         plan_against(ours["plan_gb"], ours["gpu_peak_gb"])],
        ["oncurve peak by phase, measured / planned",
         phase_peaks(ours.get("phase_peaks_gb", {}), ours.get("plan_phases_gb", {}))],
        ["oncurve sampler's compile + capture", compile_capture(ours.get("compile_capture_s"))],
    ]  # fmt: skip
    if base is None:
        return [["TRL", FAILED], *rows]
    speed = ours["seconds"] / base["seconds"]
    memory = ours["gpu_peak_gb"] / base["gpu_peak_gb"]
    phases = ", ".join(
        f"{name} {ours['phases'][name]:.2f} / {seconds:.2f}"
        for name, seconds in base.get("phases", {}).items()
        if name in ours.get("phases", {}) and name != "reward"
    )
    return [
        ["s/step oncurve / TRL", f"{ours['seconds']:.2f} / {base['seconds']:.2f} s = "
         f"{speed:.2f}x {against(speed, target)}"],
        ["phases oncurve / TRL, s", phases or "n/a"],
        ["peak GPU memory oncurve / TRL", f"{gib(ours['gpu_peak_gb'])} / "
         f"{gib(base['gpu_peak_gb'])} = {memory:.2f}x {against(memory, 1)}"],
        ["mean completion length oncurve / TRL, tokens",
         f"{ours['length']:.1f} / {base['length']:.1f}"],
        *rows,
    ]  # fmt: skip


def ppo_rows(figures: dict) -> list[list[str]]:
    """`grpo_vs_ppo.py --json`: GRPO's peak against PPO's, each one's memory plan."""
    (pair,) = figures["pairs"]
    rows = [["PPO", "its run did not finish (log below)"]]  # stopped before PPO's ended
    if "PPO" in pair:
        grpo, ppo = pair["GRPO"]["cuda"] / 1024, pair["PPO"]["cuda"] / 1024
        claim = f"the claim, 25-50% less than PPO: {'met' if grpo / ppo <= 0.75 else 'missed'}"
        ratio = f"{gib(grpo)} / {gib(ppo)} = {grpo / ppo:.2f}x"
        rows = [["peak GPU memory GRPO / PPO", f"{ratio} ({claim})"]]
    return rows + [
        [f"memory plan ({name}): predicted / measured peak",
         plan_against(run["plan_gb"], run["cuda"] / 1024)]
        for name, run in pair.items()
    ]  # fmt: skip


def curve_rows(row: dict) -> list[list[str]]:
    """`gpu_curve.py --json`: each curve's accuracy before and after, oncurve's time to TRL's
    final accuracy against `gpu_curve.TARGET`."""
    from gpu_curve import TARGET

    rows = [["warm start: held-out greedy accuracy", f"{row['warm_accuracy']:.1%}"]]
    rows += [[f"{label}: held-out accuracy before / after",
              f"{points[0][1]:.1%} / {points[-1][1]:.1%} ({len(points) - 1} checkpoints "
              f"in {points[-1][0]:.0f} s of training)"]
             for label, points in row["curves"].items()]  # fmt: skip
    if row["trl_final"] is None:
        return [*rows, ["TRL", "its run failed or did not run (log below)"]]
    if row["trl_final"] <= row["warm_accuracy"]:
        return [*rows, ["TRL", "it did not improve on the warm start: nothing to reach"]]
    if row["reach_s"] is None:
        reached, ratio = f"never, in {row['curves']['oncurve'][-1][0]:.0f} s", math.inf
    else:
        ratio = row["ratio"]
        reached = f"{row['reach_s']:.0f} s of TRL's {row['trl_seconds']:.0f} s = {ratio:.2f}x"
    time_to = f"oncurve's time to TRL's final {row['trl_final']:.1%}"
    return [*rows, [time_to, f"{reached} {against(ratio, TARGET)}"]]


# The stages whose benchmark script writes its results to `--json WORK/<name>.json`: each one's
# title and reader of those results, and the script's command line before `--json`
JSON_STAGES = {
    "rollout": ("rollout (rows x tokens)", rollout_rows),
    "trl": ("one step against TRL (256 tokens)", trl_rows),
    "ppo": ("GRPO against PPO, 0.5B shape", ppo_rows),
    "long": ("long reasoning against TRL (1.5B shape, EOS within 4,096 tokens)", trl_rows),
    "curve": ("time to accuracy against TRL (30M, 6-digit sums)", curve_rows),
}
COMMANDS = {
    "rollout": "rollout.py --device cuda --backends cuda_graph --quick --cuda-shapes 64x256 "
    "--repeats 1 --no-gaps",
    "trl": "gpu_vs_trl.py --tokens 256 --steps 3 --runs 1",
    "ppo": "grpo_vs_ppo.py --model qwen2.5-0.5b --device cuda --eval-n 0 --microbatch 16",
    "long": "gpu_vs_trl.py --long --runs 1",
    "curve": "gpu_curve.py",
}


def json_stage(name: str, limit: float) -> Stage:
    """The stage `name` of `JSON_STAGES`."""
    title, reader = JSON_STAGES[name]
    out = WORK / f"{name}.json"

    def command() -> list[str] | str:
        if name in TRL_STAGES and not trl_at_hand():
            return TRL_MISSING
        return script(*COMMANDS[name].split(), "--json", str(out))

    return Stage(name, title, limit, command, lambda _: reader(json.loads(out.read_text())), (out,))


def profile_stage(limit: float) -> Stage:
    def read(outcome: Outcome) -> list[list[str]]:
        lines = outcome.log.read_text().splitlines()
        steps = [line for line in lines if re.match(r"[^:]+: step \d+: ", line)]
        busy = [line for line in lines if re.match(r"[^:]+: the last step's kernels ran ", line)]
        return [
            ["phases, s (`time/*`), by settings", "; ".join(steps) or "no step finished"],
            ["GPU busy in the last step, by settings", "; ".join(busy) or "n/a"],
            ["ops with the most GPU time, last step", f"in {outcome.log}"],
        ]

    command = partial(script, "profile_step.py", "--tokens", "256", "--steps", "3")
    return Stage("profile", "oncurve's step profiled (256 tokens)", limit, command, read)


def stages(args: argparse.Namespace) -> list[Stage]:
    """The stages `args.stages` names, in the order of `LIMITS`."""
    made = {name: partial(json_stage, name) for name in JSON_STAGES}
    made |= {"tests": gpu_tests_stage, "profile": profile_stage}
    made["job"] = partial(default_job_stage, steps=args.steps)
    return [made[name](LIMITS[name] * args.time_scale) for name in LIMITS if name in args.stages]


# The rows a stage's one-line summary quotes, by check as the stages' readers name them, and how
HEADLINES = {
    "`pytest -m gpu`": "{}",
    "held-out greedy accuracy before / after": "held-out {}",
    "s/step (median, first step left out)": "{} s/step",
    "s/step oncurve / TRL": "s/step vs TRL {}",
    "peak GPU memory oncurve / TRL": "peak vs TRL {}",
    "peak GPU memory GRPO / PPO": "peak vs PPO {}",
    "TRL": "TRL: {}",
    "PPO": "PPO: {}",
}


def summary(row: dict) -> str:
    """The row in one line: each stage's status and the figures `HEADLINES` names, with the
    rollout's `cuda_graph` rate."""
    parts = []
    for stage in row["stages"]:
        quoted = "".join(
            f", {HEADLINES.get(check, '`cuda_graph` {}').format(result)}"
            for check, result in stage.get("rows", [])
            if check in HEADLINES or check.endswith("`cuda_graph`")
        )
        parts.append(f"{stage['name']} {status(stage)}{quoted}")
    return "; ".join(parts)


def section(row: dict) -> str:
    """One check's section: its GPU, versions and command, the stages' table, the log tails."""
    failures = tails(row["stages"])
    return (
        f"## {row['key']}\n\n{row['date']}, {row['machine']['gpu']}, torch "
        f"{row['versions']['torch']} (CUDA {row['cuda']}), transformers "
        f"{row['versions']['transformers']}; `{row['command']}`\n\n{table(row['stages'])}\n"
        + (f"\n### Log tails\n\n{failures}" if failures else "")
    )


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
    reports = [run_stage(stage, env, WORK / "logs", ROOT) for stage in chosen]
    print(f"\n{table(reports)}\n\n{tails(reports)}")
    default = set(args.stages) == set(DEFAULT_STAGES)
    key = gpu_name() + ("" if default else f", --stages {','.join(args.stages)}")
    publish(NAME, TITLE, key, {"renderer": NAME, "cuda": torch.version.cuda, "stages": reports})
    return 0 if all(r["code"] == 0 for r in reports if r["seconds"] is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
