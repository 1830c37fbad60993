"""The README and docs/ stay true to the code: the configuration page is the generated one,
every relative link resolves, every `oncurve train` line shown names real settings, and every
command a page shows is run here, in order in a scratch directory (training shortened), or, where
it needs what a test cannot have, parsed and pointed at the test that runs its kind."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers.paths import REPO

from oncurve.cli import main
from oncurve.cli.command import build_parser
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


def shown_commands(text: str) -> list[str]:
    """The commands of the page's shell blocks: continuation lines joined, comments and runs of
    spaces dropped."""
    lines = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = " ".join(command.split("  #")[0].split())
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def train_lines(text: str) -> list[str]:
    """The `oncurve train ...` commands of the page's shell blocks."""
    return [
        command
        for command in shown_commands(text)
        if command.startswith("oncurve train") and "--help-config" not in command
    ]


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


# The README's commands, in the order they depend on each other, run as shown in one scratch
# directory; a training command gets SHORT after its own settings.
RUN_HERE = (
    "oncurve tasks export arith --split test --seed 1 -n 100 -o test.jsonl",
    "oncurve train run.dir=runs/a run.resume=auto",
    "oncurve eval --model runs/a/final --data test.jsonl --samples 4",
    "oncurve eval --run runs/a --data test.jsonl --out rows.jsonl",
    'oncurve sample --model runs/a/final --prompt "0012+0034=" -n 4',
    'oncurve sample --model runs/a/checkpoints/latest --prompt "0012+0034="',
    "oncurve train configs/dapo.yaml rollout.group_size=16 run.dir=runs/b",
    "oncurve report runs/a runs/b",
    "oncurve train --help-config",
)
SHORT = ["run.steps=1", "eval.at_start_end=false", "run.preflight=false", "data.prompts_per_step=2"]
# what a preset's settings need besides SHORT's: DAPO's 4 minibatches take 4 prompts a step, and
# 2 keep its update off-policy on SHORT's 2
SHORT_FOR = {"configs/dapo.yaml": ["algo.minibatches=2"]}

# What a test cannot run as shown: a command's start -> (why, the test that runs its kind).
PARSED_ONLY = {
    "oncurve eval --model Qwen/": ("a Hub model and dataset", "integration/test_eval_cli.py"),
    "oncurve train dist.nproc=4": ("four ranks (two run)", "integration/test_distributed.py"),
    "oncurve warmstart": ("minutes of steps (fewer run)", "unit/test_warmstart.py"),
    "oncurve models import": ("a GGUF download (one is written)", "unit/model/test_models.py"),
    "oncurve train data.task=sums": ("SmolLM2 (`make smollm2`)", "unit/rollout/test_episodes.py"),
    "oncurve train rollout.env=my_package": ("a user's module", "unit/rollout/test_episodes.py"),
    "oncurve train rollout.env=textarena:": ("SmolLM2 on a game", "unit/envs/test_libraries.py"),
    "oncurve train rollout.env=gem:": ("SmolLM2 on a game", "unit/envs/test_libraries.py"),
    "oncurve train rollout.env=harness:my": ("a user's module", "unit/rollout/test_harness.py"),
    "oncurve train rollout.env=openenv:": ("a running server", "unit/envs/test_openenv.py"),
    "oncurve train rollout.env=verifiers:": (
        "a user's package",
        "unit/envs/test_verifiers_envs.py",
    ),
    "pip install 'oncurve[": ("installs an extra", "unit/envs/test_libraries.py"),
    "oncurve train configs/gsm8k_qwen2.5_0.5b.yaml": ("a 0.5B model on a GPU", "gpu/test_gpu.py"),
    "oncurve train CONFIG.yaml": ("eight GPUs", "integration/test_distributed.py"),
    "torchrun ": ("several processes or nodes", "integration/test_distributed.py"),
    "sudo apt-get install ": ("installs a system package", "integration/test_report_browser.py"),
}


@pytest.mark.parametrize("page", PAGES[:-1], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_is_run_here_or_parsed(page: Path):
    """A command a page shows is one RUN_HERE runs, a `make` target the Makefile has, or one
    PARSED_ONLY names, whose arguments the command line accepts."""
    for command in shown_commands(page.read_text()):
        if command in RUN_HERE:
            continue
        if command.startswith("make "):
            dry_run = subprocess.run(["make", "-n", *command.split()[1:]], cwd=ROOT, text=True,
                                     capture_output=True)  # fmt: skip
            assert dry_run.returncode == 0, f"{page.name}: {command}: {dry_run.stderr}"
            continue
        known = [where for start, where in PARSED_ONLY.items() if command.startswith(start)]
        assert known, f"{page.name}: {command}: add it to RUN_HERE or PARSED_ONLY"
        assert (ROOT / "tests" / known[0][1]).is_file(), known[0]
        if command.startswith("oncurve "):
            build_parser().parse_known_args(shlex.split(command)[1:])


def test_the_readme_commands_run_as_shown(tmp_path, monkeypatch, capsys):
    """Export held-out problems, train the bundled model into runs/a, evaluate and sample its
    final model (whose 64 trained new tokens fit the model's 256 positions) and its latest
    checkpoint, a DAPO run into runs/b, and a report of both: each exits 0 and writes what the
    README says."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    printed = {}
    for command in RUN_HERE:
        argv = shlex.split(command)[1:]
        if argv[0] == "train" and "--help-config" not in argv:
            argv += SHORT + SHORT_FOR.get(argv[1], [])
        assert main(argv) == 0, f"{command}: {capsys.readouterr().err[-2000:]}"
        out, err = capsys.readouterr()
        assert "does not fit" not in err, f"{command}: {err}"
        printed[command] = out.splitlines()
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 100
    model_eval = json.loads(printed[RUN_HERE[2]][-1])
    assert model_eval["n"] == 100 and {"accuracy", "mean@4", "pass@4"} <= model_eval.keys()
    assert json.loads(printed[RUN_HERE[3]][-1])["scorer"] == "arith task's correct"
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 100
    assert len(printed[RUN_HERE[4]]) == 4
    dapo = load_config(tmp_path / "runs/b/config.yaml")
    assert (dapo.algo.loss_agg, dapo.rollout.group_size) == ("token-mean", 16)
    assert (dapo.algo.minibatches, dapo.reward.overlong_buffer) == (2, 13)  # 20% of 64 tokens
    assert len(printed[RUN_HERE[5]]) == 4  # -n 4 by default
    assert Path(printed[RUN_HERE[7]][-1]).is_file()
    assert "rollout.max_new_tokens" in "\n".join(printed[RUN_HERE[8]])
