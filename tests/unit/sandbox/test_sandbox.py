"""oncurve.sandbox against hostile programs.

Each attack checks three things: the result (status, reason, output); that the attack failed
(the program reports what it tried and got, or the host shows no trace of it); and, through
the `host` fixture, that the machine is as it was: no process of the run left (by uid, by a
marker in its command line, no bootstrap), no descriptor or mount of the test process leaked,
nothing new in /tmp, and the sandbox still runs a program.

The tests that need namespaces skip where `isolation()` says there are none. Two fixtures
force the other modes on a root machine that has namespaces: `fallback` (no namespaces, a uid
of its own, the audit hook) and `user_ns` (what a non-root trainer gets).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncurve import sandbox
from oncurve.sandbox import launch, probing


def _isolation() -> sandbox.Isolation | None:
    try:
        return sandbox.isolation()
    except sandbox.SandboxError:
        return None


ISO = _isolation()
ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(ISO is None, reason="no sandbox runs on this machine")
needs_namespaces = pytest.mark.skipif(
    ISO is None or not ISO.namespaces,
    reason="the machine gives no namespaces (see oncurve.sandbox.isolation())",
)
_SECCOMP_SPEC = importlib.util.spec_from_file_location(
    "sandbox_seccomp", Path(sandbox.__file__).with_name("_seccomp.py")
)
SECCOMP = importlib.util.module_from_spec(_SECCOMP_SPEC)
_SECCOMP_SPEC.loader.exec_module(SECCOMP)  # the filter, as the bootstrap loads it: by its path
FIRST_UID = launch.UID_BASE + os.getpid() * sandbox.MAX_PARALLEL


def _proc_entries() -> Iterator[tuple[int, dict[str, str], str]]:
    """(pid, status fields, command line) of every process on the machine."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        yield int(entry), fields, cmdline


def _leftovers(marker: str) -> list[str]:
    """Processes of this test process's runs: by uid, by marker, or our own bootstraps."""
    found = []
    for pid, fields, cmdline in _proc_entries():
        uid = int(fields["Uid"].split()[0])
        ours = int(fields["PPid"]) == os.getpid() and (
            "_boot.py" in cmdline or "unshare" in cmdline
        )
        if FIRST_UID <= uid < FIRST_UID + sandbox.MAX_PARALLEL or marker in cmdline or ours:
            found.append(f"{pid} uid={uid} {cmdline}")
    return found


def _shmem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def _cgroups_left() -> list[str]:
    """The run cgroups of this test process still on the machine."""
    hierarchy = launch.hierarchy()
    parents = hierarchy.parents if isinstance(hierarchy, sandbox._cgroup.Hierarchy) else ()
    prefix = f"oncurve-sandbox-{os.getpid()}-"
    return [f"{p}/{n}" for p in parents for n in os.listdir(p) if n.startswith(prefix)]


@pytest.fixture
def host() -> Iterator[str]:
    """A marker for the test's program; afterwards, checks that the machine is as it was."""
    marker = f"oncurve-attack-{uuid.uuid4().hex}"
    fds = sorted(os.listdir("/proc/self/fd"))
    mounts = Path("/proc/self/mountinfo").read_text()
    tmp = set(os.listdir("/tmp"))
    segments = [Path(f"/proc/sysvipc/{kind}").read_text() for kind in ("shm", "msg", "sem")]
    yield marker
    assert _leftovers(marker) == []
    assert sorted(os.listdir("/proc/self/fd")) == fds
    assert Path("/proc/self/mountinfo").read_text() == mounts
    new = set(os.listdir("/tmp")) - tmp
    ours = f"oncurve-sandbox-{os.getpid()}-"  # a second test worker makes its own meanwhile
    assert [name for name in new if marker in name or name.startswith(ours)] == []
    assert _cgroups_left() == []
    assert [Path(f"/proc/sysvipc/{kind}").read_text() for kind in ("shm", "msg", "sem")] == segments
    assert sandbox.run_python("print(6 * 7)").stdout == "42\n"


@pytest.fixture
def fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as a machine without namespaces would: host directory, audit hook, a uid of its own."""
    if not ROOT:
        pytest.skip("the fallback tests need root, to give the program a uid of its own")
    iso = sandbox.Isolation(namespaces=False, drops_user=True, missing=("forced by the test",))
    monkeypatch.setattr(probing, "isolation", lambda: iso)
    monkeypatch.setattr(probing, "_warned", True)  # the warning has a test of its own


@pytest.fixture
def user_ns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as a non-root trainer would: user namespace, uid 1000 of a nested one inside."""
    if not (ROOT and ISO is not None and ISO.namespaces):
        pytest.skip("forcing user-namespace mode needs root and namespaces")
    iso = sandbox.Isolation(namespaces=True, drops_user=False, missing=())
    monkeypatch.setattr(probing, "isolation", lambda: iso)


def test_isolation_on_this_machine() -> None:
    assert ISO is not None
    if ISO.namespaces:
        # what namespaces may still lack: the filter (another architecture), a cgroup
        assert all(line.startswith(("a cgroup", "seccomp filter")) for line in ISO.missing)
    else:
        assert any("network namespace" in line for line in ISO.missing)
    assert (ISO.cgroups == 0) == any(line.startswith("a cgroup") for line in ISO.missing)
    assert ISO.drops_user == ROOT
    assert sandbox.isolation() is ISO  # probed once


