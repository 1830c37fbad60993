"""`make gpu-check`: one command that verifies a CUDA GPU, written as one table.

Each stage is a child process with its own time limit (`LIMITS`, set from what each took on an
H200 and an H100). The default stages (`DEFAULT_STAGES`, 500 s together) fit one 10-minute call
of a GPU machine with its start, leaving a session of 15 device minutes enough for a second call of
one of the others (`--stages profile`, 210 s, or `--stages ppo`, 110 s). A stage that fails or runs out of time gets
its row all the same (its whole process group is killed at the limit) and its log tail is
printed after the table; the stages after it still run.

- `tests`: `pytest -m gpu` (tests/gpu/test_gpu.py, tests/gpu/test_gpu_paths.py: the trainer's paths
  each in a fresh process, ...), counted as passed / failed / skipped, the failed ones named;
  8 workers when pytest-xdist is installed (each test's process mostly compiles on the CPU).
  Each test's outcome is written as it ends (the plugin gpu_check_results.py), so a pytest
  stopped at the limit still reports the tests that finished.
- `job`: the default job on the GPU, `oncurve train run.device=cuda` (`--steps N` sets
  `run.steps`): held-out greedy accuracy before and after, the median `time/step` (the first
  step left out: it warms up kernels and allocator), the peak GPU memory (largest
  `memory/gpu_peak_gb`), whether every step sampled with its compiled step in CUDA graphs
  (`rollout/compiled`, `rollout/graphs`), whether the update packed its rows
  (`model.pack_rows` in config.yaml, with the warning that says why not), and the memory
  plan's predicted peak against that measured one. Read from what the run wrote,
  so a run stopped at its limit still reports the steps it finished.
- `rollout`: `rollout.py --device cuda --backends cuda_graph --quick` at 64 rows x 256
  tokens: `cuda_graph` as a run builds it against `model.generate` with its static cache,
  tokens/s, first-call seconds and within them the sampler's compile and capture seconds (the
  other scenarios, samplers and baselines take a call of their own: `rollout.py --device
  cuda`; the time they would take here goes to the tests).
- `trl`: `gpu_vs_trl.py` at 256 tokens (3 steps, one run each): oncurve's s/step and peak
  GPU memory against TRL's, and oncurve's memory plan against its peak; skipped, with the line
  that says how to add TRL, when neither the interpreter nor the GPU bundle has it.
- `ppo` (not by default): `grpo_vs_ppo.py --model qwen2.5-0.5b --device cuda`: GRPO's and
  PPO's peak GPU memory on the Qwen2.5-0.5B shape, and each one's memory plan against it.
- `profile` (not by default): `gpu_vs_trl.py --profile`: oncurve's step at 256 tokens with the
  memory plan's settings, with them and the decoder layers compiled (`model.compile_layers`),
  nondeterministic kernels, the reference kept on the GPU, the rows padded
  (`model.pack_rows=false`, each group's prompt run once through its KV cache), 16,384 tokens
  a microbatch and every row whole: the phases of each, how long each last step's kernels
  ran, and the ops with the most GPU and CPU time in each last step (in the log).

The table, a section per GPU with the date and the torch, CUDA and transformers versions, is
printed and written to `benchmarks/results/gpu_check.md`. Exit status: 0 when every stage run
exited 0, 1 otherwise, 2 without a CUDA device.

A GPU machine without internet access lacks the Qwen3 tokenizer (the 0.5B-shaped model's) and
TRL's wheels: `--prepare` (`make gpu-bundle`), run where ../shared and PyPI are, puts both
into benchmarks/.gpu-bundle (gitignored), which the scripts use when present.

    .venv/bin/python benchmarks/gpu_check.py --prepare        # or: make gpu-bundle
    python3 benchmarks/gpu_check.py                           # any Python with a CUDA torch and
                                                              # oncurve's dependencies
    python3 benchmarks/gpu_check.py --stages profile                   # the second call
    .venv/bin/python benchmarks/gpu_check.py --dry-run        # the commands, nothing run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import yaml
from harness.checkout import GPU_BUNDLE, checkout_env
from harness.children import log_tail, run_limited
from harness.run_logs import (
    measured_phase_peaks_gb,
    planned_peak_gb,
    planned_phase_peaks_gb,
    sampler_setup_seconds,
)
from harness.tables import markdown_table, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CACHE = HERE / ".cache" / "gpu_check"
RESULTS = HERE / "results" / "gpu_check.md"
TITLE = "GPU check\n\nWritten by `benchmarks/gpu_check.py` (`make gpu-check`), one section per GPU."
TOTAL_LIMIT = 510  # seconds: a 10-minute device call, less the machine's start and transfers
# seconds per stage; the default ones together under TOTAL_LIMIT, leaving 10 s for this
# process's own work
LIMITS = {"tests": 180, "job": 80, "rollout": 80, "trl": 160, "ppo": 110, "profile": 210}
DEFAULT_STAGES = ("tests", "job", "rollout", "trl")
TAIL_LINES = 30
# What TRL needs beyond the GPU image (torch, transformers, accelerate, pyarrow, pandas are
# there): datasets 5.0.1 because 5.1+ needs pyarrow >= 24, fsspec at datasets' pin. Never torch.
TRL_WHEELS = (
    "trl==1.16.0",
    "datasets==5.0.1",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "fsspec==2026.6.0",
)
GPU_PYTHON = "3.12"  # the GPU image's python3 (/work/.library/device/KINDS.md)
CARRY_LIMIT = 64 * 2**20  # what the device tool carries: working tree and carried paths


@dataclass(frozen=True)
class Outcome:
    """How a stage's child ended: `code` None when it ran out of its `limit` seconds."""

    code: int | None
    seconds: float
    limit: float
    log: Path

    @property
    def status(self) -> str:
        if self.code is None:
            return f"timed out at {self.limit:.0f} s"
        return "passed" if self.code == 0 else f"failed (exit {self.code})"


