"""Run a Python program a model wrote, confined, and report what it did.

``run_python(source, stdin, timeout_s, memory_mb, *, output_bytes) -> SandboxResult`` runs
``source`` as ``__main__`` with ``stdin`` as its input, in a fresh process of the base
interpreter (standard library only), and returns its stdout (cut at ``output_bytes``, by default
``OUTPUT_LIMIT``, 64 KiB; at most ``FILE_SIZE_LIMIT``, 16 MiB, since the trainer holds it in
memory) and stderr (cut at ``OUTPUT_LIMIT``), exit status, wall time and why it stopped; output
past its limit stops the run. It never raises for anything the program does; it raises
``ValueError`` for bad arguments and ``SandboxError`` when the sandbox itself cannot be set up.

Each run gets, where the machine allows it (``isolation()`` says what it gave):

- new network, PID, mount, IPC, UTS and cgroup namespaces (``unshare``): no network at all
  (not even loopback); a root of its own on a size-limited tmpfs with ``/usr`` and the
  interpreter read-only (its package directories covered) and a writable ``/sandbox`` (its
  working directory) and ``/tmp``, so nothing of the trainer's files is in sight and whatever it
  writes vanishes with the run; its own /proc, showing its own processes only; and when the run
  ends, the kernel kills every process left in its PID namespace;
- uid 1000 of a user namespace of its own, so that RLIMIT_NPROC (a fork bomb stops at
  ``PROCESS_LIMIT``) and the user keyring are the run's alone; outside, as root, a uid that no
  other live run of this trainer uses; a session keyring of its own;
- a seccomp filter (``_seccomp.py``) that refuses the kernel interfaces a test program never
  needs: io_uring, userfaultfd, keyrings, bpf, perf, ptrace, mount and namespace calls, memfd
  and SysV IPC, flock and inotify, sockets other than AF_UNIX;
- a cgroup (``_cgroup.py``: v2 where delegated, else v1) that bounds the memory, CPU and tasks
  of all its processes together; a process killed at its memory limit ends the run ("killed");
- rlimits with soft = hard, so they cannot be raised back: CPU time, address space
  (``memory_mb``), file size, open files, processes, no core files; ``no_new_privs``;
- a clean environment (PATH, HOME, TMPDIR, LANG: nothing of the trainer's, no credentials);
- its own session and process group, killed whole at the wall time or an output limit.

Without namespaces (a container that forbids them, or a non-root user without user
namespaces) it falls back to a host temporary directory and an audit hook that refuses sockets.
Whatever is missing (namespaces, the filter, a cgroup) it names in one warning per process.
``_boot.py`` is the first stage that builds all this; `docs/sandbox.md` has the
attacks it was tested against.

``SandboxPool(workers)`` runs many programs at once: threads that each wait on one sandbox;
its ``map`` takes one ``output_bytes`` for all runs or one per source.

The modules: ``limits`` (the limits, ``SandboxResult``, ``SandboxError``), ``probing``
(``Isolation``, the probe, the warning), ``pool`` (``run_python``, ``SandboxPool``), ``launch``
(uid slots, interpreter, the run's spec and cgroup, the fallback's sweep), ``supervise`` (one
run from launch to result), ``_cgroup``, ``_boot.py`` and ``_seccomp.py`` (the filter it
installs). Patch a name where it is defined.
"""

from __future__ import annotations

from oncurve.sandbox.limits import (
    FILE_SIZE_LIMIT,
    MAX_PARALLEL,
    OPEN_FILES_LIMIT,
    OUTPUT_LIMIT,
    PROCESS_LIMIT,
    SCRATCH_MB,
    Isolation,
    SandboxError,
    SandboxResult,
)
from oncurve.sandbox.pool import SandboxPool, run_python
from oncurve.sandbox.probing import check_isolation, isolation

__all__ = [
    "FILE_SIZE_LIMIT",
    "MAX_PARALLEL",
    "OPEN_FILES_LIMIT",
    "OUTPUT_LIMIT",
    "PROCESS_LIMIT",
    "SCRATCH_MB",
    "Isolation",
    "SandboxError",
    "SandboxPool",
    "SandboxResult",
    "check_isolation",
    "isolation",
    "run_python",
]
