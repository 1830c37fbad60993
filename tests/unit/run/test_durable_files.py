"""Run files that a crash or a full disk cannot leave half-written."""

from __future__ import annotations

import os
import stat

import pytest

from oncurve.run import durable_files
from oncurve.run.durable_files import replace_text


def test_replace_text_replaces_the_file_whole_with_the_umasks_mode(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    umask = os.umask(0o022)
    try:
        replace_text(path, "run:\n  seed: 3\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]

    # a write that fails leaves the old file and no partial one
    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable_files, "fsync", fail)
    with pytest.raises(OSError, match="No space left"):
        replace_text(path, "run:\n  seed: 4\n")
    assert path.read_text() == "run:\n  seed: 3\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