def test_program_reads_stdin_and_writes_stdout(host: str) -> None:
    # More input than a pipe holds: the trainer feeds it while the program reads.
    source = (
        "import sys\ntext = sys.stdin.read()\n"
        "print(len(text), text[::-1][:6])\nprint('warn', file=sys.stderr)"
    )
    result = sandbox.run_python(source, stdin="abc" * 100_000)
    assert result.stdout == "300000 cbacba\n"
    assert result.stderr == "warn\n"
    assert (result.status, result.reason, result.returncode) == ("ok", "exit", 0)
    assert result.seconds > 0


@pytest.mark.parametrize(
    ("source", "status", "reason", "returncode", "stderr"),
    [
        ("def f(:\n    pass\n", "error", "exit", 1, "SyntaxError"),
        ("raise KeyError('boom')", "error", "exit", 1, "KeyError: 'boom'"),
        ("exit(3)", "error", "exit", 3, ""),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
            "killed",
            "signal 11 (SIGSEGV)",
            -11,
            "",
        ),
        # a real-time signal has no name of its own in Python's enum
        ("import os\nos.kill(os.getpid(), 40)", "killed", "signal 40 (SIGRTMIN+6)", -40, ""),
    ],
)
def test_program_failures(
    host: str, source: str, status: str, reason: str, returncode: int, stderr: str
) -> None:
    result = sandbox.run_python(source)
    assert (result.status, result.reason, result.returncode) == (status, reason, returncode)
    assert stderr in result.stderr


def test_program_runs_as_main(host: str) -> None:
    # __main__ is the program's own module (pickle finds its functions), with nothing of the
    # runner left in it, and quit() works as with a plain `python main.py`.
    source = (
        "import pickle\n"
        "def inc(x):\n    return x + 1\n"
        "names = sorted(k for k in globals() if not k.startswith('__'))\n"
        "print(pickle.loads(pickle.dumps(inc))(1), names, __name__)\n"
        "quit(4)\n"
    )
    result = sandbox.run_python(source)
    assert result.stdout == "2 ['inc', 'pickle'] __main__\n"
    assert result.returncode == 4


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        sandbox.run_python("pass", memory_mb=0)
    for output_bytes in (0, sandbox.FILE_SIZE_LIMIT + 1, 1.5):
        with pytest.raises(ValueError, match="output_bytes"):
            sandbox.run_python("pass", output_bytes=output_bytes)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sandbox.run_python(b"pass")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers"):
        sandbox.SandboxPool(0)


def test_infinite_loop_stops_at_wall_time(host: str) -> None:
    result = sandbox.run_python("while True:\n    pass", timeout_s=1.0)
    assert (result.status, result.reason, result.returncode) == ("timeout", "wall time", None)
    assert result.seconds >= 1.0


def test_cpu_limit_stops_the_program(host: str) -> None:
    # The program may lower its own soft limit: then SIGXCPU, reported as CPU time.
    source = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (1, resource.getrlimit(resource.RLIMIT_CPU)[1]))\n"
        "while True:\n    pass\n"
    )
    result = sandbox.run_python(source, timeout_s=5.0)
    assert (result.status, result.reason, result.returncode) == ("timeout", "cpu time", -24)


def test_fork_bomb_stops_at_the_process_limit(host: str) -> None:
    source = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(n, exc.errno)\n"
    )
    result = sandbox.run_python(source, timeout_s=5.0)
    assert result.status == "ok", result
    forked, err = map(int, result.stdout.split())
    assert forked < sandbox.PROCESS_LIMIT
    assert err == errno.EAGAIN
    # The 60-second sleepers died with the run: `host` finds none of its uid.


def test_endless_fork_bomb_is_killed_whole(host: str) -> None:
    source = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = sandbox.run_python(source, timeout_s=1.0)
    assert (result.status, result.reason) == ("timeout", "wall time")


@pytest.mark.parametrize(
    "source",
    [
        "x = bytearray(10 * 2**30)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(2**26))",
    ],
    ids=["at-once", "in-steps"],
)
def test_allocating_10gb_fails(host: str, source: str) -> None:
    result = sandbox.run_python(source, memory_mb=256)
    assert (result.status, result.returncode) == ("error", 1)
    assert result.stderr.rstrip().endswith("MemoryError")


def test_writing_a_10gb_file_fails(host: str) -> None:
    source = (
        "chunk = b'0' * 2**20\n"
        "with open('big', 'wb') as f:\n"
        "    for _ in range(10 * 1024):\n"
        "        f.write(chunk)\n"
    )
    result = sandbox.run_python(source)
    assert (result.status, result.returncode) == ("error", 1)
    assert "File too large" in result.stderr


@needs_namespaces
def test_filling_the_scratch_space_fails_and_frees_it(host: str) -> None:
    # Files under the per-file limit, until the run's tmpfs is full; its memory goes with it.
    source = (
        "import os\n"
        "chunk, written = b'0' * 2**20, 0\n"
        "try:\n"
        "    for i in range(100):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            for _ in range(15):\n"
        "                f.write(chunk)\n"
        "                written += len(chunk)\n"
        "finally:\n"
        "    print(written // 2**20)\n"
    )
    before = _shmem_mb()
    result = sandbox.run_python(source)
    assert result.status == "error"
    assert "No space left on device" in result.stderr
    written = int(result.stdout)
    assert sandbox.SCRATCH_MB - 8 <= written <= sandbox.SCRATCH_MB
    assert _shmem_mb() < before + written // 2


