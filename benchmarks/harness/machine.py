"""The machine a figure was measured on: its CPU or GPU (and a GPU script's exit without one),
load, library versions, and the fp32 matmul rate that a FLOP floor divides by."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def nvidia_smi(field: str) -> str | None:
    """GPU 0's `field` as nvidia-smi reports it, without units (no CUDA context in this
    process); None without nvidia-smi or when it fails."""
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"]
    out = subprocess.run(query, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_name() -> str:
    """The first GPU's name from nvidia-smi, else torch's."""
    name = nvidia_smi("name")
    if name is not None:
        return name
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU)"


def require_cuda(script: str, instead: str = "--smoke") -> None:
    """Exit 2 with a line saying so where torch sees no CUDA device: `script` names itself, and
    `instead` what runs here."""
    import torch

    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device (use {instead} here)", file=sys.stderr)
        raise SystemExit(2)


def torch_threads() -> int:
    """The threads torch's CPU kernels use in this process."""
    import torch

    return torch.get_num_threads()


def load_average() -> tuple[float, float]:
    """The 1- and 5-minute load averages: other work on the cores slows every trainer."""
    one, five, _ = os.getloadavg()
    return round(one, 2), round(five, 2)


def load_note() -> str:
    """This machine's load as a sentence, printed with results."""
    one, five = load_average()
    return f"load average {one:.1f} / {five:.1f} (1 / 5 min) on {os.cpu_count()} cores"


def versions() -> dict[str, str]:
    """Python, torch and transformers of this interpreter."""
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def interpreter_versions(python: str, env: dict[str, str], modules: tuple[str, ...]) -> str:
    """The versions of `modules` that `python` imports in `env`, as one line ("unknown (...)"
    with its error when an import fails)."""
    names = ", ".join(modules)
    code = f"import {names}; print(', '.join(m.__name__ + ' ' + m.__version__ for m in [{names}]))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    return out.stdout.strip() or f"unknown ({out.stderr.strip().splitlines()[-1:]})"


def describe() -> dict[str, object]:
    """The machine's facts a result row keeps: CPU, cores, GPU where torch sees one."""
    import torch

    facts: dict[str, object] = {"cpu": cpu_name(), "cores": os.cpu_count()}
    if torch.cuda.is_available():
        facts["gpu"] = f"{torch.cuda.device_count()} x {gpu_name()}"
    return facts


def matmul_gflops(rows: int, inner: int, cols: int, seconds: float = 0.5) -> float:
    """fp32 GFLOP/s of `[rows, inner] @ [inner, cols]`, best of a few batches and of both
    orientations (MKL is faster one way depending on the shape)."""
    import torch

    flops = 2 * rows * inner * cols
    reps = max(1, int(2e8 / flops))
    best = float("inf")
    for m, n in ((rows, cols), (cols, rows)):
        a, b, out = torch.randn(m, inner), torch.randn(inner, n), torch.empty(m, n)
        deadline = time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b, out=out)
            best = min(best, (time.perf_counter() - start) / reps)
    return flops / best / 1e9
