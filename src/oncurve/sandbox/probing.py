"""What isolation this machine gives: the `Isolation` record, probed once per process by real
runs of a tiny program (`isolation()`), and the warning, once per process, that names what is
missing (`check_isolation()`)."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
import threading
import warnings

from oncurve.sandbox import _cgroup, launch
from oncurve.sandbox.limits import OUTPUT_LIMIT, PROCESS_LIMIT, SCRATCH_MB, Isolation, SandboxError

_PROBE_SOURCE = (
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('Seccomp:'):\n"
    "        print(line.split()[1])\n"
)


_MISSING_NET = (
    "network namespace: sockets are refused by an audit hook instead, which native code "
    "could get around"
)
_MISSING_MNT = (
    "mount namespace: the program can read every world-readable file of the machine, and its "
    "files go to a host directory where only RLIMIT_FSIZE bounds each file"
)
_MISSING_USER = (
    "a user of its own: the program runs as the trainer's user, so it can read the trainer's "
    "files, and RLIMIT_NPROC counts the trainer's processes too"
)

MISSING_SECCOMP = (
    "seccomp filter (x86_64 only): io_uring, userfaultfd, keyrings, bpf, perf_event_open, "
    "ptrace, mount and namespace calls, memfd and socket families other than AF_UNIX are open "
    "to the program"
)

_MISSING_CGROUP = (
    "a cgroup per run ({why}): a run's memory is bounded per process only (RLIMIT_AS, up to "
    f"{PROCESS_LIMIT} processes; its files by its {SCRATCH_MB} MB tmpfs), and neither its total "
    "CPU nor its share beside other runs is bounded"
)

_probe_lock = threading.Lock()
_warned = False


def isolation() -> Isolation:
    """What isolation this machine gives, probed once per process by real runs of a tiny
    program: namespaces first, else the fallback. Raises ``SandboxError`` when neither runs."""
    with _probe_lock:
        found = probe()
    if isinstance(found, SandboxError):
        raise found
    return found


@functools.cache
def probe() -> Isolation | SandboxError:
    if not sys.platform.startswith("linux"):
        return SandboxError("oncurve.sandbox needs Linux")
    root = os.geteuid() == 0
    found = launch.hierarchy()
    version = found.version if isinstance(found, _cgroup.Hierarchy) else 0
    unbounded = () if version else (_MISSING_CGROUP.format(why=found),)
    full = Isolation(namespaces=True, drops_user=root, missing=unbounded, cgroups=version)
    cause = _try(full)
    if isinstance(cause, Isolation):
        return cause
    if version:  # the cgroup may be what failed: keep the namespaces without it
        unbounded = (_MISSING_CGROUP.format(why=f"a run in one failed: {cause}"),)
        without = _try(dataclasses.replace(full, missing=unbounded, cgroups=0))
        if isinstance(without, Isolation):
            return without
    missing = (_MISSING_NET, _MISSING_MNT, *unbounded) + (() if root else (_MISSING_USER,))
    fallback = Isolation(
        namespaces=False, drops_user=root, missing=(f"({cause})", *missing), cgroups=version
    )
    fallback_cause = _try(fallback)
    if isinstance(fallback_cause, Isolation):
        return fallback_cause
    return SandboxError(f"no sandbox runs here: namespaces: {cause}; fallback: {fallback_cause}")


def _try(candidate: Isolation) -> Isolation | str:
    """``candidate`` when a run under it works, with what that run lacked added to its
    ``missing``; else why it does not work."""
    if candidate.namespaces and shutil.which("unshare") is None:
        return "no unshare command"
    try:
        result = launch.execute(_PROBE_SOURCE, "", 10.0, 256, candidate, OUTPUT_LIMIT)
    except SandboxError as exc:
        return str(exc)
    if result.status != "ok":
        return f"a test run ended {result.status} ({result.reason}): {result.stderr.strip()[-300:]}"
    # the program's /proc/self/status "Seccomp:" field: 2 when a filter is on
    lacked = () if result.stdout.split() == ["2"] else (MISSING_SECCOMP,)
    return dataclasses.replace(candidate, missing=candidate.missing + lacked)


def _warn_if_weak(iso: Isolation) -> None:
    global _warned
    if iso.missing and not _warned:
        _warned = True
        warnings.warn(
            "oncurve.sandbox: this machine gives weaker isolation than intended; missing: "
            + "; ".join(iso.missing),
            RuntimeWarning,
            stacklevel=3,
        )


def check_isolation() -> Isolation:
    """`isolation()`, with a warning (once per process) when it is weaker than full: what a
    trainer calls at the start of a run that will run programs."""
    iso = isolation()
    _warn_if_weak(iso)
    return iso
