"""TRL's environment and its child (`harness.trl_child`), from the parent's side: on a CPU,
`benchmarks/.venv-trl` (made on first use); on a GPU image the interpreter's own, or the GPU
bundle's wheels installed offline."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.checkout import BENCHMARKS, CACHE, GPU_BUNDLE, checkout_env
from harness.children import run_child
from harness.machine import interpreter_versions
from harness.spec import Job

TRL_VENV = BENCHMARKS / ".venv-trl"
TORCH_PIN = "torch==2.13.0"  # the CPU wheel on disk; a loose torch pulls a multi-GB CUDA build
TRL_SITE = CACHE / "trl-site"  # the bundle's wheels, installed when the interpreter lacks trl


def venv_python() -> Path:
    """The TRL venv's python (which may not exist yet)."""
    return TRL_VENV / "bin" / "python"


def ensure_trl_venv() -> str:
    """The TRL venv's python, creating the venv on first use."""
    python = venv_python()
    probe = [str(python), "-c", "import trl"]
    if not python.exists() or subprocess.run(probe, capture_output=True).returncode:
        print(f"creating {TRL_VENV} (torch CPU wheel, then trl) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        for what in (["--upgrade", "pip"], [TORCH_PIN], ["trl"]):
            subprocess.run([*pip, *what], check=True)
    return str(python)


def trl_env(python: str) -> dict[str, str] | None:
    """The environment where `python` imports trl, oncurve and harness: its own packages, else
    the bundle's wheels installed once into `TRL_SITE`; None when neither has trl."""
    env = checkout_env(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    env.pop("VIRTUAL_ENV", None)
    if imports_trl(python, env):
        return env
    wheels = sorted((GPU_BUNDLE / "wheels").glob("*.whl"))
    if not wheels:
        return None
    if not TRL_SITE.is_dir():
        partial = TRL_SITE.with_name(TRL_SITE.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        # --no-deps: the wheels are what the image lacks, the rest (torch, transformers,
        # accelerate) is the interpreter's own, which pip --target would not see
        install = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        if subprocess.run([*install, "--target", str(partial), *map(str, wheels)]).returncode:
            return None  # e.g. wheels for another Python: pip said which
        partial.rename(TRL_SITE)
    env["PYTHONPATH"] = f"{TRL_SITE}:{env['PYTHONPATH']}"
    return env if imports_trl(python, env) else None


def imports_trl(python: str, env: dict[str, str]) -> bool:
    """Whether `python` finds trl in `env` (found, not imported: importing it and its
    dependencies takes seconds, and the TRL child fails with its own error if one is missing)."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('trl') is None)"
    return subprocess.run([python, "-c", code], env=env).returncode == 0


def trl_versions(python: str, env: dict[str, str]) -> str:
    """trl, transformers, torch and accelerate of TRL's environment, as one line."""
    return interpreter_versions(python, env, ("trl", "transformers", "torch", "accelerate"))


def run_trl(
    job: Job, out: Path, python: str, env: dict[str, str], save: bool = False, check: bool = True
) -> dict[str, Any]:
    """TRL's run of `job` in a fresh child into `out`: `trl_child`'s result with "wall", "rss",
    "code", "log", "phases" and (`save`) "final". SystemExit on failure if `check`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(dataclasses.asdict(job)))  # the child's input
    command = [python, "-m", "harness.trl_child", str(out), *(["--save"] if save else [])]
    wall, rss, code = run_child(command, env, out / "log.txt", check)
    result: dict[str, Any] = {"wall": wall, "rss": rss, "code": code, "log": str(out / "log.txt")}
    if code == 0:
        result.update(json.loads((out / "result.json").read_text()))
        result["phases"] = trl_phases(result)
        if save:
            result["final"] = str(out / "final")
    return result


def trl_phases(result: dict[str, Any]) -> dict[str, list[float]]:
    """Per-step seconds of TRL's generate, reward, reference (the rest of its preparation; no
    old-logprob pass at mu = 1) and train (the rest of the step)."""
    seconds, prepare = result["seconds"], result["prepare"]
    generate, reward = result["generate"], result["reward"]
    return {
        "generate": generate,
        "reward": reward,
        "reference": [p - g - r for p, g, r in zip(prepare, generate, reward, strict=True)],
        "train": [s - p for s, p in zip(seconds, prepare, strict=True)],
    }
