"""`oncurve train | eval | sample | warmstart | tasks export | models import | report`.

User errors (config, paths, data, reward import paths) print one line and exit 2; anything
else is a bug in oncurve and keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from oncurve.errors import CheckpointError, TrainingError, UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from oncurve.rollout import Sampler


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        # `train`'s overrides may come before, between or after its flags; argparse alone stops
        # filling a positional list at the first flag.
        args, extra = parser.parse_known_args(argv)
        if extra:
            if getattr(args, "run", None) is not _train or any(e.startswith("-") for e in extra):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            args.args = [*args.args, *extra]
        args.argv = sys.argv[1:] if argv is None else list(argv)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return args.run(args)
    except UserError as err:
        print(f"oncurve: error: {err}", file=sys.stderr)
        return 2
    except (CheckpointError, TrainingError) as err:
        print(f"oncurve: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a full disk, a read-only or missing directory: the file and why
        where = f"{err.filename}: " if err.filename else ""
        print(f"oncurve: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1


def _train(args: argparse.Namespace) -> int:
    from oncurve.config import describe, load_config
    from oncurve.config.helptext import reference_page

    if args.help_config:
        print(
            reference_page() if args.help_config == "markdown" else describe(),
            end="\n" if args.help_config == "text" else "",
        )
        return 0
    config_path, overrides = _split_config_args(args.args)
    config = load_config(config_path, overrides)
    if config.dist.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _launch_torchrun(config.dist.nproc, args.argv)
    from oncurve import distributed
    from oncurve.loop.progress import silence
    from oncurve.loop.trainer import train

    result = train(config, quiet=args.quiet)
    distributed.leave()
    summary = {"run_dir": str(result.run_dir), "steps": result.steps}
    if result.eval_before and result.eval_after:
        summary["accuracy_before"] = result.eval_before["accuracy"]
        summary["accuracy_after"] = result.eval_after["accuracy"]
    if os.environ.get("RANK", "0") == "0":  # one summary for a torchrun job
        try:
            print(json.dumps(summary), flush=True)
        except BrokenPipeError:  # `| head -0`: the run is complete, its summary unread
            silence(sys.stdout)
    return 0


# How long torchrun lets its ranks finish after it forwards a signal itself (one that reached
# it directly, as a scheduler that signals every process of a job does) before it kills them:
# a step and a checkpoint, not torchrun's 30 s.
_SHUTDOWN_TIMEOUT_S = 3600


def _launch_torchrun(nproc: int, argv: list[str]) -> int:
    """`oncurve train dist.nproc=N ...` is `torchrun --nproc-per-node N -m oncurve train ...`,
    supervised: SIGTERM, SIGINT, SIGHUP and SIGUSR1 to this launcher are forwarded to every
    rank (each stops at the end of its step with a checkpoint; a second signal aborts them),
    and the launcher waits for the job and exits with its status; after a forwarded signal a
    failed job exits 128 + that signal's number.

    torchrun runs in a session of its own, so that a terminal's Ctrl-C or hang-up reaches the
    ranks once, through this launcher. The launcher signals the ranks (torchrun's children)
    itself rather than torchrun: torchrun would signal each rank's whole process group (its
    reward worker too), kill the ranks after `--shutdown-timeout`, and exit 1 with a traceback
    however cleanly they stopped. A signal before the ranks exist goes to torchrun."""
    import signal

    from oncurve.run.stopping import STOP_SIGNALS

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        # a signal that reaches torchrun directly is forwarded too, never its default action
        "--signals-to-handle=" + ",".join(sig.name for sig in (*STOP_SIGNALS, signal.SIGQUIT)),
    ]
    if not {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT"} & os.environ.keys():
        command.append(f"--shutdown-timeout={_SHUTDOWN_TIMEOUT_S}")
    command += ["-m", "oncurve", *argv]
    forwarded: list[int] = []
    started: list[subprocess.Popen] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        for proc in started:
            for pid in _children(proc.pid) or [proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        started.append(subprocess.Popen(command, start_new_session=True))
        if forwarded:  # a signal came while torchrun was starting
            forward(forwarded.pop(), None)
        code = started[0].wait()  # a signal runs `forward`, and the wait goes on
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if code < 0:  # torchrun itself killed by a signal
        code = 128 - code
    if forwarded and code != 0:
        return 128 + forwarded[-1]
    return code


def _children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (Linux's /proc; none elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                stat = file.read()
        except OSError:
            continue
        # after the command's closing parenthesis: state, then the parent's pid
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def _eval(args: argparse.Namespace) -> int:
    from oncurve.config import Config
    from oncurve.data.prompts import PromptData
    from oncurve.loop.evaluate import evaluate
    from oncurve.rewards.answers import extract_answer
    from oncurve.rewards.registry import ANSWER_MATCH_REWARDS
    from oncurve.rewards.runner import runner_settings
    from oncurve.rollout.base import check_room

    config = _run_config(args)
    sampler, model = _load_sampler(args, config)
    data = _prompt_format(args, config, sampler.tokenizer)
    scorer, correct = _eval_scorer(args, config)
    rows = _eval_rows(args, config, data, needs_answer=correct in ANSWER_MATCH_REWARDS)
    rows = PromptData(rows, sampler.tokenizer, data, seed=0).rows
    longest = max(len(row["prompt_ids"]) for row in rows)
    check_room(longest, args.max_new_tokens, model.config, "--max-new-tokens")
    records: list[dict] = []
    result = evaluate(
        sampler,
        rows,
        correct,
        max_new_tokens=args.max_new_tokens,
        samples=args.samples,
        temperature=args.temperature,
        seed=args.seed,
        records=records,
        **runner_settings((config or Config()).reward),
    )
    if args.out:
        with open(args.out, "w") as out:
            for row, record in zip(rows, records, strict=True):
                line = {
                    "prompt": sampler.tokenizer.decode(row["prompt_ids"]),
                    "answer": row.get("answer"),
                    "extracted": extract_answer(record["greedy"]),
                    **record,
                }
                out.write(json.dumps(line) + "\n")
    prompts = {
        "chat_template": data.chat_template,
        "system_prompt": data.system_prompt,
        "prompt_template": data.prompt_template,
        "answer_format": data.answer_format,
    }
    print(json.dumps({"n": len(rows), **result, "scorer": scorer, "prompt_format": prompts}))
    return 0


def _eval_scorer(args: argparse.Namespace, config) -> tuple[str, Callable]:
    """(name, function) of the reward that decides correctness: `--reward`, else `--task`'s,
    else the run's (`--run`), else the built-in `correct` (answers read as data.answer_format
    says)."""
    from oncurve.data.prompts import correctness_fn
    from oncurve.data.tasks import get_task
    from oncurve.rewards.registry import BUILTINS, resolve_reward

    if args.reward:
        return resolve_reward(args.reward)
    if args.task:
        return f"{args.task} task's correct", get_task(args.task).reward_fns()["correct"]
    if config is None:
        return resolve_reward("correct")
    on_task = config.data.task and not config.data.path
    task = get_task(config.data.task, config.data.task_options) if on_task else None
    fn = correctness_fn(config, task)
    if task is not None and "correct" in task.reward_fns():
        return f"{config.data.task} task's correct", fn
    builtin = next((name for name, f in BUILTINS.items() if f == fn), None)
    return builtin or getattr(fn, "__name__", "the run's reward"), fn


def _eval_rows(args: argparse.Namespace, config, data, needs_answer: bool) -> list[dict]:
    """The prompts to score: `--data` (a file or a Hub id at `--config` and `--split`), else
    the run's eval.path, else the run's task's held-out problems."""
    from oncurve.data.prompts import eval_size, read_rows
    from oncurve.data.tasks import get_task

    if args.data is not None:
        return read_rows(args.data, data, args.split or "test", require_answer=needs_answer)
    if config is not None and config.eval.path:
        split = args.split or config.eval.split
        return read_rows(config.eval.path, data, split, require_answer=needs_answer)
    if config is not None and config.data.task and config.data.path is None:
        task = get_task(config.data.task, config.data.task_options)
        return task.examples("test", eval_size(config), config.run.seed)
    raise UserError(
        "--data is required (with --run, unless the run has an eval.path or trained on a task)"
    )