@needs_namespaces
def test_writing_outside_its_directory_fails(host: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o777)
    home = Path.home()
    targets = [
        f"/tmp/../etc/{host}",
        f"{run_dir}/{host}",
        f"{home}/{host}",
        f"/{host}",
        f"/usr/{host}",
        f"{sys.base_prefix}/{host}",
        f"/sandbox/../{host}",
    ]
    source = (
        f"targets = {targets!r}\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('x')\n"
        "        print(path, 'written')\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
        f"open('/tmp/{host}', 'w').write('its own /tmp')\n"
        f"print(open('/tmp/{host}').read())\n"
    )
    result = sandbox.run_python(source)
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    assert lines[-1] == "its own /tmp"
    for path, line in zip(targets, lines, strict=False):
        assert line.startswith(path + " ") and not line.endswith("written"), line
    for path in [*targets, f"/tmp/{host}"]:
        assert not os.path.exists(os.path.normpath(path)), path


@needs_namespaces
def test_reading_the_trainers_environment_and_files_fails(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_secret, file_secret = uuid.uuid4().hex, uuid.uuid4().hex
    monkeypatch.setenv("ONCURVE_TEST_SECRET", env_secret)
    tmp_path.chmod(0o755)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(file_secret)
    secret_file.chmod(0o644)
    repo_file = Path(sandbox.__file__).resolve()
    paths = [str(secret_file), str(repo_file), "/proc/1/environ", "/etc/passwd", "/root/.bashrc"]
    source = (
        "import os\n"
        "print(sorted(os.environ))\n"
        "print(open('/proc/self/environ', 'rb').read())\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n"
        "        print(path, type(exc).__name__)\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            print(pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError as exc:\n"
        "            print(pid, type(exc).__name__)\n"
    )
    result = sandbox.run_python(source)
    assert result.status == "ok", result
    assert env_secret not in result.stdout + result.stderr
    assert file_secret not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    for path in paths:
        line = next(line for line in lines if line.startswith(path + " "))
        assert line.split()[-1] in ("FileNotFoundError", "PermissionError"), line


def _connect_source(port: int) -> str:
    return (
        "import socket\n"
        "for kind, attempt in [\n"
        f"    ('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1)),\n"
        f"    ('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))),\n"
        "    ('listen', lambda: socket.create_server(('127.0.0.1', 0)).getsockname()),\n"
        "]:\n"
        "    try:\n"
        "        print(kind, 'done', attempt())\n"
        "    except OSError as exc:\n"
        "        print(kind, type(exc).__name__, exc.errno)\n"
    )


def _assert_no_connection() -> list[str]:
    """Run _connect_source against a TCP and a UDP server of ours; they receive nothing."""
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
    ):
        port = server.getsockname()[1]
        udp.bind(("127.0.0.1", port))
        result = sandbox.run_python(_connect_source(port))
        server.settimeout(0.3)
        with pytest.raises(TimeoutError):
            server.accept()
        udp.settimeout(0.3)
        with pytest.raises(TimeoutError):
            udp.recvfrom(16)
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["tcp", "udp", "listen"]
    return lines


@needs_namespaces
def test_socket_to_localhost_fails(host: str) -> None:
    lines = _assert_no_connection()
    # The seccomp filter refuses every family but AF_UNIX; without it, no interface is up in
    # the run's network namespace (loopback included), and a socket could only fail to route.
    refused = errno.ENETUNREACH if probing.MISSING_SECCOMP in ISO.missing else errno.EAFNOSUPPORT
    assert lines[:2] == [f"tcp OSError {refused}", f"udp OSError {refused}"]


def detached_grandchild(host: str) -> str:
    """A program that double-forks a grandchild into a new session, which sleeps with `host`
    (the test's marker) in its command line, and waits for its child."""
    return (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {host!r}])\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )


def test_detached_child_dies_with_the_run(host: str) -> None:
    # Double fork and a new session; the grandchild keeps stdout open and sleeps.
    source = detached_grandchild(host) + "print('parent done')\n"
    result = sandbox.run_python(source, timeout_s=5.0)
    # "ok" and not "timeout": the run ended with the program, not with the grandchild.
    assert (result.status, result.stdout) == ("ok", "parent done\n"), result


def test_printing_1gb_is_cut_and_stopped(host: str) -> None:
    source = "import sys\nchunk = 'x' * 2**20\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    result = sandbox.run_python(source, timeout_s=5.0)
    assert (result.status, result.reason, result.returncode) == ("killed", "output limit", None)
    assert result.stdout == "x" * sandbox.OUTPUT_LIMIT


def test_a_larger_stdout_limit_keeps_that_much_and_stops_past_it(host: str) -> None:
    limit = 3 * sandbox.OUTPUT_LIMIT
    exact = f"import sys\nsys.stdout.write('x' * {limit})\n"
    endless = "import sys\nwhile True:\n    sys.stdout.write('x' * 4096)\n"
    with sandbox.SandboxPool(2) as pool:
        kept, stopped = pool.map([exact, endless], timeout_s=5.0, output_bytes=[limit, limit])
        default = pool.submit(exact, timeout_s=5.0).result()
        with pytest.raises(ValueError, match="2 sources but 1 output_bytes"):
            pool.map([exact, endless], output_bytes=[limit])
    assert (kept.status, kept.stdout) == ("ok", "x" * limit)
    assert (stopped.status, stopped.reason) == ("killed", "output limit")
    assert stopped.stdout == "x" * limit
    assert (default.reason, len(default.stdout)) == ("output limit", sandbox.OUTPUT_LIMIT)
    # stderr keeps its own limit
    noisy = "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n"
    result = sandbox.run_python(noisy, timeout_s=5.0, output_bytes=limit)
    assert (result.reason, result.stderr) == ("output limit", "e" * sandbox.OUTPUT_LIMIT)


def test_printing_to_stderr_is_cut_too(host: str) -> None:
    source = "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n"
    result = sandbox.run_python(source, timeout_s=5.0)
    assert (result.status, result.reason) == ("killed", "output limit")
    assert result.stderr == "e" * sandbox.OUTPUT_LIMIT


