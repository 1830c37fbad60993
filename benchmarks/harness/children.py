"""Child processes: run one with its output in a log, with or without a time limit, and read
its peak memory; `oncurve train` (also for a budget of seconds of training steps), `oncurve eval`
and `oncurve tasks export` as children of the checkout's oncurve."""

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
    """Run `command` with its output in `log`; returns (wall seconds, peak RSS in MB of that
    process alone, exit status). A failure raises SystemExit with the log's tail unless `check`
    is false."""
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
    """Run `command` (in `cwd`) with its output in `log` for at most `limit` seconds; returns
    (its exit status, or None when it ran out of time, wall seconds). The child leads a process
    group of its own, and on a timeout the whole group is killed: pytest's workers and a
    trainer's reward workers would otherwise live on, holding the GPU."""
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
    if not log.is_file():
        return ""
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


class _Sampled:
    """The largest value `read()` returns, sampled by a thread every `interval` seconds while
    the `with` block runs (`peak`, None until a sample; a `read` returning None is skipped)."""

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
    """Run `fn` and return (its result, peak resident memory above the start, in MB): RSS
    sampled by a thread every `interval` seconds, and the process's lifetime peak (`ru_maxrss`)
    when `fn` raised it. RSS follows torch tensors only when freed memory goes back to the OS:
    run this in a fresh process with `isolated_env`, after a small warm-up call."""
    base = _rss_bytes()
    lifetime_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with _Sampled(_rss_bytes, interval) as sampled:
        result = fn()
    lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = max(sampled.peak or base, _rss_bytes(), lifetime if lifetime > lifetime_before else 0)
    return result, (peak - base) / 2**20


class GpuMemoryPeak(_Sampled):
    """Peak `memory.used` of GPU 0 in GiB as nvidia-smi reports it, sampled every `interval`
    seconds while the `with` block runs (a child's CUDA context and its allocator's cached
    blocks included, which `torch.cuda.max_memory_allocated` leaves out); `peak_gb` stays None
    without nvidia-smi."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(self._used_gb, interval)

    @staticmethod
    def _used_gb() -> float | None:
        used = nvidia_smi("memory.used")  # MiB
        return None if used is None else float(used) / 1024

    @property
    def peak_gb(self) -> float | None:
        return self.peak


def own_peak_rss() -> float | None:
    """This process's peak RSS in MB (Linux `VmHWM`, of its own address space, created at
    exec), None elsewhere. Not `ru_maxrss` as the parent's `wait4` reports it: Python starts
    children with vfork, and Linux carries the parent's high-water mark into the child's
    `ru_maxrss` at exec, so a child smaller than its parent would show the parent's peak."""
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def isolated_env() -> dict[str, str]:
    """Environment for a memory-measuring child: glibc returns every allocation over 64 KB to
    the OS when freed, so RSS is the live memory rather than the heap's high-water mark."""
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
    """`oncurve train --quiet ARGS` under `python` with its run in `run_dir` (overwritten) and
    its output in `log`; returns its wall seconds, peak RSS in MB, exit status ("code") and the
    metrics rows of its steps (none when it failed). A failure raises SystemExit with the log's
    tail unless `check` is false."""
    from oncurve.run.metrics import read_jsonl

    command = [python, "-m", "oncurve", "train", "--quiet", *args]
    command += [f"run.dir={run_dir}", "run.overwrite=true"]
    wall, rss, code = run_child(command, env or dict(os.environ), log, check)
    metrics = run_dir / "metrics.jsonl"
    rows = [r for r in read_jsonl(metrics) if "time/step" in r] if metrics.is_file() else []
    return {"wall": wall, "rss": rss, "code": code, "rows": rows}


def logged_step_seconds(run_dir: Path) -> list[float]:
    """The `time/step` of each step an oncurve run in `run_dir` has logged so far (`read_jsonl`
    leaves a line being written for the next read)."""
    from oncurve.run.metrics import read_jsonl

    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.is_file() else []
    return [row["time/step"] for row in rows if "time/step" in row]


def train_oncurve_for(args: list[str], run_dir: Path, log: Path, budget: float) -> list[float]:
    """`oncurve train --quiet ARGS` of the checkout with its run in `run_dir` (emptied first: an
    earlier run's metrics would stop this one) and its output in `log`, sent SIGTERM once its
    logged steps' seconds reach `budget` (it finishes the step in progress, saves it and exits
    0: its last step may end past the budget); its steps' seconds. SystemExit when it fails."""
    command = [sys.executable, "-m", "oncurve", "train", "--quiet", *args]
    command += [f"run.dir={run_dir}", "run.overwrite=true"]
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=checkout_env())
        while child.poll() is None:
            if sum(logged_step_seconds(run_dir)) >= budget:
                child.send_signal(signal.SIGTERM)
                child.wait()
            time.sleep(0.2)
    if child.returncode:
        raise SystemExit(f"oncurve's run failed ({child.returncode}): {log}")
    return logged_step_seconds(run_dir)


def export_task(task: str, split: str, count: int, path: Path) -> Path:
    """`oncurve tasks export`: `count` rows of a built-in task's split into the JSONL `path`."""
    command = [sys.executable, "-m", "oncurve", "tasks", "export", task, "--split", split]
    subprocess.run([*command, "-n", str(count), "-o", str(path)], check=True)
    return path


def greedy_accuracy(final: str | Path, test_file: Path, tokens: int) -> float:
    """The greedy accuracy `oncurve eval` gives `final` (a model directory, or a run's
    checkpoint) on `test_file`, on the CPU, with `tokens` new tokens at most."""
    command = [sys.executable, "-m", "oncurve", "eval", "--model", str(final), "--device", "cpu"]
    command += ["--data", str(test_file), "--max-new-tokens", str(tokens)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"oncurve eval {final} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]
