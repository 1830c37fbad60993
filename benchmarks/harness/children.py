"""Child processes with their output in a log, with or without a time limit; peak memory;
`oncurve train` (also for a budget of seconds), `eval` and `tasks export` of the checkout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.checkout import checkout_env
from harness.machine import nvidia_smi


def run_child(
    command: list[str], env: dict[str, str], log: Path, check: bool = True
) -> tuple[float, float, int]:
    """Run `command` with its output in `log`: (wall seconds, its peak RSS in MB, exit status).
    A failure raises SystemExit with the log's tail unless `check` is false."""
    start = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code and check:
        raise SystemExit(f"{' '.join(command[:4])} ... failed ({code}):\n{log_tail(log)}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, code


def run_limited(
    command: list[str], env: dict[str, str], log: Path, limit: float, cwd: Path | None = None
) -> tuple[int | None, float]:
    """Run `command` in `cwd` with its output in `log` for at most `limit` seconds: (exit status,
    None on a timeout; wall seconds). A timeout kills the child's whole process group, lest
    pytest's or the reward's workers live on holding the GPU."""
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        try:
            code: int | None = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group ended meanwhile
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    return code, time.perf_counter() - start


def log_tail(log: Path, lines: int = 30) -> str:
    """The last `lines` lines of the text file `log` ("" when there is none)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return "".join(text.splitlines(keepends=True)[-lines:])


class _Sampled:
    """`peak`: the largest value `read()` returns (None skipped) sampled by a thread every
    `interval` seconds while the `with` block runs."""

    def __init__(self, read: Callable[[], float | None], interval: float) -> None:
        self.read, self.interval, self.peak = read, interval, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            value = self.read()
            if value is not None:
                self.peak = max(self.peak or value, value)
            self._done.wait(self.interval)

    def __enter__(self) -> _Sampled:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_memory(fn: Callable[[], Any], interval: float = 0.0005) -> tuple[Any, float]:
    """(`fn()`, peak RSS above the start in MB): sampled every `interval` seconds, or the
    lifetime peak when `fn` raised it. Run it in a fresh `isolated_env` process after a warm-up:
    RSS follows torch tensors only when freed memory goes back to the OS."""
    base = _rss_bytes()
    lifetime_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with _Sampled(_rss_bytes, interval) as sampled:
        result = fn()
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = max(sampled.peak or base, _rss_bytes(), lifetime if lifetime > lifetime_before else 0)
    return result, (peak - base) / 2**20


def _gpu_used_gb() -> float | None:
    used = nvidia_smi("memory.used")  # MiB
    return None if used is None else float(used) / 1024


class GpuMemoryPeak(_Sampled):
    """Peak nvidia-smi `memory.used` of GPU 0 in GiB while the `with` block runs (`peak`; None
    without nvidia-smi): unlike `torch.cuda.max_memory_allocated`, with CUDA context and cache."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(_gpu_used_gb, interval)


def own_peak_rss() -> float | None:
    """This process's peak RSS in MB (Linux `VmHWM`), None elsewhere. Not `ru_maxrss`: a child
    started by vfork inherits its parent's high-water mark there at exec."""
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def isolated_env() -> dict[str, str]:
    """Environment for a memory-measuring child: glibc frees allocations over 64 KB to the OS,
    so RSS is the live memory."""
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}


def setting_args(overrides: dict[str, Any]) -> list[str]:
    """`key=value` command-line overrides of oncurve settings (booleans as `true`/`false`)."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]


def train_oncurve(
    args: list[str],
    run_dir: Path,
    log: Path,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    check: bool = True,
) -> dict[str, Any]:
    """`oncurve train --quiet ARGS` under `python` into `run_dir` (overwritten), output in `log`:
    {"wall", "rss" (MB), "code", "rows" (its steps' metrics)}. SystemExit on failure if `check`."""
    command = [python, "-m", "oncurve", "train", "--quiet", *args]
    command += [f"run.dir={run_dir}", "run.overwrite=true"]
    wall, rss, code = run_child(command, env or dict(os.environ), log, check)
    return {"wall": wall, "rss": rss, "code": code, "rows": logged_steps(run_dir)}


def logged_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The metrics rows of the steps an oncurve run in `run_dir` has logged so far."""
    from oncurve.run.metrics import read_jsonl

    path = run_dir / "metrics.jsonl"
    return [row for row in read_jsonl(path) if "time/step" in row] if path.is_file() else []


def train_oncurve_for(args: list[str], run_dir: Path, log: Path, budget: float) -> list[float]:
    """`oncurve train` of the checkout into `run_dir` (emptied), sent SIGTERM once its logged
    steps' seconds reach `budget` (it saves the step in progress and exits 0); each step's
    seconds. SystemExit when it fails."""
    command = [sys.executable, "-m", "oncurve", "train", "--quiet", *args]
    command += [f"run.dir={run_dir}", "run.overwrite=true"]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=checkout_env())
        while child.poll() is None:
            if sum(r["time/step"] for r in logged_steps(run_dir)) >= budget:
                child.send_signal(signal.SIGTERM)
                child.wait()
            time.sleep(0.2)
    if child.returncode:
        raise SystemExit(f"oncurve's run failed ({child.returncode}): {log}")
    return [r["time/step"] for r in logged_steps(run_dir)]


def export_task(task: str, split: str, count: int, path: Path) -> Path:
    """`oncurve tasks export`: `count` rows of a built-in task's split into the JSONL `path`."""
    command = [sys.executable, "-m", "oncurve", "tasks", "export", task, "--split", split]
    subprocess.run([*command, "-n", str(count), "-o", str(path)], check=True)
    return path


def greedy_accuracy(final: str | Path, test_file: Path, tokens: int) -> float:
    """`oncurve eval`'s greedy accuracy of `final` (model or checkpoint) on `test_file` on the
    CPU, `tokens` new tokens at most."""
    command = [sys.executable, "-m", "oncurve", "eval", "--model", str(final), "--device", "cpu"]
    command += ["--data", str(test_file), "--max-new-tokens", str(tokens)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"oncurve eval {final} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]