@pytest.mark.parametrize(
    ("source", "stdout"),
    [
        ("import os, time\nos.close(0)\nos.close(1)\nos.close(2)\ntime.sleep(0.3)\n", ""),
        (
            "import os\nprint('before', flush=True)\n"
            "os.dup2(os.open('out.txt', os.O_WRONLY | os.O_CREAT), 1)\n"
            "os.dup2(os.open('/dev/null', os.O_RDONLY), 0)\nprint('after')\n",
            "before\n",
        ),
    ],
    ids=["closed", "redirected"],
)
def test_closing_or_redirecting_stdio(host: str, source: str, stdout: str) -> None:
    result = sandbox.run_python(source, stdin="unread input")
    assert (result.status, result.reason, result.stdout) == ("ok", "exit", stdout), result


def test_killing_its_parent_and_others_fails(host: str) -> None:
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        targets = {"parent": "os.getppid()", "init": "1", "everyone": "-1"}
        targets |= {"trainer": str(os.getpid()), "sentinel": str(sentinel.pid)}
        source = "import os, signal\n" + "".join(
            f"try:\n    os.kill({pid}, signal.SIGKILL)\n    print({name!r}, 'sent')\n"
            f"except OSError as exc:\n    print({name!r}, type(exc).__name__)\n"
            for name, pid in targets.items()
        )
        result = sandbox.run_python(source)
        assert result.status == "ok", result
        for line in result.stdout.splitlines():
            assert line.split()[1] in ("PermissionError", "ProcessLookupError"), line
        assert len(result.stdout.splitlines()) == len(targets)
        assert sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()


def test_raising_limits_back_fails(host: str) -> None:
    source = (
        "import os, resource\n"
        "for name in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE'):\n"
        "    which = getattr(resource, name)\n"
        "    try:\n"
        "        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        print(name, 'raised')\n"
        "    except (ValueError, OSError) as exc:\n"
        "        print(name, type(exc).__name__)\n"
        "try:\n"
        "    os.setuid(0)\n"
        "    print('setuid raised')\n"
        "except OSError as exc:\n"
        "    print('setuid', type(exc).__name__)\n"
        "x = bytearray(10 * 2**30)\n"
    )
    result = sandbox.run_python(source)
    lines = result.stdout.splitlines()
    # uid 0 does not exist in a run's user namespace (EINVAL); the fallback has none (EPERM)
    setuid = "OSError" if ISO.namespaces else "PermissionError"
    assert [line.split()[1] for line in lines] == ["ValueError"] * 5 + [setuid]
    assert (result.status, result.returncode) == ("error", 1)
    assert result.stderr.rstrip().endswith("MemoryError")


def test_pool_runs_in_parallel_with_a_uid_each(host: str) -> None:
    # the uid outside its user namespace: the second field of its uid_map
    source = (
        "import os, sys, time\ntime.sleep(0.5)\n"
        "print(sys.stdin.read(), open('/proc/self/uid_map').read().split()[1], os.getuid())"
    )
    with sandbox.SandboxPool(4) as pool:
        results = pool.map([source] * 4, [f"run{i}" for i in range(4)], timeout_s=5.0)
        extra = pool.submit("print('submitted')").result()
    assert [r.stdout.split()[0] for r in results] == ["run0", "run1", "run2", "run3"]
    assert extra.stdout == "submitted\n"
    uids = {int(r.stdout.split()[1 if ISO.namespaces else 2]) for r in results}
    if ISO is not None and ISO.drops_user:
        # The four runs overlapped (each sleeps), so each had a uid of its own.
        assert len(uids) == 4
        assert all(FIRST_UID <= uid < FIRST_UID + sandbox.MAX_PARALLEL for uid in uids)


def test_weak_isolation_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    iso = sandbox.Isolation(namespaces=False, drops_user=ROOT, missing=("network namespace: x",))
    monkeypatch.setattr(probing, "isolation", lambda: iso)
    monkeypatch.setattr(probing, "_warned", False)
    with pytest.warns(RuntimeWarning, match="missing: network namespace: x"):
        sandbox.SandboxPool(1).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sandbox.SandboxPool(1).close()


# The fallback, forced: what a machine without namespaces gives.


def test_fallback_runs_a_program(host: str, fallback: None) -> None:
    source = "import os, sys\nprint(sys.stdin.read(), os.getuid() >= 2**30, sorted(os.environ))"
    result = sandbox.run_python(source, stdin="hi")
    assert result.stdout == "hi True ['HOME', 'LANG', 'PATH', 'TMPDIR']\n"
    assert result.status == "ok"


def test_fallback_refuses_sockets(host: str, fallback: None) -> None:
    lines = _assert_no_connection()
    assert [line.split()[1] for line in lines] == ["PermissionError"] * 3


def test_fallback_kills_fork_bomb_and_detached_children(host: str, fallback: None) -> None:
    # exec is refused here, so the detached grandchild stays a python and is found by its uid.
    source = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = sandbox.run_python(source, timeout_s=1.0)
    assert (result.status, result.reason) == ("timeout", "wall time")


def test_fallback_children_cannot_read_their_parents_memory(host: str, fallback: None) -> None:
    """A judge forks the program it judges: the child must not read what the parent holds (the
    tests, the verdict's secret) through /proc."""
    source = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    for name in ('mem', 'environ'):\n"
        "        try:\n"
        "            open(f'/proc/{os.getppid()}/{name}', 'rb').close()\n"
        "            print(name, 'opened', flush=True)\n"
        "        except OSError as exc:\n"
        "            print(name, type(exc).__name__, flush=True)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    result = sandbox.run_python(source)
    assert result.status == "ok", result
    assert result.stdout == "mem PermissionError\nenviron PermissionError\n"


