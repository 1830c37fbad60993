"""Supervising one run (`Run`): the bootstrap (`_boot.py`) started under its launcher, stdin
fed, stdout, stderr and the bootstrap's status read (stdout cut at the run's `output_bytes`,
stderr at `OUTPUT_LIMIT`), the run stopped at its wall time, output limit or memory limit, its
process tree reaped, and its `SandboxResult` made."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from oncurve.sandbox import _cgroup
from oncurve.sandbox.limits import OUTPUT_LIMIT, SandboxError, SandboxResult

_BOOT = str(Path(__file__).with_name("_boot.py"))
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


class Run:
    """One sandboxed program, from launch to a reaped process tree; its stdout is kept up to
    ``output_bytes`` bytes, its stderr up to ``OUTPUT_LIMIT``, and a byte more stops it."""

    def __init__(
        self,
        launcher: list[str],
        spec: dict,
        stdin: bytes,
        *,
        namespaces: bool,
        output_bytes: int,
        cgroup: _cgroup.RunCgroup | None = None,
    ) -> None:
        self.namespaces = namespaces
        self.cgroup = cgroup
        self.spec = spec
        self.stdin = memoryview(stdin)
        self.out = {"stdout": bytearray(), "stderr": bytearray(), "status": bytearray()}
        self.limits = {"stdout": output_bytes, "stderr": OUTPUT_LIMIT}
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
        limit = self.limits[name]
        self.out[name] += data[: limit + 1 - len(self.out[name])]
        if len(self.out[name]) > limit and self.stop_reason is None:
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
                status, reason = "killed", f"signal {number} ({_signal_name(number)})"
        elif "timeout" in outcome:
            status, reason = "timeout", "wall time"
        else:  # the bootstrap died without a word (the OOM killer, say)
            status = "killed"
            reason = f"sandbox exited with {self.proc.returncode} and no report"
        return SandboxResult(
            stdout=_text(self.out["stdout"], self.limits["stdout"]),
            stderr=_text(self.out["stderr"], self.limits["stderr"]),
            returncode=returncode,
            status=status,
            reason=reason,
            seconds=self.seconds,
        )


def _text(data: bytearray, limit: int) -> str:
    return bytes(data[:limit]).decode("utf-8", errors="replace")


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            line = file.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    return int(line[line.rindex(b")") + 2 :].split()[1])


def _signal_name(number: int) -> str:
    """SIGSEGV, or SIGRTMIN+6 for a real-time signal (Python's enum names only the ends)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIGRTMIN+{number - signal.SIGRTMIN}"
