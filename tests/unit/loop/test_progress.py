"""The progress display: a live bar on stderr when stderr is a terminal (stdout stays the
summary's), log lines otherwise; a figure the step did not compute is left out."""

from __future__ import annotations

import io
import sys

import pytest

from oncurve.loop.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_stderr_and_stdout_stays_clean(monkeypatch):
    err, out = Terminal(), Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    with Progress(total=3) as progress:
        for step in (1, 2, 3):
            progress.update(step, {"reward/mean": 0.25, "length/mean": 4.0, "time/step": 0.5})
    assert out.getvalue() == ""
    assert "3/3" in err.getvalue() and "reward 0.250" in err.getvalue()


@pytest.mark.parametrize(("metrics", "shown"), [({"kl": 0.125}, True), ({}, False)])
def test_kl_is_shown_only_when_the_step_computed_it(monkeypatch, metrics, shown):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress(total=1) as progress:
        progress.update(1, {"reward/mean": 0.5, **metrics})
    assert ("kl 0.1250" in err.getvalue()) is shown
    assert ("kl" in err.getvalue()) is shown
