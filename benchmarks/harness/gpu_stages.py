"""`gpu_check.py`'s stages, the rows each makes of what its child wrote, shared formats, and the
page. Imports no oncurve: `gpu_check.py` runs in a Python that may lack it."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import yaml

from harness import pytest_outcomes, run_logs
from harness.checkout import BENCHMARKS, CACHE
from harness.comparison import met
from harness.gpu_bundle import TRL_MISSING, trl_at_hand
from harness.stages import Outcome, Stage, status, table, tails
from harness.tables import cell

WORK = CACHE / "gpu_check"
COMPILE_CAPTURE_TARGET = 30  # seconds a run spends compiling and capturing its sampler, at most
FAILED = "its run failed or did not finish (log below)"


def gib(value: float | None) -> str:
    """`0.33 GiB`, or "n/a" when not measured."""
    return "n/a" if value is None else f"{value:.2f} GiB"


def against(value: float, target: float, unit: str = "x") -> str:
    """`(target <= 0.35x: met)`: whether `value` is within `target`."""
    return f"(target <= {target}{unit}: {met(value, target)})"


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


def tests_stage(limit: float) -> Stage:
    """`pytest -m gpu`: how many passed, failed and were skipped, each failure's message."""
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


def job_stage(limit: float, steps: int | None) -> Stage:
    """The default job on CUDA (`run.steps=steps` when given), read by `job_rows`."""
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


def ppo_rows(figures: dict) -> list[list[str]]:
    """`grpo_vs_ppo.py --json`: GRPO's peak against PPO's, each one's memory plan."""
    (pair,) = figures["pairs"]
    rows = [["PPO", "its run did not finish (log below)"]]  # stopped before PPO's ended
    if "PPO" in pair:
        grpo, ppo = pair["GRPO"]["cuda"] / 1024, pair["PPO"]["cuda"] / 1024
        claim = f"the claim, 25-50% less than PPO: {met(grpo / ppo, 0.75)}"
        ratio = f"{gib(grpo)} / {gib(ppo)} = {grpo / ppo:.2f}x"
        rows = [["peak GPU memory GRPO / PPO", f"{ratio} ({claim})"]]
    return rows + [
        [f"memory plan ({name}): predicted / measured peak",
         plan_against(run["plan_gb"], run["cuda"] / 1024)]
        for name, run in pair.items()
    ]  # fmt: skip


def time_to_final(row: dict, target: float) -> str:
    """`gpu_curve.py`'s verdict: oncurve's training seconds to TRL's final accuracy against
    `target` x TRL's; "n/a" where TRL did not run."""
    final, reach, ratio = row["trl_final"], row["reach_s"], row["ratio"]
    if final is None:
        return "n/a"
    if final <= row["warm_accuracy"]:
        return "TRL did not improve on the start: nothing to reach"
    if reach is None:
        return "never reached: missed"
    return f"{reach:.0f} s of TRL's {row['trl_seconds']:.0f} s = {ratio:.2f}x: {met(ratio, target)}"


def curve_rows(row: dict) -> list[list[str]]:
    """`gpu_curve.py --json`: each curve's accuracy before and after, oncurve's time to TRL's
    final accuracy (`time_to_final`)."""
    rows = [["warm start: held-out greedy accuracy", f"{row['warm_accuracy']:.1%}"]]
    rows += [[f"{label}: held-out accuracy before / after",
              f"{points[0][1]:.1%} / {points[-1][1]:.1%} ({len(points) - 1} checkpoints "
              f"in {points[-1][0]:.0f} s of training)"]
             for label, points in row["curves"].items()]  # fmt: skip
    if row["trl_final"] is None:
        return [*rows, ["TRL", "its run failed or did not run (log below)"]]
    time_to = f"oncurve's time to TRL's final {row['trl_final']:.1%} (target <= {row['target']}x)"
    return [*rows, [time_to, time_to_final(row, row["target"])]]


def json_stage(name: str, title: str, command: str, read: Callable[[Any], list[list[str]]],
               needs_trl: bool, limit: float) -> Stage:  # fmt: skip
    """The script `command` with `--json WORK/<name>.json`, read into rows by `read`; skipped
    with `TRL_MISSING` when it `needs_trl` and there is none."""
    out = WORK / f"{name}.json"

    def run() -> list[str] | str:
        if needs_trl and not trl_at_hand():
            return TRL_MISSING
        return script(*command.split(), "--json", str(out))

    return Stage(name, title, limit, run, lambda _: read(json.loads(out.read_text())), (out,))


def profile_stage(limit: float) -> Stage:
    """`profile_step.py` at 256 tokens: each setting's phases and how busy the GPU was."""

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
    """A check's row in one line: each stage's status and the figures `HEADLINES` names, with
    the rollout's `cuda_graph` rate."""
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