def test_fallback_kill_of_the_trainer_is_refused(host: str, fallback: None) -> None:
    source = f"import os\nos.kill({os.getpid()}, 9)"
    result = sandbox.run_python(source)
    assert result.status == "error"
    assert "PermissionError" in result.stderr


# User-namespace mode, forced: what a non-root trainer gets.


def test_user_namespace_mode_confines_the_program(host: str, user_ns: None) -> None:
    source = (
        "import os\n"
        "print(os.getuid(), sorted(os.listdir('/')))\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
        "for attempt in (lambda: os.chroot('/tmp'), lambda: os.setuid(0)):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError as exc:\n"
        "        print(exc.errno)\n"
    )
    result = sandbox.run_python(source)
    assert result.status == "ok", result
    uid_and_root, capabilities, chroot, setuid = result.stdout.splitlines()
    assert uid_and_root.startswith("1000 ")
    assert "work" not in uid_and_root and "etc" not in uid_and_root
    assert int(capabilities, 16) == 0
    # No capability left to chroot; uid 0 does not even exist in its user namespace.
    assert (int(chroot), int(setuid)) == (errno.EPERM, errno.EINVAL)


def test_user_namespace_mode_has_no_network(host: str, user_ns: None) -> None:
    lines = _assert_no_connection()
    assert lines[0] == f"tcp OSError {errno.EAFNOSUPPORT}"


def test_user_namespace_mode_kills_detached_children(host: str, user_ns: None) -> None:
    source = detached_grandchild(host)
    result = sandbox.run_python(source, timeout_s=5.0)
    assert result.status == "ok", result


def test_stopping_the_trainer_mid_run_leaves_nothing(host: str) -> None:
    # A KeyboardInterrupt while the trainer waits on a run: the run is killed before it returns.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            sandbox.run_python(f"import time\n# {host}\ntime.sleep(30)", timeout_s=30.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Memory outside RLIMIT_AS, keyrings, colliding uids, CPU starvation, the kernel
# surface, what the host shows. These rely on the seccomp filter and, where marked, a cgroup.
needs_filter = pytest.mark.skipif(
    ISO is None or probing.MISSING_SECCOMP in ISO.missing, reason="no seccomp filter here"
)
needs_cgroups = pytest.mark.skipif(
    ISO is None or not ISO.cgroups, reason="no cgroup per run here (see isolation().missing)"
)


@needs_filter
def test_memory_outside_rlimit_as_is_refused(host: str) -> None:
    source = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "held = 0\n"
        "try:\n"
        "    for _ in range(32):\n"  # 512 MB of memfd files at 16 MB each
        "        fd = os.memfd_create('x')\n"
        "        os.ftruncate(fd, 16 * 2**20)\n"
        "        os.write(fd, bytes(16 * 2**20))\n"
        "        held += 16\n"
        "except OSError as exc:\n"
        "    print('memfd', exc.errno, held)\n"
        "print('shmget', libc.shmget(0, 16 * 2**20, 0o1600), ctypes.get_errno())\n"
        "print('msgget', libc.msgget(0, 0o1600), ctypes.get_errno())\n"
        "try:\n"
        "    open('/dev/shm/x', 'wb')\n"
        "except OSError as exc:\n"
        "    print('posix shm', exc.errno)\n"
    )
    before = _shmem_mb()
    result = sandbox.run_python(source, memory_mb=64)
    assert result.stdout.splitlines() == [
        f"memfd {errno.EPERM} 0",
        f"shmget -1 {errno.EPERM}",
        f"msgget -1 {errno.EPERM}",
        f"posix shm {errno.ENOENT}",
    ], result
    assert _shmem_mb() <= before + 16


@needs_namespaces
def test_sysv_ipc_is_bounded_in_its_namespace_too(host: str) -> None:
    # Where the filter is missing (another architecture), these limits hold SysV IPC instead.
    names = ("shmmax", "shmall", "shmmni", "msgmni")
    source = f"print([int(open('/proc/sys/kernel/' + n).read()) for n in {names!r}])"
    result = sandbox.run_python(source)
    assert result.stdout == f"{[sandbox.SCRATCH_MB << 20, sandbox.SCRATCH_MB << 8, 16, 16]}\n"
    assert Path("/proc/sys/kernel/shmmni").read_text() != "16\n"  # the host's are untouched


@needs_cgroups
def test_memory_over_the_runs_limit_kills_the_run(host: str) -> None:
    # Eight processes of 30 MB each: every one within its RLIMIT_AS of 64 MB, together past
    # the run's 64 + 64 MB.
    source = (
        "import os, time\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        block = bytearray(30 * 2**20)\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
        "time.sleep(5)\n"
    )
    result = sandbox.run_python(source, memory_mb=64, timeout_s=4.0)
    assert (result.status, result.reason) == ("killed", "memory limit"), result
    assert result.seconds < 2.0  # at the first kill, not at the wall time


def _trainer_in_a_session_keyring(source: str) -> tuple[str, int]:
    """Run `source` from a trainer process that joined a session keyring holding a secret key
    (as every process of a container or a login does): its result as JSON, and its pid."""
    trainer = (
        "import ctypes, dataclasses, json, sys\n"
        "from oncurve import sandbox\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.syscall(250, 1, b'oncurve-test-session') > 0\n"  # KEYCTL_JOIN_SESSION
        "assert libc.syscall(248, b'user', b'oncurve-trainer-secret', b'hunter2', 7, -3) > 0\n"
        "result = sandbox.run_python(sys.stdin.read())\n"
        "print(json.dumps(dataclasses.asdict(result)))\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", trainer], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as trainer_process:
        output, _ = trainer_process.communicate(source)
    assert trainer_process.returncode == 0
    return output, trainer_process.pid