def _sample(args: argparse.Namespace) -> int:
    from oncurve.data.prompts import encode_prompt
    from oncurve.rollout import SamplingParams
    from oncurve.rollout.base import check_room

    config = _run_config(args)
    sampler, model = _load_sampler(args, config)
    data = _prompt_format(args, config, sampler.tokenizer)
    ids = encode_prompt(sampler.tokenizer, args.prompt, data, "--prompt")
    check_room(len(ids), args.max_new_tokens, model.config, "--max-new-tokens")
    params = SamplingParams(args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    batch = sampler.generate_ids([ids], args.n, params)
    for text, reason in zip(batch.texts, batch.finish_reasons, strict=True):
        print(json.dumps({"completion": text, "finish_reason": reason}))
    return 0


def _run_config(args: argparse.Namespace):
    """The resolved config of `--run RUN_DIR` (None without it); fills in `--model` (the run's
    final model) and `--max-new-tokens` (its rollout.max_new_tokens; without a run, the
    default of a run of `--model`) when they are not given."""
    from oncurve.config import build_config, load_config
    from oncurve.model.saving import missing_from_final

    if args.run_dir is None:
        if args.model is None:
            raise UserError("--model or --run is required")
        # the run a config would make of this model: 64 for the bundled one, else 256
        default = build_config({"model": {"path": args.model}}).rollout.max_new_tokens
        args.max_new_tokens = args.max_new_tokens or default
        return None
    path = Path(args.run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"--run {args.run_dir}: no config.yaml (not a run directory)")
    config = load_config(path)
    if args.model is None:
        final = Path(args.run_dir) / "final"
        if not final.exists():
            raise UserError(f"--run {args.run_dir}: no final/ model yet (the run has not finished)")
        missing = missing_from_final(final)
        if missing:
            raise UserError(
                f"--run {args.run_dir}: final/ is incomplete ({missing}; its save was cut "
                f"short): write it again with oncurve train run.resume=auto run.dir={args.run_dir}"
            )
        args.model = str(final)
    args.max_new_tokens = args.max_new_tokens or config.rollout.max_new_tokens
    return config


def _prompt_format(args: argparse.Namespace, config, tokenizer):
    """How prompts are formatted and answers read, as training does: the run's data settings
    under `--run`, else the defaults with the chat template when the tokenizer has one; the
    flags (`--chat-template`, `--system-prompt`, `--prompt-field`, ...) override either."""
    from oncurve.config import DataConfig

    data = config.data if config is not None else DataConfig()
    chat = args.chat_template
    if chat is None:
        chat = data.chat_template if config is not None else bool(tokenizer.chat_template)
    if chat and not tokenizer.chat_template:
        raise UserError("--chat-template: the tokenizer has no chat template")
    system = args.system_prompt if args.system_prompt is not None else data.system_prompt
    # `oncurve eval`'s data flags; `oncurve sample` has none
    given = {
        key: getattr(args, key)
        for key in ("prompt_field", "answer_field", "answer_format", "prompt_template", "config")
        if getattr(args, key, None) is not None
    }
    return dataclasses.replace(data, chat_template=chat, system_prompt=system, **given)


def _warmstart(args: argparse.Namespace) -> int:
    from oncurve.warmstart import warmstart

    warmstart(Path(args.out), steps=args.steps, seed=args.seed)
    return 0


def _export(args: argparse.Namespace) -> int:
    from oncurve.data.tasks import get_task

    task = get_task(args.name)
    try:
        rows = task.examples(args.split, args.n, args.seed)
    except UserError:
        raise
    except ValueError as err:  # a finite split asked for more problems than it has
        raise UserError(f"-n {args.n}: {err}") from None
    lines = "".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in rows)
    if args.output:
        Path(args.output).write_text(lines)
    else:
        sys.stdout.write(lines)
    return 0


