"""Symbolic answer equivalence through `math-verify` (optional extra `math`), bounded in time
and memory wherever it is called.

Every comparison (both parses and the check) runs in a worker process, not in the caller: sympy
computes in C (GMP through gmpy2) where no signal handler or exception can stop it, and a SIGALRM
deadline works only on the main thread, while `correct` is also called on worker threads (a
`python_tool` episode). A process can be killed wherever it is.
  - One persistent worker, started at the first comparison with `python -c` (not a fork: the
    trainer has threads and CUDA), loads this file alone and reads JSON lines on its stdin. One
    thread at a time uses it (a lock), so any thread may compare.
  - Each comparison waits for the answer at most SYMBOLIC_TIMEOUT_S (less inside a
    `symbolic_budget`); past it the worker is killed (SIGKILL) and reaped, the comparison raises
    TimeoutError, and the next comparison starts a fresh worker. Starting one (~1 s) is not part of
    a comparison's deadline but is charged to a budget, except a process's first start (a batch pays
    for what its rows cost, not for the start every process pays once, seconds on a loaded machine);
    outside a budget, a call that finds the worker busy waits at most SYMBOLIC_WAIT_S for it, the
    lock and any worker start after it together (TimeoutError past it), so N threads each with a
    hostile comparison do not queue behind each other's timeouts and restarts. A call that finds the
    worker free starts it if need be (a process's first comparison, on a loaded machine, may take
    seconds to start one).
  - The worker's address space is capped (SYMBOLIC_MEMORY_BYTES): a huge number fails there. A
    comparison that ends the worker (GMP aborts when it cannot allocate) raises TimeoutError too:
    to the reward runner both are a verifier that gave up on the row.
  - The worker keeps parsed references in an LRU cache keyed by the reference string, so a group
    of completions that share a reference parses it once.
  - `symbolic_budget(s)` makes the comparisons of a batch on one thread share `s` seconds, so N
    hostile rows cost about one timeout, not N.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import json
import math
import multiprocessing.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# One comparison (both parses and the check) stops after this: below the reward runner's default
# timeout (10 s), so a slow row ends as a counted timeout without losing the runner's worker.
SYMBOLIC_TIMEOUT_S = 3.0
# What the comparisons of one batch share inside `symbolic_budget(SYMBOLIC_BATCH_BUDGET_S)`.
SYMBOLIC_BATCH_BUDGET_S = 2 * SYMBOLIC_TIMEOUT_S
# Outside a budget, what a call that finds the worker busy may wait for it (other threads'
# comparisons, then a fresh worker's start) before its own: a comparison after a hostile one on
# another thread (3 s, then a restart of about 1 s) still runs, and such a call never takes
# more than this plus its timeout.
SYMBOLIC_WAIT_S = 2 * SYMBOLIC_TIMEOUT_S
# The worker's address space (RLIMIT_AS), far above what sympy and math-verify hold when idle.
SYMBOLIC_MEMORY_BYTES = 2 * 1024**3

_STARTUP_TIMEOUT_S = 60.0  # a worker that is not ready after this is broken, not slow
_GOLD_CACHE_SIZE = 1024
# The worker process: this file loaded as a module of its own (no package import), then `_serve`.
_BOOT = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_oncurve_symbolic_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._serve(int(sys.argv[2]))\n"
)


@functools.cache
def has_math_verify() -> bool:
    """True when the optional `math-verify` package is installed (it is imported by the worker
    process only, never by the caller)."""
    return importlib.util.find_spec("math_verify") is not None


def symbolic_equal(predicted: str, gold: str) -> bool | None:
    """Whether two LaTeX/plain answers are mathematically equal (`\\frac{\\sqrt2}{2}` =
    `\\sqrt{2}/2`, `(x+1)^2` = `x^2+2x+1`); None when math-verify is not installed.

    Computed in the worker process on any thread. Raises TimeoutError when the comparison takes
    more than SYMBOLIC_TIMEOUT_S seconds or ends the worker (past its memory bound); outside
    `symbolic_budget`, when it finds the worker busy and it is not ready for it (another
    thread's comparisons, a fresh worker's start) within SYMBOLIC_WAIT_S; inside it, when the
    budget runs out (at once, without starting any work, once it is spent)."""
    if not has_math_verify():
        return None
    budgets = list(_budgets())
    if budgets and not _state.started_once and min(b.left for b in budgets) > 0:
        _start_first_worker()
    start = time.monotonic()
    if budgets:
        budget_end = start + min(b.left for b in budgets)
        wait_end = budget_end
    else:
        budget_end, wait_end = math.inf, start + SYMBOLIC_WAIT_S
    try:
        return _compare(predicted, gold, budget_end, wait_end)
    finally:
        elapsed = time.monotonic() - start
        for budget in budgets:
            budget.left -= elapsed


@contextlib.contextmanager
def symbolic_budget(seconds: float) -> Iterator[None]:
    """Inside this block, the symbolic comparisons of the calling thread share `seconds` of wall
    time (what each call to `symbolic_equal` takes, worker start included): each one's deadline
    is min(SYMBOLIC_TIMEOUT_S, what is left), and once nothing is left a comparison raises
    TimeoutError at once. Other threads are not affected; nested budgets all apply."""
    budget = _Budget(seconds)
    budgets = _budgets()
    budgets.append(budget)
    try:
        yield
    finally:
        budgets.remove(budget)


def symbolic_stats() -> dict[str, int]:
    """Counters of this process's symbolic comparisons: `workers` started, `comparisons` sent to
    a worker, `timeouts` (killed or ended workers), and the current worker's reference cache:
    `gold_parses` (misses) and `gold_hits`."""
    return dict(_state.stats)


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.left = seconds


class _Worker:
    """The worker process, its pipes and what it has sent back but not yet been read."""

    def __init__(self) -> None:
        # the caller's import path, so that the worker imports the math-verify the caller finds
        path = os.pathsep.join(entry for entry in sys.path if entry)
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-c", _BOOT, os.path.abspath(__file__)]
            + [str(SYMBOLIC_MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
            bufsize=0,
        )
        self.owner = os.getpid()
        self.started = time.monotonic()
        # A multiprocessing child (the reward runner's worker) ends without atexit hooks, and
        # runs these instead: it reaps its worker too.
        multiprocessing.util.Finalize(self, _reap, args=(self.process,), exitpriority=0)
        self.ready = False
        self._pending = b""

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[self.process.stdin.write(data) or 0 :]

    def receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline; EOFError when the worker has exited."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(math.ceil(left * 1000)):
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def stop(self) -> int:
        """Kill the process (SIGKILL: it may be inside C code) and reap it; its exit status
        before the kill, or -SIGKILL."""
        return _reap(self.process)


def _reap(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.kill()
    code = process.wait()
    for pipe in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            pipe.close()  # type: ignore[union-attr]
    return code


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.worker: _Worker | None = None
        self.started_once = False  # a worker of this process has been ready
        self.local = threading.local()
        self.stats = dict.fromkeys(
            ("workers", "comparisons", "timeouts", "gold_parses", "gold_hits"), 0
        )


_state = _State()


def _budgets() -> list[_Budget]:
    budgets = getattr(_state.local, "budgets", None)
    if budgets is None:
        budgets = _state.local.budgets = []
    return budgets


def _compare(predicted: str, gold: str, budget_end: float, wait_end: float) -> bool:
    """One comparison: the worker's lock by `wait_end` and, when the lock was held by another
    call or inside a budget, a ready worker by then too; the answer by `budget_end` and within
    SYMBOLIC_TIMEOUT_S of sending it."""
    if budget_end <= time.monotonic():
        raise TimeoutError("symbolic comparison budget spent")
    busy = not _state.lock.acquire(blocking=False)
    if busy and not _state.lock.acquire(timeout=max(wait_end - time.monotonic(), 0.0)):
        raise TimeoutError(_waited(budget_end))
    try:
        ready_end = wait_end if busy or budget_end < math.inf else math.inf
        worker = _ready_worker(ready_end, _waited(budget_end))
        seconds = min(SYMBOLIC_TIMEOUT_S, budget_end - time.monotonic())
        if seconds <= 0:
            raise TimeoutError("symbolic comparison budget spent")
        _state.stats["comparisons"] += 1
        try:
            worker.send({"predicted": predicted, "gold": gold, "seconds": seconds})
            reply = worker.receive(time.monotonic() + seconds)
        except (EOFError, BrokenPipeError):
            _drop_worker(timed_out=True)
            code = worker.process.returncode
            raise TimeoutError(
                f"symbolic comparison ended its worker process (exit status {code}): past its "
                "memory bound"
            ) from None
        if reply is None:
            _drop_worker(timed_out=True)
            raise TimeoutError(f"symbolic comparison took more than {seconds:.3g} s")
        _state.stats["gold_parses"] = reply["gold_parses"]
        _state.stats["gold_hits"] = reply["gold_hits"]
        if "memory" in reply:
            _drop_worker(timed_out=True)
            raise TimeoutError(f"symbolic comparison went past its memory bound: {reply['memory']}")
        if "error" in reply:
            raise RuntimeError(f"math-verify failed: {reply['error']}")
        return bool(reply["equal"])
    finally:
        _state.lock.release()


def _waited(budget_end: float) -> str:
    if budget_end < math.inf:
        return "symbolic comparison budget spent waiting for the worker"
    return f"symbolic comparison waited more than {SYMBOLIC_WAIT_S:.3g} s for the worker"


def _ready_worker(wait_end: float, waited: str) -> _Worker:
    """The worker, started if there is none (or it has exited), once it is ready. Past
    `wait_end` it raises TimeoutError(`waited`) and leaves a starting worker to start on for the
    next call."""
    worker = _state.worker
    if worker is not None and worker.process.poll() is not None:
        _drop_worker()
        worker = None
    if worker is None:
        worker = _state.worker = _Worker()
        _state.stats["workers"] += 1
        _state.stats["gold_parses"] = _state.stats["gold_hits"] = 0
    if worker.ready:
        return worker
    startup_end = worker.started + _STARTUP_TIMEOUT_S
    try:
        message = worker.receive(min(wait_end, startup_end))
    except EOFError:
        _drop_worker()
        raise RuntimeError(
            f"the symbolic comparison worker exited at its start (exit status "
            f"{worker.process.returncode}); its stderr says why"
        ) from None
    if message is None and time.monotonic() < startup_end:
        raise TimeoutError(waited)
    if message is None:
        _drop_worker()
        raise TimeoutError(
            f"the symbolic comparison worker did not start in {_STARTUP_TIMEOUT_S} s"
        )
    if not message["ready"]:
        _drop_worker()
        raise RuntimeError(f"math-verify does not import: {message['error']}")
    worker.ready = True
    _state.started_once = True
    return worker


def _start_first_worker() -> None:
    """Start this process's first worker and wait for it outside any budget: within
    SYMBOLIC_WAIT_S for the lock and _STARTUP_TIMEOUT_S for the start; past either the
    comparison goes on, its wait charged to its budget."""
    if not _state.lock.acquire(timeout=SYMBOLIC_WAIT_S):
        return
    try:
        with contextlib.suppress(TimeoutError):
            _ready_worker(math.inf, "the symbolic comparison worker did not start")
    finally:
        _state.lock.release()


def _drop_worker(timed_out: bool = False) -> None:
    """Kill and reap the worker; the next comparison starts another."""
    worker, _state.worker = _state.worker, None
    if worker is not None:
        worker.stop()
    _state.stats["timeouts"] += timed_out


def _close() -> None:
    """Stop the worker (at exit): no process left running or unreaped; the next start is a
    first start again."""
    worker, _state.worker = _state.worker, None
    _state.started_once = False
    if worker is not None and worker.owner == os.getpid():
        worker.stop()


def _after_fork_in_child() -> None:
    # A forked child (the reward runner's worker) must not share its parent's worker or lock;
    # it closes its copies of the pipes, so the parent's exit still ends that worker.
    worker = _state.worker
    _state.lock = threading.Lock()
    _state.worker = None
    _state.started_once = False
    if worker is not None:
        for pipe in (worker.process.stdin, worker.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        worker.process.returncode = 0  # not this process's child: never waited for here


atexit.register(_close)
os.register_at_fork(after_in_child=_after_fork_in_child)


# --- the worker process ---------------------------------------------------------------------


def _serve(memory_bytes: int) -> None:
    """Answer one JSON line per request line on stdin until stdin closes."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the parent decides
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    # Replies get a private copy of stdout; whatever a library prints goes to stderr.
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)

    def reply(message: dict[str, Any]) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[replies.write(data) or 0 :]

    try:
        import math_verify
        import math_verify.grader
        import math_verify.parser
    except Exception as e:
        reply({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    # Its own timeouts are off (SIGALRM timers the parent's kill replaces); this flag silences
    # its warning that they are.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True

    def parse(text: str) -> list[Any]:
        return math_verify.parse(_as_latex(text), parsing_timeout=None)

    parse_gold = functools.lru_cache(maxsize=_GOLD_CACHE_SIZE)(parse)

    def equal(predicted: str, gold: str) -> bool:
        parsed_gold = parse_gold(gold)
        parsed_pred = parse(predicted)
        if not parsed_gold or not parsed_pred:
            return False
        if not math_verify.verify(parsed_gold, parsed_pred, timeout_seconds=None):
            return False
        return not _relatively_apart(parsed_gold[0], parsed_pred[0])

    # sympy's lazy imports and first-call caches, before any deadline
    equal("\\frac{1}{2}", "0.5")
    equal("(x+1)^2", "x^2+2x+1")
    parse_gold.cache_clear()
    reply({"ready": True})
    for line in sys.stdin.buffer:
        request = json.loads(line)
        # An orphan (its parent killed mid-comparison) stops soon too: past this CPU time the
        # kernel ends the process, wherever it is.
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = math.ceil(used.ru_utime + used.ru_stime + request["seconds"]) + 2
        if cpu_hard != resource.RLIM_INFINITY:
            cpu_s = min(cpu_s, cpu_hard)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_hard))
        message: dict[str, Any]
        try:
            message = {"equal": equal(request["predicted"], request["gold"])}
        except MemoryError:
            message = {"memory": "MemoryError"}
        except Exception as e:
            message = {"error": f"{type(e).__name__}: {e}"}
        info = parse_gold.cache_info()
        try:
            reply({**message, "gold_parses": info.misses, "gold_hits": info.hits})
        except BrokenPipeError:  # the parent is gone
            return


