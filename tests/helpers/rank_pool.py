"""Two spawned processes kept for the whole test session, the ranks of every 2-rank job the tests
run: a job is a module-level function called on both at once as `fn(rank, world_size, *args)`,
which joins a gloo process group (MASTER_ADDR and a fresh MASTER_PORT are set for it) and
returns what the test checks. Starting the two interpreters (torch, transformers, oncurve) costs
seconds of both cores; a pool pays it once per session instead of once per test.

Between jobs a rank leaves whatever process group the job left it in (after a barrier, as a
torchrun job ends) and gets its environment back. A job that raises, a rank that dies and a job
that is not done by its deadline (a rank waiting in a collective its peer never joins) fail the
test at once and end both processes; the next job starts new ones.

`on_ranks` runs any function on both ranks (a trainer's `setup` and steps, say) with the
environment torchrun gives a rank."""

from __future__ import annotations

import io
import os
import socket
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, conn: Any) -> None:
    """A rank's loop: run each job it is sent, send back its result (torch.save bytes) or the
    traceback of what it raised."""
    from oncurve import distributed

    # one thread a rank: two ranks of two threads each on two cores spin against each other
    torch.set_num_threads(1)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            break
        if job is None:
            break
        fn, args, port = job
        environment = dict(os.environ)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        try:
            result = fn(rank, world_size, *args)
            distributed.leave()  # both ranks done before either tears gloo down
            buffer = io.BytesIO()
            torch.save(result, buffer)
            conn.send(("ok", buffer.getvalue()))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            break  # its process group may be half torn down: the pool starts new ranks
        finally:
            os.environ.clear()
            os.environ.update(environment)
    conn.close()
    # no interpreter teardown, where gloo's leftovers aborted a rank now and then (SIGABRT)
    os._exit(0)


class RankPool:
    """`run(fn, *args)`: `fn(rank, 2, *args)` on two ranks at once, their results in rank
    order."""

    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size
        self._ranks: list[tuple[Any, Any]] = []  # (process, connection)

    def _start(self) -> None:
        context = mp.get_context("spawn")
        for rank in range(self.world_size):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(rank, self.world_size, theirs))
            process.start()
            theirs.close()
            self._ranks.append((process, ours))

    def run(self, fn: Any, *args: Any, timeout: float = 120) -> list[Any]:
        if not self._ranks:
            self._start()
        port = free_port()
        for _, conn in self._ranks:
            conn.send((fn, args, port))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(results) < self.world_size:
            waiting = {
                rank: (process, conn)
                for rank, (process, conn) in enumerate(self._ranks)
                if rank not in results
            }
            ready = wait(
                [item for process, conn in waiting.values() for item in (conn, process.sentinel)],
                timeout=max(0.0, deadline - time.monotonic()),
            )
            if not ready:
                self.close(kill=True)
                pytest.fail(
                    f"the ranks were not done in {timeout:.0f} s: one waits in a collective"
                )
            for rank, (process, conn) in waiting.items():
                if conn in ready:
                    try:
                        status, payload = conn.recv()
                    except EOFError:
                        status, payload = "error", "its connection closed"
                elif process.sentinel in ready:
                    status, payload = "error", f"it ended with status {process.exitcode}"
                else:
                    continue
                if status != "ok":
                    self.close(kill=True)
                    raise AssertionError(f"rank {rank} of {fn.__name__} failed:\n{payload}")
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        return [results[rank] for rank in range(self.world_size)]

    def close(self, kill: bool = False) -> None:
        """Ends both ranks: asked to (killed if they do not end in 10 s), or killed at once."""
        for process, conn in self._ranks:
            try:
                if kill:
                    process.kill()
                else:
                    conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for process, conn in self._ranks:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()
        self._ranks = []


def _rank_entry(rank: int, world_size: int, fn: Callable[..., Any], args: tuple) -> Any:
    # what torchrun sets (MASTER_ADDR and MASTER_PORT are the pool's): `setup` joins the
    # process group from these
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    return fn(*args)


def on_ranks(two_ranks: RankPool, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """`fn(*args)` on the session's two ranks (`rank_pool`), which join a gloo group in
    `trainer.setup`; each rank's return value, in rank order."""
    return two_ranks.run(_rank_entry, fn, args)
