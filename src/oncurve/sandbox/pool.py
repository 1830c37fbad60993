"""The entry points: `run_python` runs one program, `SandboxPool` runs many at once (threads
that each wait on one sandbox)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from oncurve.sandbox.launch import execute
from oncurve.sandbox.limits import FILE_SIZE_LIMIT, MAX_PARALLEL, OUTPUT_LIMIT, SandboxResult
from oncurve.sandbox.probing import check_isolation


def run_python(
    source: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    output_bytes: int = OUTPUT_LIMIT,
) -> SandboxResult:
    """Run ``source`` in a sandbox with ``stdin`` as input; see ``oncurve.sandbox``'s docstring."""
    _check_args(source, stdin, timeout_s, memory_mb, output_bytes)
    return execute(source, stdin, timeout_s, memory_mb, check_isolation(), output_bytes)


def _check_args(
    source: str, stdin: str, timeout_s: float, memory_mb: int, output_bytes: int
) -> None:
    if not isinstance(source, str) or not isinstance(stdin, str):
        raise TypeError("source and stdin must be str")
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not (isinstance(memory_mb, int) and memory_mb > 0):
        raise ValueError(f"memory_mb must be a positive integer, got {memory_mb!r}")
    if not (isinstance(output_bytes, int) and 0 < output_bytes <= FILE_SIZE_LIMIT):
        raise ValueError(
            f"output_bytes must be an integer in [1, {FILE_SIZE_LIMIT}], got {output_bytes!r}"
        )


class SandboxPool:
    """Runs sandboxed programs ``workers`` at a time (threads that wait on child processes).

    Use it as a context manager, or ``close()`` it.
    """

    def __init__(self, workers: int | None = None) -> None:
        workers = (os.cpu_count() or 1) if workers is None else workers
        if not 1 <= workers <= MAX_PARALLEL:
            raise ValueError(f"workers must be in [1, {MAX_PARALLEL}], got {workers}")
        check_isolation()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="oncurve-sandbox")

    def submit(
        self,
        source: str,
        stdin: str = "",
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        output_bytes: int = OUTPUT_LIMIT,
    ) -> Future[SandboxResult]:
        """Queue one run; the future holds its ``SandboxResult``."""
        _check_args(source, stdin, timeout_s, memory_mb, output_bytes)
        return self._executor.submit(
            run_python, source, stdin, timeout_s, memory_mb, output_bytes=output_bytes
        )

    def map(
        self,
        sources: Iterable[str],
        stdins: Iterable[str] | None = None,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        output_bytes: int | Iterable[int] = OUTPUT_LIMIT,
    ) -> list[SandboxResult]:
        """Run every source (with the matching stdin, if given; with the matching stdout limit,
        if ``output_bytes`` is one per source); results in input order."""
        sources = list(sources)
        stdins = [""] * len(sources) if stdins is None else list(stdins)
        if len(stdins) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(stdins)} stdins")
        limits = (
            [output_bytes] * len(sources) if isinstance(output_bytes, int) else list(output_bytes)
        )
        if len(limits) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(limits)} output_bytes")
        futures = [
            self.submit(s, i, timeout_s=timeout_s, memory_mb=memory_mb, output_bytes=limit)
            for s, i, limit in zip(sources, stdins, limits, strict=True)
        ]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Wait for the runs in flight and stop the threads."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
