"""`harness.checkout.commit`: the commit a record names, dirty only when code differs."""

from __future__ import annotations

import subprocess

from harness import checkout


def test_a_record_is_dirty_when_code_differs_not_when_a_run_wrote_its_results(
    monkeypatch, tmp_path
):
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True)
        return done.stdout.strip()

    for path in ("src/a.py", "benchmarks/spec.py", "benchmarks/results/page.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    monkeypatch.setattr(checkout, "ROOT", tmp_path)
    head = git("rev-parse", "--short", "HEAD")
    (tmp_path / "benchmarks/results/page.md").write_text("2\n")  # a figure the run wrote
    assert checkout.commit() == head
    for path in ("benchmarks/spec.py", "src/a.py"):
        (tmp_path / path).write_text("2\n")
        assert checkout.commit() == f"{head}+dirty"
        (tmp_path / path).write_text("1\n")