@dataclass(frozen=True)
class Stage:
    """One child process of the check.

    Attributes:
        name: its `--stages` key.
        title: its name in the table.
        limit: seconds it may run.
        command: called just before it runs: the command, or a line saying why it is skipped.
        read: its result rows ([check, result]) from its outcome and what it wrote; called
            whatever the outcome, so a failed or stopped stage shows what it got done.
        outputs: files and folders it writes, deleted before it runs (a stale one would be
            read as its result).
    """

    name: str
    title: str
    limit: float
    command: Callable[[], list[str] | str]
    read: Callable[[Outcome], list[list[str]]]
    outputs: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Report:
    """A stage as it went: `outcome` None when it was skipped (`rows` then say why)."""

    stage: Stage
    outcome: Outcome | None
    rows: list[list[str]]


def run_stages(stages: list[Stage], env: dict[str, str], logs: Path) -> list[Report]:
    """Run `stages` one after the other, each with its log in `logs`; a stage that cannot be
    read still gets a report."""
    logs.mkdir(parents=True, exist_ok=True)
    reports = []
    for stage in stages:
        command = stage.command()
        if isinstance(command, str):
            print(f"gpu_check: {stage.name}: skipped: {command}", flush=True)
            reports.append(Report(stage, None, [["skipped", command]]))
            continue
        print(
            f"gpu_check: {stage.name} (limit {stage.limit:.0f} s): {' '.join(command)}", flush=True
        )
        for path in stage.outputs:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        log = logs / f"{stage.name}.log"
        code, seconds = run_limited(command, env, log, stage.limit, cwd=ROOT)
        outcome = Outcome(code, seconds, stage.limit, log)
        try:
            rows = stage.read(outcome)
        except Exception as error:  # noqa: BLE001 - a stage that wrote nothing readable still gets its row
            rows = [["results", f"none readable ({type(error).__name__}: {error})"]]
        print(f"gpu_check: {stage.name}: {outcome.status} after {seconds:.0f} s", flush=True)
        reports.append(Report(stage, outcome, rows))
    return reports


def table(reports: list[Report]) -> str:
    """One markdown table: a stage's first row names it, its status and its seconds."""
    header = ["stage", "status", "s (limit)", "check", "result"]
    lines = []
    for report in reports:
        outcome = report.outcome
        status = "skipped" if outcome is None else outcome.status
        seconds = "" if outcome is None else f"{outcome.seconds:.0f} ({outcome.limit:.0f})"
        for i, (check, result) in enumerate(report.rows or [["results", "none"]]):
            first = [report.stage.title, status, seconds] if i == 0 else ["", "", ""]
            # an error message may hold what would end the row or the cell early
            lines.append([*first, check, " ".join(result.split()).replace("|", "\\|")])
    return markdown_table(header, lines)


