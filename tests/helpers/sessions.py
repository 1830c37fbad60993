"""The sessions `trainer.train` builds, recorded for a test to look at after it returns."""

from __future__ import annotations

from typing import Any

import pytest

from oncurve.loop import trainer
from oncurve.loop.trainer import Session


def sessions_of(monkeypatch: pytest.MonkeyPatch) -> list[Session]:
    """The sessions `trainer.train` builds from now on (each `setup` call's result, its
    arguments passed through as they come)."""
    made: list[Session] = []
    real_setup = trainer.setup

    def recording(*args: Any, **kwargs: Any) -> Session:
        made.append(real_setup(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(trainer, "setup", recording)
    return made
