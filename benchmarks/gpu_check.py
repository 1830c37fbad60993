"""`make gpu-check`: the GPU tests and the default job on one CUDA device, in one table.

1. `pytest -m gpu` (tests/test_gpu.py: float32 gradients equal to the CPU's, every preset and
   feature in bfloat16, bit-identical resume, checkpoints that move to the CPU, NCCL with 2
   GPUs), counted as passed / failed / skipped.
2. The default job on the GPU: `oncurve train run.device=cuda`, the default config otherwise
   (`--steps N` shortens it). From its `metrics.jsonl`: the median seconds per step
   (`time/step`, the first step left out: it warms up the kernels and the allocator) and the
   peak GPU memory (the largest `memory/gpu_peak_gb` of a step; "n/a" when the trainer logged
   none); from the summary line it prints: held-out greedy accuracy before and after.
3. One markdown table, printed and written to `benchmarks/results/gpu_check.md`, a section per
   GPU with the date, the GPU and the torch, CUDA and transformers versions.

Without a CUDA device it exits 2 with one line; it exits 1 when a test or the job failed.

    .venv/bin/python benchmarks/gpu_check.py             # or: make gpu-check
    .venv/bin/python benchmarks/gpu_check.py --steps 20  # a shorter job
    python3 benchmarks/gpu_check.py                      # any Python with a CUDA torch and
                                                         # oncurve's dependencies (src/ is put
                                                         # on its path)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import markdown_table, write_section  # noqa: E402

CACHE = HERE / ".cache" / "gpu_check"
RESULTS = HERE / "results" / "gpu_check.md"
TITLE = "GPU check\n\nWritten by `benchmarks/gpu_check.py` (`make gpu-check`), one section per GPU."


def _with_src() -> dict[str, str]:
    """The environment with the checkout's `src` first on the path, so that a Python where
    oncurve is not installed (a GPU image's own, with its CUDA torch) runs it too."""
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def gpu_tests() -> tuple[dict[str, int], int]:
    """({passed, failed, skipped}, pytest's exit status) of `pytest -m gpu`, whose output
    goes to the terminal; errors count as failed."""
    CACHE.mkdir(parents=True, exist_ok=True)
    report = CACHE / "gpu-tests.xml"
    report.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-rs", f"--junitxml={report}"]
    code = subprocess.run(command, cwd=ROOT, env=_with_src(), check=False).returncode
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    if report.is_file():
        root = ElementTree.parse(report).getroot()
        for suite in [root] if root.tag == "testsuite" else root.iter("testsuite"):
            total, failures, errors, skipped = (
                int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")
            )
            counts["passed"] += total - failures - errors - skipped
            counts["failed"] += failures + errors
            counts["skipped"] += skipped
    return counts, code


def default_job(steps: int | None) -> dict[str, object] | None:
    """The default job on cuda: its summary line, metrics rows and wall seconds, or None when
    it failed (its output went to the terminal)."""
    run_dir = CACHE / "run"
    command = [sys.executable, "-m", "oncurve", "train", "--quiet", "run.device=cuda"]
    command += [f"run.dir={run_dir.relative_to(ROOT)}", "run.overwrite=true"]
    if steps:
        command.append(f"run.steps={steps}")
    start = time.perf_counter()
    proc = subprocess.run(
        command, cwd=ROOT, env=_with_src(), stdout=subprocess.PIPE, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stdout, end="")
        return None
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "command": " ".join(["oncurve", *command[3:]]),
        "summary": json.loads(proc.stdout.strip().splitlines()[-1]),
        "rows": [r for r in rows if "time/step" in r],
        "seconds": seconds,
    }


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def table(tests: dict[str, int], test_code: int, job: dict[str, object] | None) -> str:
    rows = [
        [
            "GPU tests (`pytest -m gpu`)",
            f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
            + (f" (pytest exit status {test_code})" if test_code not in (0, 1) else ""),
        ]
    ]
    if job is None:
        return markdown_table(["check", "result"], [*rows, ["default job on cuda", "failed"]])
    steps = job["rows"]
    timed = steps[1:] or steps  # the first step warms up
    peaks = [r["memory/gpu_peak_gb"] for r in steps if "memory/gpu_peak_gb" in r]
    summary = job["summary"]
    rows += [
        ["default job", f"`{job['command']}`, {len(steps)} step{'s' * (len(steps) != 1)}"],
        [
            f"s/step (median of steps {timed[0]['step']}-{timed[-1]['step']})",
            f"{statistics.median(r['time/step'] for r in timed):.3f}",
        ],
        ["peak GPU memory (max `memory/gpu_peak_gb`)", f"{max(peaks):.2f} GiB" if peaks else "n/a"],
        [
            "held-out greedy accuracy before / after",
            f"{percent(summary.get('accuracy_before'))} / {percent(summary.get('accuracy_after'))}",
        ],
        ["wall time of the job (start-up and evaluations included)", f"{job['seconds']:.0f} s"],
    ]
    return markdown_table(["check", "result"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="run.steps of the default job")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"gpu_check: error: no CUDA device: this torch ({torch.__version__}) sees none; "
            "run it on a machine with an NVIDIA GPU and a CUDA build of torch",
            file=sys.stderr,
        )
        return 2
    import transformers

    gpu = torch.cuda.get_device_name(0)
    tests, test_code = gpu_tests()
    job = default_job(args.steps)
    text = table(tests, test_code, job)
    command = "benchmarks/gpu_check.py" + (f" --steps {args.steps}" if args.steps else "")
    section = (
        f"## {gpu}\n\n{datetime.now():%Y-%m-%d %H:%M}, {torch.cuda.device_count()} x {gpu}, "
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}; `{command}`\n\n{text}\n"
    )
    print(f"\n{text}\n")
    write_section(RESULTS, TITLE, gpu, section)
    return 0 if job is not None and tests["failed"] == 0 and test_code in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
