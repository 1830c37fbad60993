"""Symbolic comparisons run in a worker process: bounded on any thread and inside C code, within
a batch budget, with the reference parsed once per group, and safe to call from many threads."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("math_verify")

import oncurve.rewards.math as symbolic  # noqa: E402
from oncurve.rewards.math import symbolic_budget, symbolic_equal, symbolic_stats  # noqa: E402

NEEDS_GMPY2 = pytest.mark.skipif(
    importlib.util.find_spec("gmpy2") is None,
    reason="gmpy2 not installed: sympy computes in Python",
)
# Half a minute or more of computation for sympy: in C (GMP through gmpy2), in Python (plain ints).
C_LEVEL = ("\\Gamma(10^{8})", "1")
PYTHON_LEVEL = ("(x-x+9999999)!", "1")
TIMEOUT_S = 0.5
# Generous: a bounded comparison ends within TIMEOUT_S; the hostile cases take 30 s or more.
MARGIN_S = 10.0


@pytest.fixture(autouse=True, scope="module")
def _no_worker_left() -> Iterator[None]:
    yield
    symbolic._close()


@pytest.fixture
def python_sympy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A worker (started after this) whose sympy leaves gmpy2 unused: computes in Python."""
    symbolic._close()
    monkeypatch.setenv("SYMPY_GROUND_TYPES", "python")
    monkeypatch.setenv("MPMATH_NOGMPY", "1")
    yield
    symbolic._close()


def outcome(fn: Callable[[], Any], on_thread: bool) -> tuple[Any, BaseException | None, float]:
    """fn's result and exception, and its wall time, called on a new thread or on this one."""
    result: list[Any] = [None, None, 0.0]

    def call() -> None:
        start = time.perf_counter()
        try:
            result[0] = fn()
        except BaseException as e:
            result[1] = e
        result[2] = time.perf_counter() - start

    if on_thread:
        thread = threading.Thread(target=call)
        thread.start()
        thread.join()
    else:
        call()
    return result[0], result[1], result[2]


@pytest.mark.parametrize(
    ("case", "on_thread"),
    [
        pytest.param(PYTHON_LEVEL, True, id="python_level-worker_thread"),
        pytest.param(C_LEVEL, True, id="c_level-worker_thread", marks=NEEDS_GMPY2),
        pytest.param(C_LEVEL, False, id="c_level-main_thread", marks=NEEDS_GMPY2),
    ],
)
def test_a_hostile_comparison_times_out_and_the_worker_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    case: tuple[str, str],
    on_thread: bool,
) -> None:
    if case == PYTHON_LEVEL:
        request.getfixturevalue("python_sympy")
    predicted, gold = case
    monkeypatch.setattr(symbolic, "SYMBOLIC_TIMEOUT_S", TIMEOUT_S)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True  # the worker is started
    old = symbolic._state.worker
    assert old is not None
    before = symbolic_stats()

    result, error, seconds = outcome(lambda: symbolic_equal(predicted, gold), on_thread)

    assert result is None
    assert isinstance(error, TimeoutError)
    assert str(error) == "symbolic comparison took more than 0.5 s"
    assert seconds < TIMEOUT_S + MARGIN_S
    assert old.process.returncode == -9  # killed and reaped
    assert symbolic_stats()["timeouts"] == before["timeouts"] + 1
    # the next comparison gets a fresh worker and the right answer
    assert symbolic_equal("(x+1)^2", "x^2+2x+1") is True
    assert symbolic_equal("(x+1)^2", "x^2+1") is False
    assert symbolic._state.worker is not old
    assert symbolic_stats()["workers"] == before["workers"] + 1


@pytest.mark.usefixtures("python_sympy")
def test_a_batch_budget_makes_hostile_rows_cost_one_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    predicted, gold = PYTHON_LEVEL
    monkeypatch.setattr(symbolic, "SYMBOLIC_TIMEOUT_S", TIMEOUT_S)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True
    budget_s = 1.5 * TIMEOUT_S
    sent: list[int] = []
    errors: list[TimeoutError] = []
    start = time.perf_counter()
    with symbolic_budget(budget_s):
        for _ in range(4):
            before = symbolic_stats()
            with pytest.raises(TimeoutError) as raised:
                symbolic_equal(predicted, gold)
            errors.append(raised.value)
            sent.append(symbolic_stats()["comparisons"] - before["comparisons"])
    elapsed = time.perf_counter() - start

    # the first runs to its own deadline; the budget's rest goes to the next (a worker to start,
    # then what is left of the comparison); the last two start nothing
    assert sent[0] == 1
    assert sent[1] in (0, 1)
    assert sent[2:] == [0, 0]
    assert str(errors[0]) == "symbolic comparison took more than 0.5 s"
    assert [str(e) for e in errors[2:]] == ["symbolic comparison budget spent"] * 2
    assert elapsed < budget_s + MARGIN_S
    # outside the budget, comparisons run again
    assert symbolic_equal("(x+1)^2", "x^2+2x+1") is True


