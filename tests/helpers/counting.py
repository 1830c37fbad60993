"""Counting what code does: the ops it dispatches, the rows each call of a method gets."""

from __future__ import annotations

import pytest
from torch.utils._python_dispatch import TorchDispatchMode


def rows_per_call(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """The rows (`args[1].shape[0]`, the input ids') of each call of `owner.name` from now on,
    the calls otherwise unchanged."""
    rows: list[int] = []
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        rows.append(args[1].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return rows


class OpCounter(TorchDispatchMode):
    """While active, counts the dispatched ops that are in `ops` (`count`)."""

    def __init__(self, ops: set) -> None:
        super().__init__()
        self.ops, self.count = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += func in self.ops
        return func(*args, **(kwargs or {}))
