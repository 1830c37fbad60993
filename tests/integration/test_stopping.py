"""How a run stops: every stop signal, at every phase, on one process or under the torchrun
launcher, ends with a checkpoint where there is a step to save, a one-line report and a known
exit status; a closed output ends the run's prints, never the run.

A fault table: each row names a fault (a signal, a phase, a closed pipe) and what the run
must leave behind (files, exit status, processes). SIGTERM to the launcher of a 2-rank job is
checked on the resumed run of tests/integration/test_distributed.py's
test_fsdp2_run_equals_the_data_parallel_run_resumes_exactly_and_stops_on_sigterm (a 2-rank
job's start costs seconds of both cores: there it is one start fewer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from helpers.paths import TESTS
from helpers.run_processes import finish, latest_step, wait_for

LONG = 400  # steps of a run that a signal stops long before its end


def job(model_dir: Path, data_file: Path, run_dir: Path, *extra: str) -> list[str]:
    """`oncurve train` arguments of a tiny CPU job (about 0.05 s a step)."""
    return [
        "train",
        "--quiet",
        f"model.path={model_dir}",
        f"data.path={data_file}",
        "data.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "reward.functions=[helpers.rewards_for_tests:count_digits]",
        "reward.timeout=null",
        "run.threads=1",
        "optim.lr=1e-2",
        "run.device=cpu",
        f"run.dir={run_dir}",
        *extra,
    ]


def environment(*paths: Path) -> dict[str, str]:
    """The environment with the test rewards (and `paths`) importable."""
    entries = [*map(str, paths), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in entries if p)}


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m oncurve ARGS` with its stdout and stderr captured."""
    return subprocess.Popen(
        [sys.executable, "-m", "oncurve", *args],
        env=env or environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def has_a_step(run_dir: Path) -> Callable[[], bool]:
    metrics = run_dir / "metrics.jsonl"
    return lambda: metrics.is_file() and metrics.stat().st_size > 0


def logged_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


# SIGTERM mid-loop, with the same checks and an exact resume, and SIGINT (in the test's own
# process): tests/integration/test_reliability.py's
# test_sigterm_then_sigkill_each_resumed_from_is_bit_identical_to_an_uninterrupted_run and
# test_sigint_in_process_stops_after_the_current_step_with_a_checkpoint
MID_LOOP = [signal.SIGHUP, signal.SIGUSR1]


def test_each_stop_signal_mid_loop_saves_the_step_and_exits_0(tiny_model_dir, data_file, tmp_path):
    """SIGHUP and SIGUSR1 (SIGTERM and SIGINT: see above) each stop a run at the end of the step
    under way: the first signal is acknowledged at once, the step is checkpointed and logged,
    and the run exits 0 with a line saying where it stopped (the resume from such a stop:
    SIGTERM's test)."""
    runs = {sig: tmp_path / sig.name for sig in MID_LOOP}
    procs = {
        sig: start(job(tiny_model_dir, data_file, runs[sig], f"run.steps={LONG}"))
        for sig in MID_LOOP
    }
    try:
        for sig, proc in procs.items():
            wait_for(has_a_step(runs[sig]), proc, "the first step")
            proc.send_signal(sig)
        for sig, proc in procs.items():
            code, err = finish(proc)
            run_dir = runs[sig]
            assert code == 0, (sig.name, err[-2000:])
            stopped_at = latest_step(run_dir)
            assert 1 <= stopped_at < LONG, sig.name
            assert f"{sig.name}: stopping after step" in err and "signal again to abort" in err
            assert f"stopped at step {stopped_at} on request" in err, sig.name
            assert "Traceback" not in err, sig.name
            assert logged_steps(run_dir) == list(range(1, stopped_at + 1)), sig.name
            assert not (run_dir / "final").exists()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


SIGNAL_ON_IMPORT = """
import os
import signal

from helpers.rewards_for_tests import count_digits  # noqa: F401

os.kill(os.getpid(), getattr(signal, os.environ["STOP_TEST_SIGNAL"]))
"""


def test_a_signal_during_setup_ends_the_run_before_step_1_with_one_line_and_128_plus_signum(
    tiny_model_dir, data_file, tmp_path
):
    """A signal while the run is being set up (here: as its reward module is imported) lets
    setup finish, then ends the run before step 1: no traceback, a line saying there is
    nothing to save, no checkpoint, and exit status 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM)."""
    (tmp_path / "signal_on_import.py").write_text(SIGNAL_ON_IMPORT)
    procs = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        env = {**environment(tmp_path), "STOP_TEST_SIGNAL": sig.name}
        args = job(tiny_model_dir, data_file, tmp_path / sig.name, "run.steps=3")
        procs[sig] = start(
            [a.replace("helpers.rewards_for_tests:", "signal_on_import:") for a in args], env
        )
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        code, err = finish(procs[sig])
        assert code == status, err[-2000:]
        assert f"{sig.name}: stopping before step 1; signal again to abort" in err
        assert "stopped before step 1 on request; nothing to save" in err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        assert latest_step(tmp_path / sig.name) == 0
        assert not (tmp_path / sig.name / "final").exists()


SLOW_AFTER_FIRST_CALL = """
import time
from pathlib import Path

from helpers.rewards_for_tests import count_digits as digits

calls = []


def count_digits(prompts, completions, **columns):
    calls.append(1)
    if len(calls) > 1:
        # step 2 and later: says it is inside a step, then long enough for two signals
        Path(__file__).with_name("inside_step_2").touch()
        time.sleep(60)
    return digits(prompts, completions, **columns)
"""


def test_a_second_signal_aborts_at_once_and_keeps_the_last_checkpoint(
    tiny_model_dir, data_file, tmp_path
):
    """A second SIGINT, a second after the first, aborts the run at once, inside the step
    under way, with status 130; the checkpoint written before stays complete."""
    (tmp_path / "slow_reward.py").write_text(SLOW_AFTER_FIRST_CALL)
    run_dir = tmp_path / "run"
    args = job(tiny_model_dir, data_file, run_dir, "run.steps=5", "run.save_every=1")
    args = [a.replace("helpers.rewards_for_tests:", "slow_reward:") for a in args]
    proc = start(args, environment(tmp_path))
    try:
        wait_for(lambda: latest_step(run_dir) >= 1, proc, "the first checkpoint")
        # a signal in the save's last moments would stop the run after step 1, before the second
        wait_for(lambda: (tmp_path / "inside_step_2").exists(), proc, "step 2's reward")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "signal again to abort" in _peek(proc), proc, "the acknowledgment", 20)
        time.sleep(1.2)
        proc.send_signal(signal.SIGINT)
        code, err = finish(proc, timeout=30)
    finally:
        proc.kill()
        proc.wait()
    err = _seen.get(proc.pid, "") + err
    assert code == 130, err[-2000:]
    assert "SIGINT again: aborting" in err
    assert latest_step(run_dir) == 1
    assert (run_dir / "checkpoints" / "step-000001" / "model.safetensors").is_file()


