"""`oncurve train --help-config`: every field with its default and help text."""

from __future__ import annotations

import dataclasses
import typing

from oncurve.config.sections import Config


def describe() -> str:
    """Every field with its default and help text, one per line."""
    lines = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = f"{prefix}{f.name}"
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, name + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines.append(f"{name} = {default!r}  # {f.metadata.get('help', '')}")
            item = typing.get_args(hint)
            if item and dataclasses.is_dataclass(item[0]):  # the keys of each list entry
                walk(item[0], f"{name}[].")

    walk(Config, "")
    return "\n".join(lines)
