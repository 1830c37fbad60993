"""Name -> function tables, one per kind; configs name entries by string (the config's
`choices` are these tables' names). A new variant is a function with its kind's signature,
registered where it is defined (`@registered(POLICY_LOSSES, "name")`), and its test.

The tables fill as the modules that define the entries are imported; `oncurve.algo` imports
all of them, so any import of this module through the package sees them whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from oncurve.errors import UserError

F = TypeVar("F", bound=Callable)

# fn(rewards [B*G], group_size, *, scale, eps, batch_std=None) -> [B*G]
ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}
# fn(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high, dual_clip) -> (loss, metrics)
POLICY_LOSSES: dict[str, Callable] = {}
# fn(per_token, mask, *, num_seqs, num_tokens, norm_len) -> scalar
AGGREGATIONS: dict[str, Callable] = {}
# fn(logprobs, ref_logprobs) -> [N, T]
KL_ESTIMATORS: dict[str, Callable] = {}
# fn(old_logprobs, sampler_logprobs, mask [N, T], *, cap) -> (weights [N, T], capped [N, T])
IS_CORRECTIONS: dict[str, Callable] = {}

TABLES: dict[str, dict[str, Callable]] = {
    "advantage estimator": ADVANTAGE_ESTIMATORS,
    "policy loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "KL estimator": KL_ESTIMATORS,
    "importance-sampling correction": IS_CORRECTIONS,
}


def registered(table: dict[str, Callable], name: str) -> Callable[[F], F]:
    """A decorator entering the function it decorates in `table` as `name`."""

    def enter(fn: F) -> F:
        if name in table:
            raise ValueError(f"{name!r} is registered twice")
        table[name] = fn
        return fn

    return enter


def lookup(table: str | Mapping[str, Callable], name: str) -> Callable:
    """The entry `name` of `table` (one of the dicts above, or its key in `TABLES`).

    Raises `UserError` (a ValueError), e.g. "unknown policy loss 'x'; choose one of: ...".
    """
    if isinstance(table, str):
        if table not in TABLES:
            raise ValueError(f"unknown registry {table!r}; choose one of: {', '.join(TABLES)}")
        kind, entries = table, TABLES[table]
    else:
        kind = next((k for k, t in TABLES.items() if t is table), "entry")
        entries = table
    if name not in entries:
        raise UserError(f"unknown {kind} {name!r}; choose one of: {', '.join(entries)}")
    return entries[name]
