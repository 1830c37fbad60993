"""What a GPU machine without internet access lacks, prepared where ../shared and PyPI are
(`make gpu-bundle`): the Qwen3 tokenizer and TRL's wheels in `checkout.GPU_BUNDLE`, which the
device tool carries and the scripts use when present."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

from harness.checkout import GPU_BUNDLE, ROOT

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
TRL_MISSING = (
    "TRL is not importable and benchmarks/.gpu-bundle has no wheels: run `make gpu-bundle` "
    "where PyPI is reachable and carry benchmarks/.gpu-bundle"
)


def trl_at_hand() -> bool:
    """Whether this interpreter imports TRL or the bundle holds its wheels."""
    wheels = list((GPU_BUNDLE / "wheels").glob("trl-*.whl"))
    return importlib.util.find_spec("trl") is not None or bool(wheels)


def prepare() -> int:
    """Fill `GPU_BUNDLE` with the Qwen3 tokenizer and TRL's wheels, print its and the working
    tree's size against what the device tool carries; exit status 2 without the tokenizer."""
    from harness.models import SHARED_TOKENIZER, copy_files

    if not (SHARED_TOKENIZER / "tokenizer.json").is_file():
        print(f"error: no Qwen3 tokenizer at {SHARED_TOKENIZER}", file=sys.stderr)
        return 2
    shutil.rmtree(GPU_BUNDLE, ignore_errors=True)
    copy_files(SHARED_TOKENIZER, GPU_BUNDLE / "tokenizer")
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--python-version", GPU_PYTHON, "--implementation", "cp", "--platform",
                "manylinux2014_x86_64", "-d", str(GPU_BUNDLE / "wheels"), *TRL_WHEELS]  # fmt: skip
    subprocess.run(download, check=True)
    size = sum(p.stat().st_size for p in GPU_BUNDLE.rglob("*") if p.is_file())
    git = ["git", "ls-files", "-co", "--exclude-standard", "-z"]
    listed = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tree = sum(p.stat().st_size for p in (ROOT / n for n in listed.split("\0")) if p.is_file())
    print(
        f"{GPU_BUNDLE.relative_to(ROOT)}: {size / 2**20:.1f} MiB (tokenizer and "
        f"{len(TRL_WHEELS)} wheels); with the working tree ({tree / 2**20:.1f} MiB) "
        f"{(size + tree) / 2**20:.1f} of the {CARRY_LIMIT / 2**20:.0f} MiB a device call carries"
    )
    if size + tree > CARRY_LIMIT:
        print("warning: too big to carry; carry benchmarks/.gpu-bundle/tokenizer alone")
    return 0
