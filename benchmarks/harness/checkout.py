"""Where the checkout's files are, and the environment in which a child process runs the
checkout's oncurve and this harness."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent
ROOT = BENCHMARKS.parent
CACHE = BENCHMARKS / ".cache"
RESULTS = BENCHMARKS / "results"
# What a GPU machine without internet access lacks, in one gitignored folder that the device
# tool carries (`gpu_check.py --prepare` fills it): `tokenizer/` (the Qwen3 tokenizer, from
# ../shared) and `wheels/` (TRL and what it needs beyond a CUDA torch image).
GPU_BUNDLE = BENCHMARKS / ".gpu-bundle"


def checkout_env(*first: str | Path, **extra: str) -> dict[str, str]:
    """This environment with `first`, the checkout's `src` and `benchmarks/` ahead on its
    PYTHONPATH (for a Python without oncurve), and `extra` set."""
    path = [*map(str, first), str(ROOT / "src"), str(BENCHMARKS)]
    path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def commit() -> str:
    """The short commit, `+dirty` when src or benchmarks code differs ("unknown" outside git)."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
        return "unknown"
    code = ("src", "benchmarks", ":(exclude)benchmarks/results")
    dirty = git("diff", "--quiet", "HEAD", "--", *code).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")
