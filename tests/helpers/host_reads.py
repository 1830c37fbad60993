"""What reads a device value on the host (on a GPU each read waits for every kernel queued
before it, and a CUDA graph capture forbids it): the ops and the tensor methods, and a count
of a function's reads."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.counting import OpCounter

aten = torch.ops.aten


# Each reads a device value on the host, or has an output shape that depends on data.
HOST_READS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.repeat_interleave.Tensor,
    aten.bincount.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.lift_fresh.default,
    aten.lift_fresh_copy.default,
    # under torch.use_deterministic_algorithms CUDA reroutes these through index_put with a
    # blocking host-to-device copy of its coordinates
    aten.scatter.src,
    aten.scatter_.src,
}


BANNED_METHODS = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
}


def host_reads_of(fn: Callable[[], object]) -> int:
    """How many times `fn()` reads a device value on the host (`HOST_READS` and
    `BANNED_METHODS`: `.tolist()`, `.item()`, `float(t)`, `torch.unique` and the like); on a GPU
    each one waits for every kernel queued before it."""
    from torch.overrides import TorchFunctionMode

    by_method = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}
    count = 0

    class Methods(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            nonlocal count
            count += func in BANNED_METHODS
            return func(*args, **(kwargs or {}))

    # and reads no method makes (a method's is counted above)
    with Methods(), OpCounter(HOST_READS - by_method) as ops:
        fn()
    return count + ops.count
