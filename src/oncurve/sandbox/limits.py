"""The sandbox's limits, what the machine gives it (`Isolation`), and what a run returns
(`SandboxResult`) or raises (`SandboxError`)."""

from __future__ import annotations

import dataclasses

# bytes kept of stderr, and of stdout unless the run sets its own; more stops the run
OUTPUT_LIMIT = 64 * 1024
# bytes, per file the program writes; also the most stdout a run may keep (`output_bytes`)
FILE_SIZE_LIMIT = 16 * 1024 * 1024
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


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What the machine gave: namespaces (network, PID, mount, IPC, UTS); whether the program
    runs as a user other than the trainer's; what is missing compared with the full sandbox,
    one sentence each (empty when nothing is); and the cgroup version (2 or 1) that bounds each
    run's total memory, CPU and processes, 0 when none does."""

    namespaces: bool
    drops_user: bool
    missing: tuple[str, ...]
    cgroups: int = 0