def _import_model(args: argparse.Namespace) -> int:
    from oncurve.model.sources import import_gguf

    print(import_gguf(args.file, args.out, args.dtype))
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        from oncurve.report import write_report
    except ModuleNotFoundError as missing:
        if missing.name is None or missing.name.split(".")[0] != "matplotlib":
            raise
        raise UserError(
            "oncurve report draws with matplotlib: pip install 'oncurve[report]'"
        ) from None

    path = write_report([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None)
    print(path)
    return 0


def _load_sampler(args: argparse.Namespace, config=None) -> tuple[Sampler, PreTrainedModel]:
    """The `--backend` sampler of the `--model` model (a run's `config`: its tokenizer's
    remote-code setting), and the model."""
    from oncurve.model.devices import resolve_device, resolve_dtype
    from oncurve.model.sources import load_model, load_tokenizer, resolve_model_path
    from oncurve.rollout import build_sampler

    path = resolve_model_path(args.model, args.revision, what="--model")
    if config is not None:
        args.trust_remote_code = args.trust_remote_code or config.model.trust_remote_code
    tokenizer = load_tokenizer(path, args.trust_remote_code)
    device = resolve_device(args.device, what="--device")
    dtype = resolve_dtype(args.dtype, device)
    model = load_model(path, dtype, device, trust_remote_code=args.trust_remote_code)
    return build_sampler(args.backend, model, tokenizer, name="--backend"), model


def _split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """The first argument may be a YAML file; every other one is a key=value override."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    for item in items:
        if "=" not in item:
            raise UserError(f"argument {item!r} must be key=value (only the first may be a file)")
    return None, items


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are UserErrors: one line and exit 2, as every other
    bad input (argparse prints its usage block first)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")


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
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be at least 0 (0 is greedy), got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
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
    train.set_defaults(run=_train)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--model",
            help="model directory, Hugging Face Hub id (owner/name), .gguf file, or `default`; "
            "with --run, the run's final/ model by default",
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
        p.add_argument("--system-prompt", help="system message before each prompt")
        p.add_argument(
            "--max-new-tokens",
            type=_at_least(1),
            help="default: the run's rollout.max_new_tokens, else a run's default for the model "
            "(64 for `default`, else 256)",
        )
        p.add_argument("--temperature", type=_temperature, default=1.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--trust-remote-code", action="store_true")
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
        "--split", help="split of a Hub dataset (default: the run's eval.split, else test)"
    )
    ev.add_argument("--prompt-field", help="column of the prompt (default: the run's, or prompt)")
    ev.add_argument("--answer-field", help="column of the answer (default: the run's, or answer)")
    ev.add_argument(
        "--answer-format",
        choices=("auto", "raw", "gsm8k", "boxed", "last_number"),
        help="how the answer is read off its column, as data.answer_format (default: the run's, "
        "or auto)",
    )
    ev.add_argument(
        "--prompt-template",
        help="the prompt as a format string over the columns, as data.prompt_template",
    )
    ev.add_argument("--samples", type=_at_least(1), default=1, help="K completions per prompt")
    ev.add_argument(
        "--reward",
        help="reward that decides correctness: a built-in name or module:function (default: the "
        "run's, else `correct`, which compares the extracted answer with the answer column)",
    )
    ev.add_argument("--task", help="score with a built-in task's own `correct` reward instead")
    ev.add_argument(
        "--out", help="write one JSON row per prompt: prompt as formatted, completions, scores"
    )
    ev.set_defaults(run=_eval)

    sample = commands.add_parser("sample", help="print completions of one prompt")
    model_args(sample)
    sample.add_argument("--prompt", required=True)
    sample.add_argument("-n", type=_at_least(1), default=4, help="completions to sample")
    sample.set_defaults(run=_sample)

    warm = commands.add_parser("warmstart", help="the supervised recipe of the bundled model")
    warm.add_argument("--out", required=True)
    warm.add_argument("--steps", type=_at_least(1), default=None)
    warm.add_argument("--seed", type=int, default=0)
    warm.set_defaults(run=_warmstart)

    tasks = commands.add_parser("tasks", help="built-in tasks").add_subparsers(required=True)
    export = tasks.add_parser("export", help="write a task's prompts and answers as JSONL")
    export.add_argument("name")
    export.add_argument("--split", choices=("train", "test"), default="test")
    export.add_argument("--seed", type=int, default=0)
    export.add_argument("-n", type=_at_least(1), default=500)
    export.add_argument("-o", "--output")
    export.set_defaults(run=_export)

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
    imp.set_defaults(run=_import_model)

    report = commands.add_parser("report", help="plots and an HTML page of one or more runs")
    report.add_argument("run_dirs", nargs="+")
    report.add_argument("--out")
    report.set_defaults(run=_report)
    return parser


if __name__ == "__main__":
    sys.exit(main())