def tails(reports: list[Report]) -> str:
    """The log tail of every stage that failed or ran out of time, as markdown."""
    parts = []
    for report in reports:
        outcome = report.outcome
        if outcome is None or outcome.code == 0:
            continue
        text = log_tail(outcome.log, TAIL_LINES).rstrip("\n") or "(no output)"
        parts.append(
            f"#### {report.stage.name}: {outcome.status}, last {TAIL_LINES} lines of "
            f"{outcome.log}\n\n```\n{text}\n```\n"
        )
    return "\n".join(parts)


# --- the stages ------------------------------------------------------------------------------


def gpu_tests_stage(limit: float) -> Stage:
    report = CACHE / "gpu-tests.xml"
    # each test as it ends (gpu_check_results.py), with the logs: they travel back together
    results = CACHE / "logs" / "gpu-tests.jsonl"

    def command() -> list[str]:
        workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
        return [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
                "-p", "gpu_check_results", f"--results-jsonl={results}",
                f"--junitxml={report}", *workers]  # fmt: skip

    def outcomes() -> list[dict]:
        """{"test", "outcome": passed | failed | skipped, and for a failure "message" and
        "detail"} from the XML, else from the lines written as the tests ended (pytest stopped
        before its XML); tests named as test_gpu::test_x."""
        if report.is_file():
            found = []
            for case in ElementTree.parse(report).getroot().iter("testcase"):
                children = {child.tag: child for child in case}
                name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
                failure = children.get("failure", children.get("error"))
                if failure is not None:
                    found.append({"test": name, "outcome": "failed",
                                  "message": failure.get("message", ""),
                                  "detail": failure.text or ""})  # fmt: skip
                else:
                    kind = "skipped" if "skipped" in children else "passed"
                    found.append({"test": name, "outcome": kind})
            return found
        lines = results.read_text().splitlines() if results.is_file() else []
        rows = list(map(json.loads, lines))
        for row in rows:  # node ids: tests/gpu/test_gpu.py::test_x -> test_gpu::test_x
            row["test"] = row["test"].rsplit("/", 1)[-1].replace(".py::", "::")
        return rows

    def read(outcome: Outcome) -> list[list[str]]:
        found = outcomes()
        if not found:
            return [["`pytest -m gpu`", "no test finished"]]
        counts = {
            kind: sum(r["outcome"] == kind for r in found)
            for kind in ("passed", "failed", "skipped")
        }
        failed = [r for r in found if r["outcome"] == "failed"]
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.items())
        if not report.is_file():
            summary += " (pytest was stopped: the tests that finished before)"
        rows = [["`pytest -m gpu`", summary]]
        for r in failed[:8]:
            rows.append([f"failed: `{r['test']}`", r.get("message", "")[:300] or "(no message)"])
        if len(failed) > 8:
            rows.append(["failed", f"and {len(failed) - 8} more"])
        if failed and outcome.log.is_file():  # the reports, in the log and its printed tail
            with outcome.log.open("a") as log:
                for r in failed:
                    log.write(f"\n--- {r['test']} ---\n{r.get('detail', '')}\n")
        return rows

    return Stage("tests", "GPU tests", limit, command, read, (report, results))


def default_job_stage(limit: float, steps: int | None) -> Stage:
    run_dir = CACHE / "run"

    def command() -> list[str]:
        extra = [f"run.steps={steps}"] if steps else []
        return [sys.executable, "-m", "oncurve", "train", "--quiet", "run.device=cuda",
                f"run.dir={run_dir}", *extra]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        metrics = run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        return job_rows(rows, outcome.log.read_text(errors="replace"), config)

    return Stage("job", "default job on cuda", limit, command, read, (run_dir,))


