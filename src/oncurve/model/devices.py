"""Where a run computes: the device `run.device` names, a cap on its memory, what
`model.dtype: auto` means there; host values copied to it, and the host's own memory."""

from __future__ import annotations

import os

import torch

from oncurve.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str, what: str = "run.device") -> torch.device:
    """The device `name` (the setting `what`) names; `auto` is the GPU when torch sees one."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"{what} must be cpu, cuda, cuda:N or auto, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"{what}={name}, but this torch ({torch.__version__}) sees no CUDA device; "
            f"use {what}=cpu or auto"
        )
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise UserError(
                f"{what}={name}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
        torch.cuda.set_device(device)
    return device


def cap_gpu_memory(device: torch.device, gib: float) -> None:
    """Cap this process's allocations on `device` at `gib` GiB, as on a card of that size: the
    caching allocator raises out-of-memory beyond it."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)


def resolve_dtype(name: str, device: torch.device) -> str:
    """`model.dtype`: `auto` is bfloat16 on a CUDA device that computes in it, else float32."""
    if name != "auto":
        return name
    # a GPU before Ampere (T4, V100) only emulates bfloat16, which torch counts as support
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bfloat16"
    return "float32"


def host_to_device(
    values: list[int] | list[float], device: torch.device, dtype: torch.dtype = torch.long
) -> torch.Tensor:
    """`values` as a `dtype` tensor on `device`, in one copy; on CUDA from pinned memory and
    without waiting (a blocking copy there waits for every kernel queued before it)."""
    # on the host on purpose: the values are Python's, and this is their one copy to the device
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


# A container sees its own cgroup at /sys/fs/cgroup: v2's limit, then v1's.
CGROUP_MEMORY_LIMITS = (
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)


def host_memory_bytes() -> int:
    """The memory this process's host gives it, in bytes: the physical memory, or a
    container's cgroup limit where that is lower ("max" or none: no limit)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_MEMORY_LIMITS:
        try:
            with open(path) as file:
                limit = file.read().strip()
        except OSError:
            continue
        return min(physical, int(limit)) if limit.isdigit() else physical
    return physical