def _relatively_apart(gold: Any, predicted: Any) -> bool:
    """Whether two exact numbers (sympy expressions without variables or floats) differ by more
    than 1e-20 of the larger (beside an exact zero, by more than 1e-40): math-verify compares
    them within an absolute tolerance, which takes `2^{-60}` for `2^{-61}`. Where either value or
    their difference does not evaluate to a finite number (`\\infty` and `+\\infty`, whose
    difference is NaN; a `\\gcd` that evaluation leaves unevaluated), math-verify's equality
    stands: such values cannot be ordered."""
    import sympy

    if not all(
        isinstance(x, sympy.Expr) and not x.free_symbols and not x.has(sympy.Float)
        for x in (gold, predicted)
    ):
        return False
    values = [abs(x.evalf(60)) for x in (gold, predicted, gold - predicted)]
    if not all(isinstance(v, sympy.Number) and v.is_finite for v in values):
        return False
    scale, difference = max(values[:2]), values[2]
    if gold.is_zero or predicted.is_zero:  # `\sin(\pi)`'s evaluation leaves 1e-100 or so
        return bool(difference > sympy.Rational(1, 10**40))
    return bool(difference > scale * sympy.Rational(1, 10**20))


def _as_latex(text: str) -> str:
    return text if "$" in text or "\\boxed" in text else f"${text}$"
