"""Waiting on `python -m oncurve train` processes that tests start: their end, a condition of
their run directory, their newest checkpoint; the processes a launcher started."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    """The exit status and stderr of `proc` once it ends."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s: {err[-2000:]}") from None
    return proc.returncode, err


def wait_for(
    condition: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 150
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended before {what}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def latest_step(run_dir: Path) -> int:
    pointer = run_dir / "checkpoints" / "latest"
    try:
        return int(pointer.read_text().strip().removeprefix("step-") or 0)
    except (FileNotFoundError, ValueError):
        return 0


def descendants(pid: int) -> list[int]:
    """The pids of `pid`'s children, their children, ... (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def still_alive(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after waiting up to `seconds` for all to end."""
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def kill_all(pids: list[int]) -> None:
    """SIGKILL to each process of `pids` that still runs (a test's cleanup)."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