def job_rows(rows: list[dict], log: str, config: dict) -> list[list[str]]:
    """The default job's results from its metrics rows (training and evaluation), its log and
    its config.yaml."""
    steps = config["run"]["steps"]
    trained = [r for r in rows if "time/step" in r]
    evaluated = [r for r in rows if "eval/accuracy" in r]
    timed = trained[1:] or trained  # the first step warms up
    peaks = [r["memory/gpu_peak_gb"] for r in trained if "memory/gpu_peak_gb" in r]

    def every_step(key: str) -> str:
        off = [r["step"] for r in trained if r.get(key) != 1.0]
        return f"off at steps {off[:5]}" if off else "every step" if trained else "n/a"

    before = percent(evaluated[0]["eval/accuracy"]) if evaluated else "n/a"
    after = percent(evaluated[-1]["eval/accuracy"]) if len(evaluated) > 1 else "n/a"
    peak = max(peaks) if peaks else None
    return [
        ["steps done", f"{len(trained)} of {steps}"],
        ["held-out greedy accuracy before / after", f"{before} / {after}"],
        [
            "s/step (median, first step left out)",
            f"{statistics.median(r['time/step'] for r in timed):.3f}" if timed else "n/a",
        ],
        ["peak GPU memory (max `memory/gpu_peak_gb`)", gib(peak)],
        ["CUDA graphs (`rollout/graphs`)", every_step("rollout/graphs")],
        ["compiled decode step (`rollout/compiled`)", every_step("rollout/compiled")],
        ["rows packed in the update (`model.pack_rows`)", packed_rows(config, log)],
        [
            "reference on the GPU for its pass only (`model.offload_reference`)",
            "yes" if config["model"]["offload_reference"] else "no",
        ],
        ["memory plan: predicted / measured peak", plan_against(planned_peak_gb(log), peak)],
        [
            "peak by phase, measured / planned",
            phase_peaks(measured_phase_peaks_gb(trained), planned_phase_peaks_gb(log)),
        ],
        [
            "sampler's compile + capture over the run (`time/sampler_*_total`)",
            compile_capture(sampler_setup_seconds(trained[-1]) if trained else None),
        ],
    ]


def packed_rows(config: dict, log: str) -> str:
    """Whether the run packed its rows, and if not, the warning that says why (the check of
    torch's variable-length attention failed) when there is one."""
    if config["model"]["pack_rows"]:
        return "yes"
    why = re.search(r"warning: rows stay padded .*failed its check: (.*)", log)
    return f"no: {why.group(1)}" if why else "no"


def rollout_stage(limit: float) -> Stage:
    out = CACHE / "rollout.json"

    def command() -> list[str]:
        return [sys.executable, str(HERE / "rollout.py"), "--device", "cuda", "--backends",
                "cuda_graph", "--quick", "--cuda-shapes", "64x256", "--repeats", "1", "--no-gaps",
                "--json", str(out)]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        rows = []
        for r in json.loads(out.read_text()):
            # within the first call: the sampler's own compiling and capturing, if it does
            parts = [f"{r['first_call_s']:.1f} s"]
            for what, key in (("compile", "compile_s"), ("capture", "capture_s")):
                if r.get(key) is not None:
                    parts.append(f"{what} {r[key]:.1f} s")
            rows.append(
                [
                    f"{r['scenario']} `{r['sampler']}`",
                    f"{r['tokens_per_s']:,.0f} tokens/s ({r['vs_static']:.2f}x static "
                    f"generate); first call {', '.join(parts)}",
                ]
            )
        return rows

    return Stage("rollout", "rollout (rows x tokens)", limit, command, read, (out,))


def trl_stage(limit: float) -> Stage:
    out = CACHE / "trl.json"

    def command() -> list[str] | str:
        wheels = list((GPU_BUNDLE / "wheels").glob("trl-*.whl"))
        if importlib.util.find_spec("trl") is None and not wheels:
            return (
                "TRL is not importable and benchmarks/.gpu-bundle has no wheels: run `make "
                "gpu-bundle` where PyPI is reachable and carry benchmarks/.gpu-bundle"
            )
        return [sys.executable, str(HERE / "gpu_vs_trl.py"), "--tokens", "256", "--steps", "3",
                "--runs", "1", "--json", str(out)]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        from gpu_vs_trl import SPEED_TARGET

        stats = json.loads(out.read_text())["stats"]
        if "TRL" not in stats:
            return [["TRL", "not run: the interpreter could not import it"]]
        ours, base = stats["oncurve"], stats["TRL"]  # None: that run failed
        if ours is None:
            return [["oncurve", "its run failed or did not finish (log below)"]]
        rows = [
            [
                "memory plan: predicted / measured peak",
                plan_against(ours["plan_gb"], ours["gpu_peak_gb"]),
            ],
            [
                "oncurve peak by phase, measured / planned",
                phase_peaks(ours.get("phase_peaks_gb", {}), ours.get("plan_phases_gb", {})),
            ],
            ["oncurve sampler's compile + capture", compile_capture(ours.get("compile_capture_s"))],
        ]
        if base is None:
            return [["TRL", "its run failed or did not finish (log below)"], *rows]
        speed = ours["seconds"] / base["seconds"]
        memory = ours["gpu_peak_gb"] / base["gpu_peak_gb"]
        phases = ", ".join(
            f"{name} {ours['phases'][name]:.2f} / {seconds:.2f}"
            for name, seconds in base.get("phases", {}).items()
            if name in ours.get("phases", {}) and name != "reward"
        )
        return [
            [
                "s/step oncurve / TRL",
                f"{ours['seconds']:.2f} / {base['seconds']:.2f} s = {speed:.2f}x "
                f"(target <= {SPEED_TARGET}x: {'met' if speed <= SPEED_TARGET else 'missed'})",
            ],
            ["phases oncurve / TRL, s", phases or "n/a"],
            [
                "peak GPU memory oncurve / TRL",
                f"{gib(ours['gpu_peak_gb'])} / {gib(base['gpu_peak_gb'])} = {memory:.2f}x "
                f"(target <= 1x: {'met' if memory <= 1 else 'missed'})",
            ],
            *rows,
        ]

    return Stage("trl", "one step against TRL (256 tokens)", limit, command, read, (out,))