@needs_filter
def test_a_run_cannot_reach_keyrings(host: str) -> None:
    source = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(open('/proc/keys').read())\n"
        "buf = ctypes.create_string_buffer(4096)\n"
        "print('read session', libc.syscall(250, 11, -3, buf, 4096), ctypes.get_errno())\n"
        "print('add', libc.syscall(248, b'user', b'planted', b'x', 1, -4), ctypes.get_errno())\n"
    )
    output, trainer = _trainer_in_a_session_keyring(source)
    assert '"status": "ok"' in output
    assert "oncurve-trainer-secret" not in output and "hunter2" not in output
    assert f"read session -1 {errno.EPERM}" in output and f"add -1 {errno.EPERM}" in output
    # No key of that trainer's runs' users outlives them (the kernel frees a session keyring
    # once its last process is gone).
    first = launch.UID_BASE + trainer * sandbox.MAX_PARALLEL
    users: list[str] = []
    for _ in range(40):
        lines = Path("/proc/key-users").read_text().splitlines()
        users = [u for u in lines if first <= int(u.split(":")[0]) < first + sandbox.MAX_PARALLEL]
        if not users:
            break
        time.sleep(0.05)
    assert users == []


@needs_namespaces
def test_runs_that_share_a_uid_share_no_process_count(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two trainers in two containers with the same pid gave their runs the same uid: here,
    # two runs forced onto one uid at once. Each forks 20 (of its 32): both get all 20.
    @contextlib.contextmanager
    def same_slot() -> Iterator[int]:
        yield 0

    monkeypatch.setattr(launch, "_slot", same_slot)
    source = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(1.5)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n, open('/proc/self/uid_map').read().split()[1])\n"
        "time.sleep(1.5)\n"
    )
    with sandbox.SandboxPool(2) as pool:
        results = pool.map([source] * 2, timeout_s=5.0)
    assert [r.stdout.split() for r in results] == [["20", str(FIRST_UID)]] * 2, results


@needs_cgroups
def test_a_cpu_hog_does_not_starve_its_neighbour(host: str) -> None:
    hog = (
        "import os, time\n"
        "for _ in range(24):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        while True:\n"
        "            pass\n"
        "time.sleep(10)\n"
    )
    work = "total = 0\nfor i in range(3_000_000):\n    total += i\nprint(total)\n"
    alone = sandbox.run_python(work, timeout_s=10.0).seconds
    with sandbox.SandboxPool(2) as pool:
        hogging = pool.submit(hog, timeout_s=3.0)
        time.sleep(0.5)  # its 24 processes are spinning
        beside = pool.submit(work, timeout_s=10.0).result()
        assert hogging.result().status == "timeout"
    assert beside.status == "ok"
    # One CPU per run: on two cores the hog gets one, the neighbour the other, which it may
    # share with other work (a second test worker); unconfined, the hog's 24 processes would
    # leave it a 25th of the machine, over ten times slower.
    assert beside.seconds < 4 * alone + 0.5, (alone, beside.seconds)


REFUSED_CALLS = {
    "io_uring_setup": 425,
    "userfaultfd": 323,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "bpf": 321,
    "perf_event_open": 298,
    "ptrace": 101,
    "pidfd_getfd": 438,
    "mount": 165,
    "umount2": 166,
    "unshare": 272,
    "setns": 308,
    "kexec_load": 246,
    "init_module": 175,
    "reboot": 169,
    "io_setup": 206,
    "io_submit": 209,
    "io_getevents": 208,
    "io_destroy": 207,
    "io_cancel": 210,
    "io_pgetevents": 333,
}


@needs_filter
def test_the_kernel_surface_is_closed(host: str) -> None:
    source = (
        "import ctypes, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, number in {REFUSED_CALLS!r}.items():\n"
        "    print(name, libc.syscall(number, 0, 0, 0, 0, 0), ctypes.get_errno())\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_VSOCK, socket.AF_NETLINK,\n"
        "               socket.AF_PACKET):\n"
        "    try:\n"
        "        socket.socket(family, socket.SOCK_DGRAM)\n"
        "        print(family, 'opened')\n"
        "    except OSError as exc:\n"
        "        print(family, exc.errno)\n"
        "a, b = socket.socketpair()\n"
        "a.send(b'unix')\n"
        "print(b.recv(4).decode())\n"
        "print('clone3', libc.syscall(435, 0, 0), ctypes.get_errno())\n"
        f"print('undecided', libc.syscall({SECCOMP.LAST_DECIDED_X86_64 + 1}, 0), ctypes.get_errno())\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)\n"
        "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    result = sandbox.run_python(source)
    lines = result.stdout.splitlines()
    assert lines[: len(REFUSED_CALLS)] == [f"{n} -1 {errno.EPERM}" for n in REFUSED_CALLS]
    families = lines[len(REFUSED_CALLS) : len(REFUSED_CALLS) + 5]
    assert [line.split()[1] for line in families] == [str(errno.EAFNOSUPPORT)] * 5
    assert lines[-4:] == [
        "unix",
        f"clone3 -1 {errno.ENOSYS}",
        f"undecided -1 {errno.ENOSYS}",
        "fork 7",
    ]
    # x32 numbers, and the i386 ABI (int 0x80, which the host runs), name other calls: the
    # filter checks the architecture and kills the process.
    x32 = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 + 39)\n"
    i386 = (
        "import ctypes, mmap\n"
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))\n"  # getpid; int 0x80; ret
        "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(address)())\n"
    )
    for other_abi in (x32, i386):
        result = sandbox.run_python(other_abi)
        assert (result.status, result.reason) == ("killed", "signal 31 (SIGSYS)"), result


