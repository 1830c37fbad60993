"""Deterministic kernels for bit-exact resume (`run.deterministic`): torch's deterministic
mode for a run, strict inside the update's forwards and backwards, warn-only once an op
without a deterministic kernel is met."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class NondeterministicOp(RuntimeError):
    """An op of a strict microbatch (`strictly_deterministic`) has no deterministic kernel;
    the microbatches after it run in warn-only mode."""


# Whether `strictly_deterministic` is strict: until an op without a deterministic kernel is
# met, in each `deterministic_kernels` span (one run).
_strict = [True]


@contextmanager
def deterministic_kernels(enabled: bool) -> Iterator[None]:
    """Deterministic kernels for the duration, then torch's previous settings. Atomic-add
    kernels (attention's backward, scatters) sum in a varying order on CUDA, and cuBLAS needs a
    fixed workspace, set before its first call in the process, to repeat its sums.

    Without filling uninitialised memory: deterministic mode otherwise writes NaN into every
    tensor made by `empty` (on CUDA, most ops' outputs and their backward's buffers too: a
    kernel each, thousands a step), which only makes a read of memory never written repeat;
    what a step computes never reads such memory (NaN would reach its results)."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
        _strict[0] = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.utils.deterministic.fill_uninitialized_memory = previous[2]


@contextmanager
def strictly_deterministic() -> Iterator[None]:
    """Inside `deterministic_kernels`, a microbatch's forward and backward whose kernels are
    all deterministic: warn-only mode lets the memory-efficient attention's backward (what
    SDPA runs with a padding mask) split the keys and add the splits with atomics, so two
    runs' gradients differ in the last bits; strict mode makes it sum in one order. The
    forward is strict too: with gradient checkpointing the backward runs it again, and a
    compiled layer's code is specialised to the mode it ran under, so a forward in another
    mode than its recomputation would compile each layer's code twice. An op that has no
    deterministic kernel then raises `NondeterministicOp`, after one warning line: the caller
    redoes its microbatches, and this run's later ones are warn-only (a resumed run may then
    differ in the last bits, as before). Outside deterministic mode (the CPU,
    `run.deterministic=false`), nothing changes.
    """
    if not (
        _strict[0]
        and torch.are_deterministic_algorithms_enabled()
        and torch.is_deterministic_algorithms_warn_only_enabled()
    ):
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    except RuntimeError as error:
        if "deterministic" not in str(error):
            raise
        _strict[0] = False
        op = str(error).strip().splitlines()[0].split(", but you set")[0]
        print(
            f"warning: run.deterministic: {op}; the update goes on with torch's warn-only "
            "deterministic mode, so a resumed run may differ from an uninterrupted one in the "
            "last bits",
            file=sys.stderr,
        )
        raise NondeterministicOp(op) from error
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)