def test_a_spent_budget_starts_no_worker_and_binds_only_its_thread() -> None:
    symbolic._close()
    with symbolic_budget(0.0):
        with pytest.raises(TimeoutError, match="budget spent"):
            symbolic_equal("\\frac{1}{2}", "0.5")
        assert symbolic._state.worker is None
        result, error, _ = outcome(lambda: symbolic_equal("\\frac{1}{2}", "0.5"), True)
        assert (result, error) == (True, None)


def test_a_processs_first_worker_start_is_not_charged_to_a_batch_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first batch of a process on a loaded machine: its worker takes longer to start than
    the batch's whole budget, and the batch's comparisons are still made (a restart after a
    hostile row stays charged: test_a_batch_budget_makes_hostile_rows_cost_one_timeout)."""
    symbolic._close()
    start_worker = symbolic._Worker.__init__

    def slow_start(worker: Any) -> None:
        time.sleep(1.0)
        start_worker(worker)

    monkeypatch.setattr(symbolic._Worker, "__init__", slow_start)
    try:
        with symbolic_budget(0.5):
            assert symbolic_equal("\\frac{1}{2}", "0.5") is True
            assert symbolic_equal("\\sqrt{4}", "3") is False
    finally:
        symbolic._close()


def test_the_reference_is_parsed_once_per_group() -> None:
    gold = "\\frac{7}{13}"
    assert symbolic_equal("\\frac{14}{26}", gold) is True
    after_first = symbolic_stats()
    assert symbolic_equal("7/13", gold) is True
    assert symbolic_equal("\\frac{7}{12}", gold) is False
    after = symbolic_stats()
    assert after["gold_parses"] == after_first["gold_parses"]
    assert after["gold_hits"] == after_first["gold_hits"] + 2
    assert after["comparisons"] == after_first["comparisons"] + 2


def test_threads_comparing_at_once_all_get_their_answers() -> None:
    cases = [
        ("\\frac{1}{2}", "0.5", True),
        ("(x+1)^2", "x^2+2x+1", True),
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),
        ("3", "0.5", False),
        ("x^2", "x^3", False),
    ]
    assert symbolic_equal("1", "1") is True
    worker, before = symbolic._state.worker, symbolic_stats()
    barrier = threading.Barrier(4)
    answers: dict[int, list[bool | None]] = {}

    def compare(k: int) -> None:
        barrier.wait()
        # each thread in its own order, so different comparisons overlap
        order = cases[k:] + cases[:k]
        answers[k] = [symbolic_equal(p, g) for p, g, _ in order]

    threads = [threading.Thread(target=compare, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in range(4):
        order = cases[k:] + cases[:k]
        assert answers[k] == [expected for _, _, expected in order]
    # one worker served them all, one comparison at a time
    assert symbolic._state.worker is worker
    assert symbolic_stats()["comparisons"] == before["comparisons"] + 20
    assert symbolic_stats()["timeouts"] == before["timeouts"]


@pytest.mark.usefixtures("python_sympy")
def test_a_comparison_that_ends_its_worker_raises_timeout_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that dies mid-comparison (GMP aborts past the memory bound) is a verifier that
    gave up, as a timeout is; the next comparison gets a fresh worker."""
    predicted, gold = PYTHON_LEVEL
    monkeypatch.setattr(symbolic, "SYMBOLIC_TIMEOUT_S", 60.0)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True
    worker = symbolic._state.worker
    assert worker is not None
    sent = symbolic_stats()["comparisons"]

    def kill_once_sent() -> None:
        while symbolic_stats()["comparisons"] == sent:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(worker.process.pid, 6)  # SIGABRT, as GMP's abort

    killer = threading.Thread(target=kill_once_sent)
    killer.start()
    with pytest.raises(TimeoutError, match=r"ended its worker process \(exit status -6\)"):
        symbolic_equal(predicted, gold)
    killer.join()
    assert symbolic_equal("(x+1)^2", "x^2+2x+1") is True
    assert symbolic._state.worker is not worker


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="reads /proc")
def test_the_worker_address_space_is_bounded() -> None:
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True
    worker = symbolic._state.worker
    assert worker is not None
    with open(f"/proc/{worker.process.pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max address space"))
    assert line.split()[3:5] == [str(symbolic.SYMBOLIC_MEMORY_BYTES)] * 2


