"""Run a Python program a model wrote, confined, and report what it did.

``run_python(source, stdin, timeout_s, memory_mb) -> SandboxResult`` runs ``source`` as
``__main__`` with ``stdin`` as its input, in a fresh process of the base interpreter (standard
library only), and returns its stdout and stderr (each cut at ``OUTPUT_LIMIT`` bytes), exit
status, wall time and why it stopped. It never raises for anything the program does; it raises
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
- a seccomp filter (``_boot.py``) that refuses the kernel interfaces a test program never
  needs: io_uring, userfaultfd, keyrings, bpf, perf, ptrace, mount and namespace calls, memfd
  and SysV IPC, flock and inotify, sockets other than AF_UNIX;
- a cgroup (``_cgroup.py``: v2 where delegated, else v1) that bounds the memory, CPU and tasks
  of all its processes together; a process killed at its memory limit ends the run ("killed");
- rlimits with soft = hard, so they cannot be raised back: CPU time, address space
  (``memory_mb``), file size, open files, processes, no core files; ``no_new_privs``;
- a clean environment (PATH, HOME, TMPDIR, LANG: nothing of the trainer's, no credentials);
- its own session and process group, killed whole at the wall time or the output limit.

Without namespaces (a container that forbids them, or a non-root user without user
namespaces) it falls back to a host temporary directory and an audit hook that refuses sockets.
Whatever is missing (namespaces, the filter, a cgroup) it names in one warning per process.
``_boot.py`` is the first stage that builds all this; `docs/sandbox.md` has the
attacks it was tested against.

``SandboxPool(workers)`` runs many programs at once: threads that each wait on one sandbox.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import math
import os
import queue
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

from oncurve.sandbox import _cgroup

OUTPUT_LIMIT = 64 * 1024  # bytes kept of stdout and of stderr; more stops the run
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # bytes, per file the program writes
OPEN_FILES_LIMIT = 64
PROCESS_LIMIT = 32  # processes and threads of one run
SCRATCH_MB = 64  # the tmpfs that holds everything a namespaced run writes
MAX_PARALLEL = 64  # runs at once per trainer process (each needs a uid of its own)

_BOOT = str(Path(__file__).with_name("_boot.py"))
# Far above login users and the usual subordinate-id ranges of rootless containers (100000+).
_UID_BASE = 1 << 30
# The trainer stops a run at its wall time plus this: the bootstrap's own timer, which starts
# when the program does, normally ends it first.
_BACKSTOP_S = 1.0
# After the first SIGTERM or kill, how long the bootstrap gets before the whole group is killed.
_STOP_GRACE_S = 1.0
# The most the trainer waits for the kernel to tear a killed run's PID namespace down (on a
# loaded machine, dozens of killed processes can take more than a second to go).
_TEARDOWN_S = 10.0
# How often the trainer reads a run's cgroup for a process killed at its memory limit.
_OOM_POLL_S = 0.05
_PROBE_SOURCE = (
    "for line in open('/proc/self/status'):\n"
    "    if line.startswith('Seccomp:'):\n"
    "        print(line.split()[1])\n"
)


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

_MISSING_SECCOMP = (
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
        found = _probe()
    if isinstance(found, SandboxError):
        raise found
    return found


@functools.cache
def _probe() -> Isolation | SandboxError:
    if not sys.platform.startswith("linux"):
        return SandboxError("oncurve.sandbox needs Linux")
    root = os.geteuid() == 0
    found = _hierarchy()
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
        result = _execute(_PROBE_SOURCE, "", 10.0, 256, candidate)
    except SandboxError as exc:
        return str(exc)
    if result.status != "ok":
        return f"a test run ended {result.status} ({result.reason}): {result.stderr.strip()[-300:]}"
    # the program's /proc/self/status "Seccomp:" field: 2 when a filter is on
    lacked = () if result.stdout.split() == ["2"] else (_MISSING_SECCOMP,)
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


def run_python(
    source: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512
) -> SandboxResult:
    """Run ``source`` in a sandbox with ``stdin`` as input; see the module docstring."""
    _check_args(source, stdin, timeout_s, memory_mb)
    return _execute(source, stdin, timeout_s, memory_mb, check_isolation())


def _check_args(source: str, stdin: str, timeout_s: float, memory_mb: int) -> None:
    if not isinstance(source, str) or not isinstance(stdin, str):
        raise TypeError("source and stdin must be str")
    if not (isinstance(timeout_s, int | float) and 0 < timeout_s < math.inf):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not (isinstance(memory_mb, int) and memory_mb > 0):
        raise ValueError(f"memory_mb must be a positive integer, got {memory_mb!r}")


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
        self, source: str, stdin: str = "", *, timeout_s: float = 5.0, memory_mb: int = 512
    ) -> Future[SandboxResult]:
        """Queue one run; the future holds its ``SandboxResult``."""
        _check_args(source, stdin, timeout_s, memory_mb)
        return self._executor.submit(run_python, source, stdin, timeout_s, memory_mb)

    def map(
        self,
        sources: Iterable[str],
        stdins: Iterable[str] | None = None,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
    ) -> list[SandboxResult]:
        """Run every source (with the matching stdin, if given); results in input order."""
        sources = list(sources)
        stdins = [""] * len(sources) if stdins is None else list(stdins)
        if len(stdins) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(stdins)} stdins")
        futures = [
            self.submit(s, i, timeout_s=timeout_s, memory_mb=memory_mb)
            for s, i in zip(sources, stdins, strict=True)
        ]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Wait for the runs in flight and stop the threads."""
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
def _hierarchy() -> _cgroup.Hierarchy | str:
    return _cgroup.find_hierarchy()


