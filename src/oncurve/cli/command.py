"""`oncurve train | eval | sample | warmstart | tasks export | models import | report`.

User errors (config, paths, data, reward import paths) print one line and exit 2; anything
else is a bug in oncurve and keeps its traceback (exit 1).

The parser and `main`; each command's work is in its own module of this package.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from oncurve.cli.evaluate import eval_command
from oncurve.cli.sample import sample_command
from oncurve.cli.tools import (
    export_command,
    import_model_command,
    report_command,
    warmstart_command,
)
from oncurve.cli.train import report_error, train_command
from oncurve.data.files import first_surrogate
from oncurve.errors import CheckpointError, TrainingError, UserError


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        # `train`'s overrides may come before, between or after its flags; argparse alone stops
        # filling a positional list at the first flag.
        args, extra = parser.parse_known_args(argv)
        if extra:
            if getattr(args, "run", None) is not train_command or any(
                e.startswith("-") for e in extra
            ):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            args.args = [*args.args, *extra]
        args.argv = sys.argv[1:] if argv is None else list(argv)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return args.run(args)
    except UserError as err:
        return report_error(f"oncurve: error: {err}", 2)
    except KeyboardInterrupt:  # outside a run, which takes signals over: imports, eval, report
        return report_error("oncurve: stopped on request (an interrupt)", 130)
    except (CheckpointError, TrainingError) as err:
        return report_error(f"oncurve: error: {err}", 1)
    except OSError as err:  # a full disk, a read-only or missing directory: the file and why
        where = f"{err.filename}: " if err.filename else ""
        return report_error(f"oncurve: error: {where}{err.strerror or err}", 1)
    except RuntimeError as err:  # on a rank of a job whose peer failed: one line, not a trace
        from oncurve.distributed import collective_failure

        line = collective_failure(err)
        if line is None:
            raise
        return report_error(f"oncurve: error: {line}", 1)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are UserErrors: one line and exit 2, as every other
    bad input (argparse prints its usage block first)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")


def _seed(text: str) -> int:
    """An argparse type: a seed, as run.seed takes it (0 to 2**63 - 1)."""
    value = _at_least(0)(text)
    if value > 2**63 - 1:
        raise argparse.ArgumentTypeError(f"must be at most 2**63 - 1, got {value}")
    return value


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _temperature(text: str) -> float:
    """An argparse type: a sampling temperature, finite and at least 0 (0 is greedy), as
    rollout.temperature takes it (which refuses inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be at least 0 (0 is greedy), got {text}")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _fraction(low_open: bool) -> Callable[[str], float]:
    """An argparse type: a number in (0, 1] when `low_open`, else in [0, 1]."""
    interval = "(0, 1]" if low_open else "[0, 1]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (0 < value <= 1 if low_open else 0 <= value <= 1):  # NaN too
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value

    return parse


def _text(text: str) -> str:
    """An argparse type: text to tokenize or look up (a prompt, a column), which a surrogate
    is not: Python gives one for each byte of the command line that is no UTF-8."""
    found = first_surrogate(text)
    if found:
        raise argparse.ArgumentTypeError(
            f"holds a surrogate \\u{ord(found):04x} (an undecodable byte), which is no Unicode "
            "character"
        )
    return text


def _new_file(text: str) -> str:
    """An argparse type: a file to write that does not exist yet, in a directory that does
    (checked before the command's work; an existing file is never overwritten)."""
    path = Path(text).expanduser()
    if path.exists():
        raise argparse.ArgumentTypeError(f"{text} exists; name a new file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no directory {path.parent} to write {path.name} in")
    return str(path)  # `~` expanded, as checked


def _new_directory(text: str) -> str:
    """An argparse type: a directory to write that does not exist yet or is empty (a file in
    its path is the command's own one-line error, `warmstart`'s before it trains)."""
    path = Path(text).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise argparse.ArgumentTypeError(f"{text} is not an empty directory; name a new one")
    return str(path)  # `~` expanded, as checked


def build_parser() -> argparse.ArgumentParser:
    """The `oncurve` command line: one subcommand each, whose `run` default handles it."""
    parser = _Parser(prog="oncurve", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train with GRPO (no arguments: the default job)")
    train.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    train.add_argument("--quiet", action="store_true", help="log lines instead of a progress bar")
    train.add_argument(
        "--help-config",
        nargs="?",
        const="text",
        choices=("text", "markdown"),
        help="list every config key (markdown: as the page docs/configuration.md)",
    )
    train.set_defaults(run=train_command)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            help="model directory, Hugging Face Hub id (owner/name), .gguf file, `default`, or a "
            "run's checkpoint (RUN/checkpoints/step-N: its run's settings with it); with --run, "
            "the run's final/ model by default",
        )
        p.add_argument(
            "--run",
            dest="run_dir",
            metavar="RUN_DIR",
            help="a run directory: its final model and its prompt format, answer reward and "
            "rollout.max_new_tokens",
        )
        p.add_argument("--revision", help="Hub branch, tag or commit of a Hub id (default main)")
        p.add_argument(
            "--chat-template",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="format prompts with the tokenizer's chat template (default: the run's setting, "
            "else whether the tokenizer has one)",
        )
        p.add_argument("--system-prompt", type=_text, help="system message before each prompt")
        p.add_argument(
            "--max-new-tokens",
            type=_at_least(1),
            help="default: the run's rollout.max_new_tokens, else the model directory's "
            "generation_config.json (a run's final/ states what it trained with), else a run's "
            "default for the model (64 for `default`, else 256); a default that does not fit "
            "the model is shortened, said in one line, and a value given that does not is an "
            "error",
        )
        p.add_argument(
            "--temperature",
            type=_temperature,
            help="0 is greedy; default: as --max-new-tokens, else 1",
        )
        p.add_argument(
            "--top-p",
            type=_fraction(low_open=True),
            help="nucleus mass (default: as --temperature)",
        )
        p.add_argument("--top-k", type=_at_least(0), help="keep the k most likely; 0 keeps all")
        p.add_argument(
            "--min-p", type=_fraction(low_open=False), help="drop tokens below min_p x the top one"
        )
        p.add_argument("--seed", type=_seed, help="default: the run's run.seed, else 0")
        p.add_argument(
            "--trust-remote-code",
            action="store_true",
            help="run the Python code the model ships (auto_map), for code you trust; a run's "
            "model.trust_remote_code does not carry over (off without this flag)",
        )
        p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (as run.device)")
        p.add_argument(
            "--dtype",
            default="auto",
            choices=("auto", "float32", "bfloat16"),
            help="auto: bfloat16 on a GPU that computes in it (Ampere or later), else float32 "
            "(as model.dtype)",
        )
        p.add_argument(
            "--backend",
            default="auto",
            help="sampler backend: auto, hf, cpu_llama or cuda_graph (as rollout.backend)",
        )

    ev = commands.add_parser(
        "eval", help="accuracy, mean@K and pass@K on a dataset file or Hub dataset"
    )
    model_args(ev)
    ev.add_argument(
        "--data",
        help="JSONL/CSV/Parquet file, saved dataset dir or Hub dataset id (owner/name); with "
        "--run, the run's eval.path, else its task's held-out problems, by default",
    )
    ev.add_argument("--config", help="config name of a Hub dataset (default: the run's)")
    ev.add_argument(
        "--split",
        help="split of a Hub dataset or saved DatasetDict (default: test; with --run and no "
        "--data, the run's eval.split)",
    )
    ev.add_argument(
        "--prompt-field", type=_text, help="column of the prompt (default: the run's, or prompt)"
    )
    ev.add_argument(
        "--answer-field", type=_text, help="column of the answer (default: the run's, or answer)"
    )
    ev.add_argument(
        "--answer-format",
        choices=("auto", "raw", "gsm8k", "boxed", "last_number"),
        help="how the answer is read off its column, as data.answer_format (default: the run's, "
        "or auto)",
    )
    ev.add_argument(
        "--prompt-template",
        type=_text,
        help="the prompt as a format string over the columns, as data.prompt_template",
    )
    ev.add_argument(
        "--samples",
        type=_at_least(1),
        help="K completions per prompt for mean@K and pass@K, drawn at --temperature (accuracy "
        "is greedy); default: the run's eval.samples, else 1",
    )
    ev.add_argument(
        "--reward",
        help="reward that decides correctness: a built-in name or module:function (default: the "
        "run's, else `correct`, which compares the extracted answer with the answer column)",
    )
    ev.add_argument("--task", help="score with a built-in task's own `correct` reward instead")
    ev.add_argument(
        "--out",
        type=_new_file,
        help="write one JSON row per prompt to this new file: prompt as formatted, completions, "
        "scores",
    )
    ev.set_defaults(run=eval_command)

    sample = commands.add_parser("sample", help="print completions of one prompt")
    model_args(sample)
    sample.add_argument("--prompt", required=True, type=_text)
    sample.add_argument("-n", type=_at_least(1), default=4, help="completions to sample")
    sample.set_defaults(run=sample_command)

    warm = commands.add_parser(
        "warmstart",
        help="the supervised recipe of the bundled model",
        description="The supervised recipe of the bundled model. Train its output with the "
        "bundled model's settings: oncurve train model.path=DIR rollout.max_new_tokens=64 "
        "optim.lr=1e-4 eval.num_prompts=500",
    )
    warm.add_argument("--out", required=True, type=_new_directory, help="new (or empty) directory")
    warm.add_argument("--steps", type=_at_least(1), default=None)
    warm.add_argument("--seed", type=_seed, default=0)
    warm.set_defaults(run=warmstart_command)

    tasks = commands.add_parser("tasks", help="built-in tasks").add_subparsers(required=True)
    export = tasks.add_parser("export", help="write a task's prompts and answers as JSONL")
    export.add_argument("name")
    export.add_argument("--split", choices=("train", "test"), default="test")
    export.add_argument("--seed", type=_seed, default=0)
    export.add_argument(
        "-n", type=_at_least(1), help="rows (default: 500, or the whole split where it has fewer)"
    )
    export.add_argument("-o", "--output", type=_new_file, help="a new file (default: stdout)")
    export.set_defaults(run=export_command)

    models = commands.add_parser("models", help="model files").add_subparsers(required=True)
    imp = models.add_parser("import", help="write a GGUF file as a safetensors model directory")
    imp.add_argument("file", metavar="FILE.gguf")
    imp.add_argument("--out", required=True, help="new (or empty) directory to write")
    imp.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="weights dtype; float32 holds the dequantized weights exactly",
    )
    imp.set_defaults(run=import_model_command)

    report = commands.add_parser("report", help="plots and an HTML page of one or more runs")
    report.add_argument("run_dirs", nargs="+")
    report.add_argument(
        "--out",
        help="directory for the figures and report.html (default: RUN/report for one run, "
        "./report for several); it may hold a report's files only beside that report's page",
    )
    report.set_defaults(run=report_command)
    return parser


if __name__ == "__main__":
    sys.exit(main())
