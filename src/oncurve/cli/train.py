"""`oncurve train`: a run in this process, or `dist.nproc` ranks under a supervised torchrun."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from oncurve.cli.common import print_out
from oncurve.errors import UserError

if TYPE_CHECKING:
    from oncurve.config import Config

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def train_command(args: argparse.Namespace) -> int:
    from oncurve.config import describe, load_config
    from oncurve.config.helptext import reference_page

    if args.help_config:
        text = reference_page() if args.help_config == "markdown" else describe()
        print_out(text, end="\n" if args.help_config == "text" else "")
        return 0
    config_path, overrides = _split_config_args(args.args)
    config = load_config(config_path, overrides)
    if config.dist.nproc > 1 and "WORLD_SIZE" not in os.environ:
        _check_resumed_ranks(config)
        return _launch_torchrun(config.dist.nproc, args.argv)
    from oncurve import distributed
    from oncurve.loop.trainer import train
    from oncurve.run.metrics import json_value

    result = train(config, quiet=args.quiet)
    distributed.leave()
    summary = {"run_dir": str(result.run_dir), "steps": result.steps}
    if not result.completed:  # a signal stopped it: resume it with run.resume=auto
        summary["stopped"] = True
    # each evaluation this process ran (a resumed run's start was evaluated before)
    if result.eval_before:
        summary["accuracy_before"] = result.eval_before["accuracy"]
    if result.eval_after:
        summary["accuracy_after"] = result.eval_after["accuracy"]
    if os.environ.get("RANK", "0") == "0":  # one summary for a torchrun job
        print_out(json.dumps(json_value(summary)))
    return 0


# Where a rank of a launched job leaves its error line (`report_error`)
RANK_REPORTS = "ONCURVE_RANK_REPORTS"

# How long torchrun lets its ranks finish after it forwards a signal itself (one that reached
# it directly, as a scheduler that signals every process of a job does) before it kills them:
# a step and a checkpoint, not torchrun's 30 s.
_SHUTDOWN_TIMEOUT_S = 3600


def _check_resumed_ranks(config: Config) -> None:
    """Before torchrun starts: a checkpoint to resume that other ranks wrote is one line here,
    not the same error from every rank and torchrun's report of their failure."""
    from oncurve.run import checkpoint

    found = checkpoint.resume_point(config.run.resume, config.run.dir)
    if found is not None and (found / checkpoint.COMPLETE).is_file():
        state = checkpoint.read_state(found)
        checkpoint.check_saved_ranks(found, state, config.dist.nproc)


# torchrun's main, whose failure (a rank's non-zero exit) ends it without a traceback: the
# ranks' own errors are reported by the launcher (`report_error`)
_TORCHRUN = (
    "import sys\n"
    "from torch.distributed.elastic.multiprocessing.errors import ChildFailedError\n"
    "from torch.distributed.run import parse_args, run\n"
    "try:\n"
    "    run(parse_args(sys.argv[1:]))\n"
    "except ChildFailedError:\n"
    "    sys.exit(1)\n"
)


def report_error(line: str, code: int) -> int:
    """`code`, with `line` printed to stderr; on a rank of a job `oncurve train` launched, the
    line left for the launcher instead (`RANK_REPORTS`), which prints each rank's line once."""
    reports, rank = os.environ.get(RANK_REPORTS), os.environ.get("RANK")
    if reports and rank is not None:
        try:
            Path(reports, f"rank-{int(rank)}").write_text(json.dumps([code, line]))
            return code
        except (OSError, ValueError):  # the launcher's directory gone: say it here
            pass
    print(line, file=sys.stderr)
    return code


def _reported(reports: Path) -> tuple[list[str], int]:
    """The ranks' error lines (each once, in rank order) and their worst exit status."""
    found = []
    for path in sorted(reports.glob("rank-*"), key=lambda p: int(p.name[len("rank-") :])):
        with contextlib.suppress(OSError, ValueError, TypeError):
            code, line = json.loads(path.read_text())
            found.append((int(code), str(line)))
    lines = list(dict.fromkeys(line for _, line in found))
    return lines, max((code for code, _ in found), default=0)


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
    however cleanly they stopped. A signal before the ranks exist goes to torchrun. SIGQUIT
    (Ctrl-\\) is forwarded too, and should the launcher die without forwarding anything (SIGKILL),
    the kernel sends torchrun SIGTERM (Linux), which stops the ranks: no job trains on
    orphaned."""
    import signal

    from oncurve.run.stopping import STOP_SIGNALS

    command = [
        sys.executable,
        "-c",
        _TORCHRUN,
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

    previous = {sig: signal.signal(sig, forward) for sig in (*STOP_SIGNALS, signal.SIGQUIT)}
    launcher = os.getpid()
    reports = Path(tempfile.mkdtemp(prefix="oncurve-ranks-"))
    # the ranks' errors come back here; one thread each, as torchrun gives them by default
    env = {**os.environ, RANK_REPORTS: str(reports)}
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        started.append(
            subprocess.Popen(
                command, env=env, start_new_session=True, preexec_fn=lambda: _end_with(launcher)
            )
        )
        if forwarded:  # a signal came while torchrun was starting
            forward(forwarded.pop(), None)
        code = started[0].wait()  # a signal runs `forward`, and the wait goes on
        lines, ranks_code = _reported(reports)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        shutil.rmtree(reports, ignore_errors=True)
    for line in lines:
        print(line, file=sys.stderr)
    if code < 0:  # torchrun itself killed by a signal
        code = 128 - code
    if forwarded and code != 0:
        return 128 + forwarded[-1]
    return ranks_code if code != 0 and ranks_code else code


def _end_with(parent: int) -> None:
    """In a child before it runs its program: ask Linux to send it SIGTERM when `parent`, the
    process that started it, ends (prctl's PR_SET_PDEATHSIG); nothing elsewhere. A parent that
    already ended ends it now."""
    import ctypes
    import signal

    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


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


def _split_config_args(items: list[str]) -> tuple[str | None, list[str]]:
    """The first argument may be a YAML file; every other one is a key=value override. A first
    argument that names an existing .yaml or .yml file is the file even with an = in its path
    (`sweep/lr=1e-4/c.yaml`)."""
    if items and ("=" not in items[0] or _is_yaml_file(items[0])):
        first = items[0]
        if not first.endswith((".yaml", ".yml")) and not Path(first).exists():
            raise UserError(
                f"argument {first!r} is neither a YAML file nor key=value (a setting needs =)"
            )
        return first, items[1:]
    for item in items:
        if "=" not in item:
            raise UserError(f"argument {item!r} must be key=value (only the first may be a file)")
    return None, items


def _is_yaml_file(item: str) -> bool:
    """Whether `item` names an existing file ending in .yaml or .yml."""
    return item.endswith((".yaml", ".yml")) and Path(item).is_file()