def ppo_stage(limit: float) -> Stage:
    out = CACHE / "ppo.json"

    def command() -> list[str]:
        return [sys.executable, str(HERE / "grpo_vs_ppo.py"), "--model", "qwen2.5-0.5b", "--device",
                "cuda", "--eval-n", "0", "--microbatch", "16", "--json", str(out)]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        (pair,) = json.loads(out.read_text())["pairs"]
        if "PPO" not in pair:  # stopped before PPO's run finished
            rows = [["PPO", "its run did not finish (log below)"]]
        else:
            grpo, ppo = pair["GRPO"], pair["PPO"]
            ratio = grpo["cuda"] / ppo["cuda"]
            rows = [
                [
                    "peak GPU memory GRPO / PPO",
                    f"{gib(grpo['cuda'] / 1024)} / {gib(ppo['cuda'] / 1024)} = {ratio:.2f}x (the "
                    f"claim, 25-50% less than PPO: {'met' if ratio <= 0.75 else 'missed'})",
                ]
            ]
        for name, run in pair.items():
            rows.append([f"memory plan ({name}): predicted / measured peak",
                         plan_against(run["plan_gb"], run["cuda"] / 1024)])  # fmt: skip
        return rows

    return Stage("ppo", "GRPO against PPO, 0.5B shape", limit, command, read, (out,))


def profile_stage(limit: float) -> Stage:
    def command() -> list[str]:
        return [sys.executable, str(HERE / "gpu_vs_trl.py"), "--profile", "--tokens", "256",
                "--steps", "3"]  # fmt: skip

    def read(outcome: Outcome) -> list[list[str]]:
        lines = outcome.log.read_text().splitlines()
        steps = [line for line in lines if re.match(r"[^:]+: step \d+: ", line)]
        busy = [line for line in lines if re.match(r"[^:]+: the last step's kernels ran ", line)]
        return [
            ["phases, s (`time/*`), by settings", "; ".join(steps) or "no step finished"],
            ["GPU busy in the last step, by settings", "; ".join(busy) or "n/a"],
            ["ops with the most GPU time, last step", f"in {outcome.log}"],
        ]

    return Stage("profile", "oncurve's step profiled (256 tokens)", limit, command, read)


def stages(args: argparse.Namespace) -> list[Stage]:
    """The stages `args.stages` names, in the order of `LIMITS`."""
    limit = {name: seconds * args.time_scale for name, seconds in LIMITS.items()}
    made = {
        "tests": lambda: gpu_tests_stage(limit["tests"]),
        "job": lambda: default_job_stage(limit["job"], args.steps),
        "rollout": lambda: rollout_stage(limit["rollout"]),
        "trl": lambda: trl_stage(limit["trl"]),
        "ppo": lambda: ppo_stage(limit["ppo"]),
        "profile": lambda: profile_stage(limit["profile"]),
    }
    return [made[name]() for name in LIMITS if name in args.stages]


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def phase_peaks(measured: dict[str, float], planned: dict[str, float]) -> str:
    """Each phase's measured peak against the plan's (`harness.run_logs.PEAK_PHASES`), GiB."""
    if not measured:
        return "n/a"
    return ", ".join(
        f"{phase} {value:.2f} / {gib(planned.get(phase))}" for phase, value in measured.items()
    )