@functools.cache
def _package_dirs() -> list[str]:
    """Where the base interpreter and the system's Pythons keep third-party packages: the
    sandbox hides them, so that the program gets the standard library only."""
    found = {os.path.realpath(p) for p in site.getsitepackages([sys.base_prefix])}
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages"):
        found.update(os.path.realpath(p) for p in glob.glob(pattern))
    return sorted(p for p in found if os.path.isdir(p))


def _execute(
    source: str, stdin: str, timeout_s: float, memory_mb: int, iso: Isolation
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
        uid = _UID_BASE + os.getpid() * MAX_PARALLEL + slot if iso.drops_user else None
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
            workdir = tempfile.mkdtemp(prefix="oncurve-sandbox-")
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
            "hidden": _package_dirs(),
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
                    cgroup = _cgroup.RunCgroup(_hierarchy(), memory, PROCESS_LIMIT)
                except OSError as exc:
                    raise SandboxError(f"cannot make the run's cgroup: {exc}") from exc
                spec["cgroup_procs"] = cgroup.procs
            stdin_bytes = stdin.encode("utf-8", "surrogatepass")  # as main.py's text (_boot.py)
            run = _Run(launcher, spec, stdin_bytes, namespaces=iso.namespaces, cgroup=cgroup)
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


class _Run:
    """One sandboxed program, from launch to a reaped process tree."""

    def __init__(
        self,
        launcher: list[str],
        spec: dict,
        stdin: bytes,
        *,
        namespaces: bool,
        cgroup: _cgroup.RunCgroup | None = None,
    ) -> None:
        self.namespaces = namespaces
        self.cgroup = cgroup
        self.spec = spec
        self.stdin = memoryview(stdin)
        self.out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
        self.stop_reason: str | None = None
        self.init_pidfd: int | None = None
        spec_fd = os.memfd_create("oncurve-sandbox-spec")
        # The launcher's stderr is the status channel (see _boot.py); the program's stderr
        # travels as a separate descriptor.
        status_r, status_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            os.write(spec_fd, json.dumps(spec).encode())
            os.lseek(spec_fd, 0, os.SEEK_SET)
            argv = [*launcher, spec["python"], "-I", "-S", _BOOT, str(spec_fd), str(stderr_w)]
            self.start = time.monotonic()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=status_w,
                pass_fds=(spec_fd, stderr_w),
                env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
                cwd="/",
                start_new_session=True,
            )
        except BaseException as exc:
            os.close(status_r)
            os.close(stderr_r)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot start the sandbox: {exc}") from exc
            raise
        finally:
            for fd in (spec_fd, status_w, stderr_w):
                os.close(fd)
        os.set_blocking(status_r, False)
        self.status_fd = status_r
        self.stderr_fd = stderr_r
        self.pidfd = os.pidfd_open(self.proc.pid)

    def finish(self) -> SandboxResult:
        try:
            self._watch()
        finally:
            self._reap()
        return self._result()

    def _watch(self) -> None:
        """Feed stdin, collect output, stop the run at its deadline or output limit."""
        proc = self.proc
        streams = {proc.stdout.fileno(): "stdout", self.stderr_fd: "stderr"}
        streams[self.status_fd] = "status"
        sel = selectors.DefaultSelector()
        for fd in [*streams, self.pidfd]:
            sel.register(fd, selectors.EVENT_READ)
        stdin_fd = proc.stdin.fileno() if self.stdin else None
        if stdin_fd is None:
            proc.stdin.close()
        else:
            os.set_blocking(stdin_fd, False)
            sel.register(stdin_fd, selectors.EVENT_WRITE)
        wall = self.start + self.spec["timeout_s"] + _BACKSTOP_S
        stopped_at = exited_at = None
        group_killed = False
        with sel:
            while streams or exited_at is None:
                now = time.monotonic()
                if stopped_at is None and now >= wall:
                    self._stop("wall time")
                if stopped_at is None and self.cgroup is not None and self.cgroup.oom_kills():
                    # The kernel killed a process of the run at its memory limit: the run ends.
                    self._stop("memory limit")
                if self.stop_reason is not None and stopped_at is None:
                    stopped_at = now
                if (
                    stopped_at is not None
                    and not group_killed
                    and now >= stopped_at + _STOP_GRACE_S
                ):
                    group_killed = True
                    self._kill_group()
                # Only in the fallback can a pipe outlive the bootstrap (held by a process that
                # escaped it): then stop reading and let the uid sweep end that process.
                if exited_at is not None and now >= exited_at + _STOP_GRACE_S:
                    break
                if exited_at is not None:
                    until = exited_at + _STOP_GRACE_S
                elif stopped_at is None:
                    until = wall
                elif not group_killed:
                    until = stopped_at + _STOP_GRACE_S
                else:  # SIGKILL sent to all: nothing left to do but wait for the exit
                    until = now + _STOP_GRACE_S
                if self.cgroup is not None and stopped_at is None:
                    until = min(until, now + _OOM_POLL_S)
                for key, _ in sel.select(max(until - now, 0.0)):
                    if key.fd == self.pidfd:
                        sel.unregister(key.fd)
                        exited_at = time.monotonic()
                    elif key.fd == stdin_fd:
                        self._feed(sel)
                    else:
                        self._read(sel, streams, key.fd)

    def _read(self, sel: selectors.BaseSelector, streams: dict[int, str], fd: int) -> None:
        data = os.read(fd, 65536)
        name = streams[fd]
        if not data:
            sel.unregister(fd)
            del streams[fd]
            return
        if name == "status":
            self.out[name] += data
            self._read_status()
            return
        # One byte past the limit is enough to know it was passed.
        self.out[name] += data[: OUTPUT_LIMIT + 1 - len(self.out[name])]
        if len(self.out[name]) > OUTPUT_LIMIT and self.stop_reason is None:
            self._stop("output limit")

    def _feed(self, sel: selectors.BaseSelector) -> None:
        stdin = self.proc.stdin
        try:
            written = os.write(stdin.fileno(), self.stdin[:65536])
        except BlockingIOError:
            return
        except BrokenPipeError:  # the program closed its stdin: what it did not read is dropped
            written = len(self.stdin)
        self.stdin = self.stdin[written:]
        if not self.stdin:
            sel.unregister(stdin.fileno())
            stdin.close()

    def _read_status(self) -> None:
        """Open a pidfd on the namespace's init as soon as it says who it is."""
        if self.init_pidfd is not None or not self.namespaces:
            return
        first, sep, _ = self.out["status"].partition(b"\n")
        if not sep:
            return
        pid = json.loads(first)["pid"]
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        # The pid is init's only while it is the child of our unreaped unshare (whose pid
        # nobody can reuse); after that it may name a stranger.
        if _parent_of(pid) == self.proc.pid:
            self.init_pidfd = pidfd
        else:
            os.close(pidfd)

    def _stop(self, reason: str) -> None:
        self.stop_reason = reason
        if self.cgroup is not None:
            self.cgroup.unthrottle()
        if self.namespaces and self.init_pidfd is None:
            # init's first line may be waiting in the pipe, behind the output that stops it.
            with suppress(BlockingIOError):
                self.out["status"] += os.read(self.status_fd, 65536)
            self._read_status()
        if self.namespaces and self.init_pidfd is None:
            # init has not started the program yet: the group is everything there is.
            self._kill_group()
            return
        with suppress(ProcessLookupError):  # it may have just exited on its own
            if self.namespaces:
                # Killing init tears the PID namespace down; unshare exits once it is gone.
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            else:
                # The bootstrap kills every descendant of the program (it is their subreaper).
                signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)

    def _kill_group(self) -> None:
        # Safe from pgid reuse: the leader is our child and not reaped yet.
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def _reap(self) -> None:
        proc = self.proc
        if self.cgroup is not None:
            self.cgroup.unthrottle()
        if proc.poll() is None:
            if self.stop_reason is None:  # interrupted (KeyboardInterrupt...): leave nothing
                self._stop("interrupted")
            try:
                proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._kill_group()
                proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        for fd in (self.stderr_fd, self.status_fd, self.pidfd):
            os.close(fd)
        if self.init_pidfd is not None:
            # init's pidfd turns readable only after the kernel has killed and reaped every
            # process of its namespace: then nothing of the run is left.
            with selectors.DefaultSelector() as sel:
                sel.register(self.init_pidfd, selectors.EVENT_READ)
                sel.select(_TEARDOWN_S)
            os.close(self.init_pidfd)
        self.seconds = time.monotonic() - self.start

    def _result(self) -> SandboxResult:
        messages, errors = [], []
        for line in self.out["status"].decode(errors="replace").splitlines():
            if line.startswith("{"):
                messages.append(json.loads(line))
                errors += [messages[-1]["error"]] if "error" in messages[-1] else []
            elif line.strip():  # unshare's own complaint, or the bootstrap's traceback
                errors.append(line)
        outcome = messages[-1] if len(messages) > 1 else {}
        if errors and self.stop_reason is None:
            raise SandboxError("; ".join(errors)[-2000:])
        returncode = None
        if self.stop_reason is not None:
            killed = self.stop_reason in ("output limit", "memory limit")
            status = "killed" if killed else "timeout"
            reason = self.stop_reason
        elif "exit" in outcome:
            returncode = outcome["exit"]
            status, reason = ("ok" if returncode == 0 else "error"), "exit"
        elif "signal" in outcome:
            number = outcome["signal"]
            returncode = -number
            # SIGXCPU comes from the soft CPU limit (the program may lower it); SIGKILL from the
            # hard one, which the program's CPU time then shows it reached.
            cpu_limit = self.spec["limits"]["RLIMIT_CPU"]
            at_limit = number == signal.SIGKILL and outcome["cpu"] >= cpu_limit - 0.05
            if number == signal.SIGXCPU or at_limit:
                status, reason = "timeout", "cpu time"
            else:
                status, reason = "killed", f"signal {number} ({signal.Signals(number).name})"
        elif "timeout" in outcome:
            status, reason = "timeout", "wall time"
        else:  # the bootstrap died without a word (the OOM killer, say)
            status = "killed"
            reason = f"sandbox exited with {self.proc.returncode} and no report"
        return SandboxResult(
            stdout=_text(self.out["stdout"]),
            stderr=_text(self.out["stderr"]),
            returncode=returncode,
            status=status,
            reason=reason,
            seconds=self.seconds,
        )


def _text(data: bytearray) -> str:
    return bytes(data[:OUTPUT_LIMIT]).decode("utf-8", errors="replace")


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            line = file.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return int(line[line.rindex(b")") + 2 :].split()[1])


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
