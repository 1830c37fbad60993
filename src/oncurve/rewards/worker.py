"""The reward runner's worker process: forked once, it runs the jobs it is sent and sends back
one outcome per job.

Timeouts need a process: a Python thread cannot be stopped, so a hung verifier in a thread would
hang training. With `timeout_s` set, `RewardRunner` runs the calls in one persistent worker
process, forked at its first `score()` and kept until `close()` (or the end of a `with` block).
Each batch (prompts, completions, columns: plain picklable data) goes to the worker over a pipe
and the results stream back; the functions themselves are inherited through fork, so closures
and lambdas work. The parent waits at most `timeout_s` per call, kills the worker on a hang (or
finds it dead) and forks a fresh one for the remaining calls.

Why one worker and not a fork per batch: whatever a reward function loads lazily (math-verify
and sympy take ~0.6 s to import) or caches survives from one batch to the next instead of being
paid again every step, and the fork is paid once. The parent's objects are frozen out of the
garbage collector while forking (`gc.freeze`), so the worker's collections do not walk the
trainer's hundreds of thousands of objects and copy their memory pages on write. A consequence
of forking once: a reward function sees the parent's module state as it was at the fork (the
first batch, or the first after a hang); what changes during training must reach it through the
columns. Reward functions must not rely on CUDA or on threads of the parent inside the worker.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
from typing import Any

from oncurve.rewards.jobs import run_jobs
from oncurve.rewards.math import SYMBOLIC_BATCH_BUDGET_S, symbolic_budget
from oncurve.rewards.registry import RewardFn


class Worker:
    """A forked process that runs (jobs, batch) requests and sends back one outcome per job."""

    def __init__(self, fns: list[tuple[str, RewardFn, float]]) -> None:
        context = multiprocessing.get_context("fork")
        job_reader, self.requests = context.Pipe(duplex=False)
        self.outcomes, outcome_writer = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_serve,
            args=(job_reader, outcome_writer, (self.requests, self.outcomes), fns),
            name="oncurve-reward-worker",
            daemon=True,
        )
        # Frozen objects are invisible to the worker's garbage collector, which would otherwise
        # walk every object inherited from the trainer and copy their pages on write.
        gc.freeze()
        try:
            self.process.start()
        finally:
            gc.unfreeze()
        job_reader.close()
        outcome_writer.close()

    def stop(self, wait_s: float) -> int | None:
        """Close the pipes (an idle worker then exits), kill the process if it has not exited
        after `wait_s`; the exit code it had before any kill (None if it was still running)."""
        self.requests.close()
        self.process.join(wait_s)
        exit_code = self.process.exitcode
        if exit_code is None:
            self.process.kill()
            self.process.join()
        self.outcomes.close()
        return exit_code


def _serve(requests: Any, outcomes: Any, parent_ends: tuple, fns: list) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when the worker stops. SIGTERM
    # must stop it (multiprocessing terminates daemon children at exit), not run the trainer's
    # inherited stop handler.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Without the parent's ends open here, the parent's exit, however abrupt, ends recv() below.
    for end in parent_ends:
        end.close()
    while True:
        try:
            jobs, batch = requests.recv()
        except EOFError:
            return
        with symbolic_budget(SYMBOLIC_BATCH_BUDGET_S):
            for kind, payload, exc, seconds, log, said in run_jobs(fns, jobs, batch):
                exc = None if exc is None else _picklable(exc)
                try:
                    outcomes.send((kind, payload, exc, seconds, log, said))
                except BrokenPipeError:
                    return
                except Exception as err:  # a log value or a warning class that does not pickle
                    why = f"it logged a value that cannot leave the worker ({err})"
                    outcomes.send(("error", why, None, seconds, None, ()))


def _picklable(exc: BaseException) -> BaseException | None:
    # the message already carries the type and text; the object is only for `raise ... from`
    import pickle

    try:
        pickle.dumps(exc)
    except Exception:
        return None
    return exc