def plan_against(plan: float | None, measured: float | None) -> str:
    """The plan's predicted peak (GiB, to 0.1 as the trainer prints it) against the measured."""
    if plan is None or measured is None:
        return f"{gib(plan)} / {gib(measured)}"
    return f"{plan:.1f} / {measured:.2f} GiB ({plan - measured:+.2f} GiB)"


COMPILE_CAPTURE_TARGET = 30  # seconds a run spends compiling and capturing its sampler, at most


def compile_capture(seconds: float | None) -> str:
    """A run's compile plus capture seconds against `COMPILE_CAPTURE_TARGET`."""
    if seconds is None:
        return "n/a"
    met = "met" if seconds <= COMPILE_CAPTURE_TARGET else "missed"
    return f"{seconds:.1f} s (target <= {COMPILE_CAPTURE_TARGET} s: {met})"


# --- the bundle ------------------------------------------------------------------------------


def prepare() -> int:
    """Fill `GPU_BUNDLE` with the Qwen3 tokenizer and TRL's wheels; print its size against what
    the device tool carries."""
    from harness.models import SHARED_TOKENIZER, copy_files

    if not (SHARED_TOKENIZER / "tokenizer.json").is_file():
        print(f"gpu_check: error: no Qwen3 tokenizer at {SHARED_TOKENIZER}", file=sys.stderr)
        return 2
    shutil.rmtree(GPU_BUNDLE, ignore_errors=True)
    copy_files(SHARED_TOKENIZER, GPU_BUNDLE / "tokenizer")
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", GPU_PYTHON, "--implementation", "cp", "--platform",
                "manylinux2014_x86_64", "-d", str(GPU_BUNDLE / "wheels"), *TRL_WHEELS]  # fmt: skip
    subprocess.run(download, check=True)
    size = sum(p.stat().st_size for p in GPU_BUNDLE.rglob("*") if p.is_file())
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    tree = sum(
        (ROOT / p.decode()).stat().st_size for p in tracked if p and (ROOT / p.decode()).is_file()
    )
    print(
        f"{GPU_BUNDLE.relative_to(ROOT)}: {size / 2**20:.1f} MiB (tokenizer and "
        f"{len(TRL_WHEELS)} wheels); with the working tree ({tree / 2**20:.1f} MiB) "
        f"{(size + tree) / 2**20:.1f} of the {CARRY_LIMIT / 2**20:.0f} MiB a device call carries"
    )
    if size + tree > CARRY_LIMIT:
        print("gpu_check: warning: too big to carry; carry benchmarks/.gpu-bundle/tokenizer alone")
    return 0


# --- main ------------------------------------------------------------------------------------


def stage_names(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    unknown = sorted(set(names) - set(LIMITS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown stages {unknown}; choose from {','.join(LIMITS)}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="run.steps of the default job")
    parser.add_argument(
        "--stages", type=stage_names, default=list(DEFAULT_STAGES),
        help=f"comma-separated subset of {','.join(LIMITS)} (default: {','.join(DEFAULT_STAGES)})",
    )  # fmt: skip
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every stage's time limit"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument(
        "--prepare", action="store_true", help="fill benchmarks/.gpu-bundle (tokenizer, wheels)"
    )
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
        print(
            f"gpu_check: error: no CUDA device: this torch ({torch.__version__}) sees none; "
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return 2
    import transformers
    from harness.machine import gpu_name

    gpu = gpu_name()
    budget = sum(stage.limit for stage in chosen)
    print(
        f"gpu_check: {len(chosen)} stages, time limits {budget:.0f} s in all (the whole "
        f"check's budget: {TOTAL_LIMIT} s)"
    )
    reports = run_stages(chosen, checkout_env(PYTHONUNBUFFERED="1"), CACHE / "logs")
    text = table(reports)
    failures = tails(reports)
    command = " ".join(["benchmarks/gpu_check.py", *sys.argv[1:]])
    section = (
        f"## {gpu}\n\n{datetime.now():%Y-%m-%d %H:%M}, {torch.cuda.device_count()} x {gpu}, "
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}; `{command}`\n\n{text}\n"
        + (f"\n### Log tails\n\n{failures}" if failures else "")
    )
    print(f"\n{text}\n")
    if failures:
        print(failures)
    publish(RESULTS.stem, TITLE, gpu, {"markdown": section})
    ran = [r.outcome for r in reports if r.outcome is not None]
    return 0 if all(o.code == 0 for o in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