@needs_filter
def test_linux_aio_leaves_the_hosts_limit_alone(host: str) -> None:
    # io_setup(65536) would take the whole of the host's fs.aio-max-nr until the run ends
    source = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "context = ctypes.c_ulong(0)\n"
        "print(libc.syscall(206, 65536, ctypes.byref(context)), ctypes.get_errno())\n"
        "print(open('/proc/sys/fs/aio-nr').read().strip())\n"
    )
    before = Path("/proc/sys/fs/aio-nr").read_text().strip()
    result = sandbox.run_python(source)
    assert result.stdout.splitlines()[0] == f"-1 {errno.EPERM}", result
    assert Path("/proc/sys/fs/aio-nr").read_text().strip() == before


# The kernel's x86_64 calls past the numbers the system's header (linux-libc-dev) names, up to
# the newest kernel the filter was decided against.
NEWER_CALLS = {
    "cachestat": 451,
    "fchmodat2": 452,
    "map_shadow_stack": 453,
    "futex_wake": 454,
    "futex_wait": 455,
    "futex_requeue": 456,
    "statmount": 457,
    "listmount": 458,
    "lsm_get_self_attr": 459,
    "lsm_set_self_attr": 460,
    "lsm_list_modules": 461,
    "mseal": 462,
    "setxattrat": 463,
    "getxattrat": 464,
    "listxattrat": 465,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_getattr": 468,
    "file_setattr": 469,
}
UNISTD_64 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def _kernel_table() -> dict[str, int]:
    """The x86_64 system calls by name: the system's header, then NEWER_CALLS."""
    table = {}
    for line in UNISTD_64.read_text().splitlines():
        if line.startswith("#define __NR_"):
            name, number = line.removeprefix("#define __NR_").split()
            table[name] = int(number)
    assert len(table) > 300 and max(table.values()) < min(NEWER_CALLS.values())
    return {**table, **NEWER_CALLS}


@pytest.mark.skipif(
    not UNISTD_64.exists() or os.uname().machine != "x86_64",
    reason="no x86_64 system call header here",
)
def test_the_refused_calls_are_the_kernels_and_every_call_is_decided() -> None:
    table = _kernel_table()
    # each refused call is refused under its own number
    assert {name: table.get(name) for name in SECCOMP.REFUSED_X86_64} == SECCOMP.REFUSED_X86_64
    assert len(set(SECCOMP.REFUSED_X86_64.values())) == len(SECCOMP.REFUSED_X86_64)
    # the filter decided every call up to the newest in the table, and no other
    assert max(table.values()) == SECCOMP.LAST_DECIDED_X86_64
    # the running kernel has no call past that: a new one is a decision to make here (until
    # then the filter answers ENOSYS for it)
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        first = SECCOMP.LAST_DECIDED_X86_64 + 1
        implemented = [
            n
            for n in range(first, first + 64)
            if libc.syscall(n, 0, 0, 0, 0, 0, 0) != -1 or ctypes.get_errno() != errno.ENOSYS
        ]
        os._exit(min(len(implemented), 100))
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_the_filter_refuses_each_call_and_those_past_the_decided_ones() -> None:
    program = SECCOMP.seccomp_program()
    decide = _run_filter(program)
    for name, number in SECCOMP.REFUSED_X86_64.items():
        assert decide(number) == SECCOMP.SECCOMP_RET_ERRNO | errno.EPERM, name
    enosys = SECCOMP.SECCOMP_RET_ERRNO | errno.ENOSYS
    assert decide(435) == enosys  # clone3
    for number in (SECCOMP.LAST_DECIDED_X86_64 + 1, 1000, 0x3FFFFFFF):
        assert decide(number) == enosys
    allowed = {0, 1, 2, 3, 9, 57, 59, 60, 231, 451, 462, SECCOMP.LAST_DECIDED_X86_64}
    for number in allowed:  # read, write, open, close, mmap, fork, execve, exits, ...
        assert decide(number) == SECCOMP.SECCOMP_RET_ALLOW, number
    assert decide(0x40000000 + 39) == SECCOMP.SECCOMP_RET_KILL_PROCESS  # x32
    assert decide(39, arch=0x40000003) == SECCOMP.SECCOMP_RET_KILL_PROCESS  # i386


def _run_filter(program: list[tuple[int, int, int, int]]):
    """An interpreter of the classic BPF the filter uses: the action for (nr, arch), with the
    call's arguments all 0."""

    def decide(nr: int, arch: int = SECCOMP.AUDIT_ARCH_X86_64) -> int:
        data = {0: nr, 4: arch, 16: 0, 24: 0}
        accumulator, pc = 0, 0
        while True:
            code, jt, jf, k = program[pc]
            if code == SECCOMP.BPF_RET_K:
                return k
            if code == SECCOMP.BPF_LD_W_ABS:
                accumulator = data[k]
                pc += 1
                continue
            taken = {
                SECCOMP.BPF_JEQ_K: accumulator == k,
                SECCOMP.BPF_JGE_K: accumulator >= k,
                SECCOMP.BPF_JSET_K: bool(accumulator & k),
            }[code]
            pc += 1 + (jt if taken else jf)

    return decide


