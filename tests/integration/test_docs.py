"""The README and docs/ stay true to the code: the configuration page is the generated one,
every relative link resolves, and every `oncurve train` line shown names real settings."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers.paths import REPO

from oncurve.config import load_config
from oncurve.config.helptext import fields, reference_page

ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks/README.md"]


def test_the_configuration_page_is_the_generated_one():
    """`oncurve train --help-config markdown > docs/configuration.md` after a setting changes."""
    assert (ROOT / "docs/configuration.md").read_text() == reference_page()
    assert reference_page().count("\n| `") == len(fields())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def train_lines(text: str) -> list[str]:
    """The `oncurve train ...` commands of the page's shell blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            if command.startswith("oncurve train") and "--help-config" not in command:
                lines.append(command)
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_train_command_shown_names_real_settings(page: Path, monkeypatch):
    """Each override of each `oncurve train` line loads (a key that does not exist, or a value
    its field refuses, fails); config files named are the repository's own."""
    monkeypatch.chdir(ROOT)
    for command in train_lines(page.read_text()):
        words = shlex.split(command)[2:]
        config = next((w for w in words if w.endswith(".yaml") and "=" not in w), None)
        overrides = [w for w in words if "=" in w and not w.startswith("-")]
        if config is not None and not (ROOT / config).exists():
            continue  # a user's own file, e.g. `oncurve train my.yaml`
        try:
            load_config(config, overrides)
        except Exception as error:  # noqa: BLE001 - the message names the command
            raise AssertionError(f"{page.name}: {command}: {error}") from error


def test_the_readme_is_a_landing_page():
    """The README keeps its two set-up commands on its first screen and stays short."""
    text = (ROOT / "README.md").read_text()
    first_screen = "\n".join(text.splitlines()[:20])
    assert "make run" in first_screen and "make test" in first_screen
    assert len(text.splitlines()) <= 250


def test_every_module_has_its_test_file_or_a_pointer():
    """A module of src/oncurve has a `test_<module>.py` under tests/, or a row of
    tests/README.md naming the test file that covers it (which exists)."""
    tests = ROOT / "tests"
    own = {path.stem.removeprefix("test_") for path in tests.rglob("test_*.py")}
    rows = dict(
        re.findall(
            r"^\| `([\w/]+\.py)` \| `([\w/.]+)` \|$", (tests / "README.md").read_text(), re.M
        )
    )
    package = ROOT / "src" / "oncurve"
    for module in package.rglob("*.py"):
        if module.name in ("__init__.py", "__main__.py") or module.stem in own:
            continue
        name = str(module.relative_to(package))
        assert name in rows, f"{name} has no test_{module.stem}.py and no row in tests/README.md"
        assert (ROOT / rows[name]).is_file(), f"tests/README.md: {rows[name]} does not exist"
