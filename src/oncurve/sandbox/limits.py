"""The sandbox's limits, and what a run returns (`SandboxResult`) or raises (`SandboxError`)."""

from __future__ import annotations

import dataclasses

OUTPUT_LIMIT = 64 * 1024  # bytes kept of stdout and of stderr; more stops the run
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # bytes, per file the program writes
OPEN_FILES_LIMIT = 64
PROCESS_LIMIT = 32  # processes and threads of one run
SCRATCH_MB = 64  # the tmpfs that holds everything a namespaced run writes
MAX_PARALLEL = 64  # runs at once per trainer process (each needs a uid of its own)


class SandboxError(RuntimeError):
    """The sandbox itself could not run (never raised for what the program does)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed program did.

    ``status`` is "ok" (exit 0), "error" (another exit code, or a source that is not valid
    UTF-8), "timeout" (wall or CPU time) or "killed" (a signal, the output limit or the memory
    limit). ``reason`` says more: "exit", "undecodable source", "wall time", "cpu time",
    "output limit", "memory limit", "signal N (NAME)". ``returncode`` is the exit code, minus
    the signal number for a death by signal, None when the sandbox stopped the program or
    never ran it.
    """

    stdout: str
    stderr: str
    returncode: int | None
    status: str
    reason: str
    seconds: float
