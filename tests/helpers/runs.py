"""`oncurve train` runs that tests start in their own processes, the test rewards importable
there (`rewards_env`), the metrics rows runs wrote, and a run directory's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.paths import TESTS

STEPS = 6  # the uninterrupted run; the interrupted ones stop near STEPS // 2


def cli_args(model_dir: Path, data_file: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"model.path={model_dir}",
        f"data.path={data_file}",
        "data.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "reward.functions=[helpers.rewards_for_tests:count_digits]",
        f"run.steps={STEPS}",
        f"run.dir={run_dir}",
        "reward.timeout=null",
        "run.threads=1",
        "optim.lr=1e-2",
        "algo.beta=0.04",
        "run.device=cpu",  # bit-identical resumes and the one-line errors here are the CPU's
        *extra,
    ]


def rewards_env() -> dict[str, str]:
    """The environment with the test rewards (`helpers.rewards_for_tests`) importable."""
    paths = [str(TESTS), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def train_process(*args: str) -> subprocess.Popen:
    """`python -m oncurve train --quiet ARGS` with the test rewards importable."""
    return subprocess.Popen(
        [sys.executable, "-m", "oncurve", "train", "--quiet", *args],
        env=rewards_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def metric_rows(run_dir: Path) -> list[dict]:
    """Per-step rows without the wall-clock timings (the slowest reward row's too) and memory
    peaks, which differ between runs (a resumed process starts with a fresh allocator)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    varying = ("time/", "memory/", "tokens_per_s", "reward/slowest_row_s")
    return [{k: v for k, v in row.items() if not k.startswith(varying)} for row in rows]


def run_clis(jobs: list[list[str]], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """`python -m oncurve ARGS` for each ARGS of `jobs`, all at once (a launcher and torchrun
    start on one core each, one after the other: two jobs fill both cores), once all ended."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "oncurve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for args in jobs
    ]
    done = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return done


def tiny_job(model_dir: Path, data_file: Path) -> list[str]:
    """`oncurve train` arguments of a small job that learns something (ranks not set)."""
    return [
        "train",
        f"model.path={model_dir}",
        f"data.path={data_file}",
        "data.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "reward.functions=[helpers.rewards_for_tests:count_digits]",
        "reward.timeout=null",
        "optim.lr=1e-4",  # the random 50k-parameter model moves visibly in a few steps
        "run.device=cpu",  # gloo ranks
    ]


def run_files(root: Path) -> dict[Path, bytes]:
    """Every file below `root` with its bytes, but the lock's holder line, which names whoever
    locked the directory last (a refused start included)."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != ".lock"}