@needs_namespaces
def test_the_program_is_the_kernels_first_oom_victim(host: str) -> None:
    source = (
        "print(open('/proc/self/oom_score_adj').read().strip())\n"
        "try:\n"
        "    open('/proc/self/oom_score_adj', 'w').write('0')\n"
        "except OSError as exc:\n"
        "    print('lower', exc.errno)\n"
        "print(open('/proc/self/oom_score_adj').read().strip())\n"
    )
    result = sandbox.run_python(source)
    lines = result.stdout.splitlines()
    assert lines[0] == "1000", result  # set before the program's first line
    # Only a writer with CAP_SYS_RESOURCE in the host's user namespace (not root in most
    # containers) makes 1000 a floor; else the program may lower it, never below the trainer's.
    trainer = int(Path("/proc/self/oom_score_adj").read_text())
    assert int(lines[-1]) >= trainer


@needs_namespaces
def test_the_host_shows_no_paths_packages_or_shared_file_events(host: str) -> None:
    own = [p for p in sandbox._cgroup.own_paths(Path("/proc/self/cgroup").read_text()).values()]
    own = [path for path in own if path != "/"]
    source = (
        "import ctypes, fcntl, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()) == [str(os.getpid())])\n"
        "try:\n"
        "    open('/proc/1/cmdline').read()\n"
        "except OSError as exc:\n"
        "    print('cmdline', exc.errno)\n"
        f"for path in {launch.package_dirs()!r}:\n"
        "    sys.path.append(path)\n"
        "    print('packages', path, os.listdir(path))\n"
        "for name, lock in [('flock', fcntl.flock), ('lockf', fcntl.lockf)]:\n"
        "    try:\n"
        "        lock(open(os.__file__), fcntl.LOCK_SH)\n"
        "    except OSError as exc:\n"
        "        print(name, exc.errno)\n"
        "try:\n"
        "    fcntl.fcntl(os.open('/usr', os.O_RDONLY), fcntl.F_NOTIFY, fcntl.DN_ACCESS)\n"
        "except OSError as exc:\n"
        "    print('dnotify', exc.errno)\n"
        "os.set_blocking(1, False)\n"  # fcntl's other commands still work
        "print('inotify', libc.inotify_init(), ctypes.get_errno())\n"
        "print(open('/proc/self/cgroup').read())\n"
    )
    result = sandbox.run_python(source)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["True", f"cmdline {errno.ENOENT}"], result
    assert [line for line in lines if line.startswith("packages")] == [
        f"packages {path} []" for path in launch.package_dirs()
    ]
    refused = [f"{name} {errno.EPERM}" for name in ("flock", "lockf", "dnotify")]
    assert set(refused) <= set(lines) and f"inotify -1 {errno.EPERM}" in lines
    assert not any(path in result.stdout for path in own)


def test_what_is_missing_is_named_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        with monkeypatch.context() as patch:
            patch.setattr(probing, "_PROBE_SOURCE", "print(0)")  # no filter on the program
            patch.setattr(launch, "hierarchy", lambda: "no cgroup here")
            patch.setattr(probing, "_warned", False)
            probing.probe.cache_clear()
            with pytest.warns(RuntimeWarning) as caught:
                iso = sandbox.check_isolation()
                sandbox.check_isolation()
    finally:
        probing.probe.cache_clear()
    assert iso.cgroups == 0 and probing.MISSING_SECCOMP in iso.missing
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "seccomp filter" in message and "a cgroup per run (no cgroup here)" in message


def test_undecodable_source_is_an_error_result(host: str) -> None:
    result = sandbox.run_python("print(1)  # \ud800")
    assert (result.status, result.reason, result.returncode) == (
        "error",
        "undecodable source",
        None,
    )
    assert "not valid UTF-8 at character 12" in result.stderr
    with sandbox.SandboxPool(2) as pool:
        assert [r.status for r in pool.map(["\udcff", "print(2)"])] == ["error", "ok"]


def test_cgroup_v2_where_delegated_else_v1_else_why(tmp_path: Path) -> None:
    # A v2 hierarchy faked in a directory: the logic that this machine (v1) cannot run.
    mount = tmp_path / "unified"
    parent = mount / "trainer"
    parent.mkdir(parents=True)
    (parent / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.subtree_control").write_text("")
    mountinfo = f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n"
    found = sandbox._cgroup.find_hierarchy(mountinfo, "0::/trainer\n")
    assert found == sandbox._cgroup.Hierarchy(2, (str(parent),))
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    run = sandbox._cgroup.RunCgroup(found, 300 * 2**20, 32)
    (directory,) = run.dirs
    written = {name: Path(directory, name).read_text() for name in os.listdir(directory)}
    assert written == {
        "memory.max": str(300 * 2**20),
        "memory.oom.group": "1",
        "pids.max": "32",
        "cpu.max": "100000 100000",
    }
    assert run.procs == [f"{directory}/cgroup.procs"] and run.oom_kills() == 0
    Path(directory, "memory.events").write_text("low 0\noom 1\noom_kill 2\n")
    assert run.oom_kills() == 2
    for name in os.listdir(directory):
        os.remove(Path(directory, name))
    run.remove()
    assert os.listdir(parent) == ["cgroup.controllers", "cgroup.subtree_control"]
    # A trainer's cgroup that holds processes cannot enable controllers (EBUSY there; here, a
    # directory where the file would be), and without v1 hierarchies nothing is left.
    (parent / "cgroup.subtree_control").unlink()
    (parent / "cgroup.subtree_control").mkdir()
    why = sandbox._cgroup.find_hierarchy(mountinfo, "0::/trainer\n")
    assert why == (
        f"cgroup v2 at {parent} cannot enable its controllers (Is a directory); "
        "no writable cgroup v1 memory hierarchy"
    )
    lacking = f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    assert sandbox._cgroup.find_hierarchy(lacking, "0::/\n").startswith(
        f"cgroup v2 at {tmp_path} lacks cpu, memory, pids"
    )
