"""Launching one run: the uid slots of the runs in flight, the interpreter and the package
directories it hides, the cgroup hierarchy, the run's spec, cgroup and working directory
(`execute`, which hands the run to `supervise.Run`), and the sweep of a fallback run's uid."""

from __future__ import annotations

import functools
import glob
import math
import os
import queue
import shutil
import site
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncurve.sandbox import _cgroup
from oncurve.sandbox.limits import (
    FILE_SIZE_LIMIT,
    MAX_PARALLEL,
    OPEN_FILES_LIMIT,
    PROCESS_LIMIT,
    SCRATCH_MB,
    Isolation,
    SandboxError,
    SandboxResult,
)
from oncurve.sandbox.supervise import Run

# Far above login users and the usual subordinate-id ranges of rootless containers (100000+).
UID_BASE = 1 << 30


# Slots number the runs in flight in this process; a run's uid is derived from its slot and
# the process id, so no two live runs on the machine share a uid.
_slots: queue.SimpleQueue[int]


def _reset_slots() -> None:
    global _slots
    _slots = queue.SimpleQueue()
    for slot in range(MAX_PARALLEL):
        _slots.put(slot)


_reset_slots()
# A forked child (the reward worker) has a new pid, hence new uids, and no runs in flight.
os.register_at_fork(after_in_child=_reset_slots)


@contextmanager
def _slot() -> Iterator[int]:
    slot = _slots.get()
    try:
        yield slot
    finally:
        _slots.put(slot)


def _base_python() -> str:
    """The base interpreter: a venv's python would need the venv, which the sandbox hides."""
    candidate = os.path.join(sys.base_prefix, "bin", "python3")
    return os.path.realpath(candidate if os.path.exists(candidate) else sys.executable)


def _interpreter(iso: Isolation) -> str:
    """The program's interpreter. Without a mount namespace to show it the base interpreter,
    a program of its own uid needs one that any user can reach on the host (pyenv's lives
    under /root, mode 0700): the system's python3 then."""
    base = _base_python()
    if iso.namespaces or not iso.drops_user:
        return base
    for candidate in (base, os.path.realpath("/usr/bin/python3")):
        if os.path.exists(candidate) and all(
            os.stat(path).st_mode & stat.S_IXOTH for path in [candidate, *Path(candidate).parents]
        ):
            return candidate
    return base


@functools.cache
def hierarchy() -> _cgroup.Hierarchy | str:
    return _cgroup.find_hierarchy()


@functools.cache
def package_dirs() -> list[str]:
    """Where the base interpreter and the system's Pythons keep third-party packages: the
    sandbox hides them, so that the program gets the standard library only."""
    found = {os.path.realpath(p) for p in site.getsitepackages([sys.base_prefix])}
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages"):
        found.update(os.path.realpath(p) for p in glob.glob(pattern))
    return sorted(p for p in found if os.path.isdir(p))


def execute(
    source: str,
    stdin: str,
    timeout_s: float,
    memory_mb: int,
    iso: Isolation,
    output_bytes: int,
) -> SandboxResult:
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no file of Python source holds it
        where = f"character {exc.start} ({source[exc.start]!r})"
        return SandboxResult(
            stdout="",
            stderr=f"SyntaxError: the source is not valid UTF-8 at {where}\n",
            returncode=None,
            status="error",
            reason="undecodable source",
            seconds=0.0,
        )
    with _slot() as slot:
        uid = UID_BASE + os.getpid() * MAX_PARALLEL + slot if iso.drops_user else None
        workdir = None
        if iso.namespaces:
            flags = [
                "--net",
                "--pid",
                "--mount",
                "--ipc",
                "--uts",
                "--cgroup",
                "--fork",
                "--kill-child",
            ]
            if not iso.drops_user:
                flags = ["--user", "--map-root-user", *flags]
            launcher = ["unshare", *flags, "--"]
            mode = "root-ns" if iso.drops_user else "user-ns"
        else:
            # named by this process, as its cgroups are: another process's are not its leftovers
            workdir = tempfile.mkdtemp(prefix=f"oncurve-sandbox-{os.getpid()}-")
            if uid is not None:
                os.chown(workdir, uid, uid)
            launcher, mode = [], "fallback"
        processes = PROCESS_LIMIT
        if mode == "fallback" and uid is None:
            # Without a user of its own the count includes the trainer's own tasks.
            processes += sum(_processes_of(os.getuid()).values())
        spec = {
            "mode": mode,
            "source": source,
            "timeout_s": timeout_s,
            "uid": uid,
            "python": _interpreter(iso),
            "prefix": os.path.realpath(sys.base_prefix),
            "hidden": package_dirs(),
            "cgroup_procs": [],
            "workdir": workdir,
            "scratch_mb": SCRATCH_MB,
            "limits": {
                "RLIMIT_CPU": math.ceil(timeout_s) + 1,
                "RLIMIT_AS": memory_mb * 1024 * 1024,
                "RLIMIT_FSIZE": FILE_SIZE_LIMIT,
                "RLIMIT_NOFILE": OPEN_FILES_LIMIT,
                "RLIMIT_NPROC": processes,
                "RLIMIT_CORE": 0,
            },
        }
        cgroup = None
        try:
            if iso.cgroups:
                # the program's address space, and the tmpfs whose pages it fills
                memory = (memory_mb + SCRATCH_MB) * 1024 * 1024
                try:
                    cgroup = _cgroup.RunCgroup(hierarchy(), memory, PROCESS_LIMIT)
                except OSError as exc:
                    raise SandboxError(f"cannot make the run's cgroup: {exc}") from exc
                spec["cgroup_procs"] = cgroup.procs
            stdin_bytes = stdin.encode("utf-8", "surrogatepass")  # as main.py's text (_boot.py)
            run = Run(
                launcher,
                spec,
                stdin_bytes,
                namespaces=iso.namespaces,
                output_bytes=output_bytes,
                cgroup=cgroup,
            )
            return run.finish()
        finally:
            if cgroup is not None:
                cgroup.remove()
            if uid is not None and not iso.namespaces:
                # A PID namespace takes its processes with it; a fallback run gets a sweep of
                # its uid in case the bootstrap itself was killed before it could clean up.
                _sweep(uid, spec["python"])
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


def _processes_of(uid: int) -> dict[int, int]:
    """PID -> thread count of the processes whose real uid is ``uid``. Read from the status
    file: the owner of /proc/PID turns root when a process makes itself undumpable."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as file:
                fields = dict(line.split(":", 1) for line in file if ":" in line)
        except OSError:  # exited meanwhile
            continue
        if int(fields["Uid"].split()[0]) == uid:
            found[int(entry)] = int(fields["Threads"])
    return found


def _sweep(uid: int, python: str) -> None:
    """Kill every process of ``uid``: kill(-1) from that uid reaches them all at once, so a
    fork bomb cannot outrun it."""
    for _ in range(10):
        if not _processes_of(uid):
            return
        subprocess.run(
            [python, "-I", "-S", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            check=False,
        )
        time.sleep(0.01)