_seen: dict[int, str] = {}


def _peek(proc: subprocess.Popen) -> str:
    """What `proc` wrote to stderr so far (read without blocking; kept for `finish`)."""
    import fcntl

    fd = proc.stderr.fileno()
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        chunk = os.read(fd, 65536).decode(errors="replace")
    except BlockingIOError:
        chunk = ""
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    _seen[proc.pid] = _seen.get(proc.pid, "") + chunk
    return _seen[proc.pid]


def test_a_closed_pipe_ends_the_output_not_the_run(tiny_model_dir, data_file, tmp_path):
    """`oncurve train ... 2>&1 | head -2`: once `head` has gone, the run's output goes nowhere
    and the run goes on to its end: every step logged, `final/` written, exit status 0."""
    run_dir = tmp_path / "run"
    steps = 6
    args = job(tiny_model_dir, data_file, run_dir, f"run.steps={steps}")
    command = " ".join(map(_quote, [sys.executable, "-m", "oncurve", *args]))
    status = tmp_path / "status"
    script = f"( {command}; echo $? > {_quote(str(status))} ) 2>&1 | head -2"
    shown = subprocess.run(
        ["bash", "-c", script], env=environment(), capture_output=True, text=True, timeout=180
    )
    assert len(shown.stdout.splitlines()) == 2
    deadline = time.monotonic() + 60  # the pipeline ends with head; the run may outlive it
    while not status.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.read_text().strip() == "0"
    assert logged_steps(run_dir) == list(range(1, steps + 1))
    assert (run_dir / "final" / "model.safetensors").is_file()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_only_the_announcing_rank_says_it_aborts():
    """Every rank of a torchrun job gets the second signal; one line says the job aborts."""
    program = (
        "import os, signal, time\n"
        "from oncurve.run.stopping import stop_on_signals\n"
        "with stop_on_signals(announce={announce}):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(1.5)\n"  # past the window in which a repeat of the first is ignored
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    for announce, lines in ((True, 2), (False, 0)):
        done = subprocess.run(
            [sys.executable, "-c", program.format(announce=announce)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 128 + signal.SIGTERM
        assert len(done.stderr.splitlines()) == lines