def test_closing_stops_and_reaps_the_worker() -> None:
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True
    worker = symbolic._state.worker
    assert worker is not None
    symbolic._close()
    assert worker.process.returncode is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(worker.process.pid, os.WNOHANG)
    # a process that exits leaves no worker behind
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('m', sys.argv[1])\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "assert m.symbolic_equal('(x+1)^2', 'x^2+2x+1') is True\n"
        "print(m._state.worker.process.pid)\n"
    )
    command = [sys.executable, "-c", code, symbolic.__file__]
    pid = int(subprocess.run(command, capture_output=True, check=True).stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _forked_compare(queue: Any) -> None:
    inherited = symbolic._state.worker
    equal = symbolic_equal("(x+1)^2", "x^2+2x+1")
    worker = symbolic._state.worker
    queue.put((equal, inherited, worker.owner, worker.process.pid))


def test_a_forked_child_uses_its_own_worker() -> None:
    """The reward runner forks its worker: the child starts its own symbolic worker, leaves its
    parent's alone, and reaps its own when it ends."""
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True
    parent_worker = symbolic._state.worker
    assert parent_worker is not None
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forked_compare, args=(queue,))
    child.start()
    equal, inherited, owner, pid = queue.get(timeout=60)
    child.join(10)
    assert (equal, inherited, child.exitcode) == (True, None, 0)
    assert owner == child.pid
    with pytest.raises(ProcessLookupError):  # the child stopped and reaped its worker
        os.kill(pid, 0)
    assert symbolic._state.worker is parent_worker
    assert symbolic_equal("(x+1)^2", "x^2+1") is False


@pytest.mark.usefixtures("python_sympy")
def test_the_reward_runner_gives_each_batch_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from oncurve.rewards.runner import RewardRunner

    predicted, gold = PYTHON_LEVEL
    monkeypatch.setattr(symbolic, "SYMBOLIC_TIMEOUT_S", TIMEOUT_S)
    monkeypatch.setattr("oncurve.rewards.runner.SYMBOLIC_BATCH_BUDGET_S", 1.5 * TIMEOUT_S)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True  # the worker started

    def hostile(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [float(symbolic_equal(predicted, gold)) for _ in completions]

    hostile.rowwise = True  # type: ignore[attr-defined]
    before = symbolic_stats()["comparisons"]
    with RewardRunner([("hostile", hostile, 1.0)], timeout_s=None, timeout_score=0.0) as runner:
        result = runner.score(["p"] * 6, ["c"] * 6, {})
    assert result.metrics["reward/timeouts"] == 6.0
    assert result.per_fn[:, 0].tolist() == [0.0] * 6
    # one comparison ran to its deadline, a second at most used the rest: four never started
    assert symbolic_stats()["comparisons"] - before <= 2


@pytest.mark.usefixtures("python_sympy")
def test_threads_outside_a_budget_wait_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a budget, a call that finds the worker busy waits at most SYMBOLIC_WAIT_S for it
    (its lock and a fresh worker's start) before it raises TimeoutError: six threads with a
    hostile comparison each cost about one comparison and one wait, not six comparisons and five
    worker starts in a queue."""
    predicted, gold = PYTHON_LEVEL
    monkeypatch.setattr(symbolic, "SYMBOLIC_TIMEOUT_S", TIMEOUT_S)
    assert symbolic_equal("\\frac{1}{2}", "0.5") is True  # the worker started
    monkeypatch.setattr(symbolic, "SYMBOLIC_WAIT_S", TIMEOUT_S)
    before = symbolic_stats()
    barrier = threading.Barrier(6)
    errors: list[BaseException | None] = [None] * 6

    def compare(k: int) -> None:
        barrier.wait()
        _, errors[k], _ = outcome(lambda: symbolic_equal(predicted, gold), False)

    threads = [threading.Thread(target=compare, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(error, TimeoutError) for error in errors)
    # one comparison ran to its deadline; the others waited for it, and a fresh worker starts
    # in more than what was left of their wait: none or one more was sent
    assert symbolic_stats()["comparisons"] - before["comparisons"] <= 2
    monkeypatch.setattr(symbolic, "SYMBOLIC_WAIT_S", 60.0)
    assert symbolic_equal("(x+1)^2", "x^2+2x+1") is True
