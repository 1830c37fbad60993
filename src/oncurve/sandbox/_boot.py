"""First stage of a sandboxed run: build the program's world, start it, supervise it.

The trainer starts this file as ``python -I -S _boot.py SPEC_FD STDERR_FD`` with the base
interpreter, under ``unshare`` when the machine gives namespaces (then this process is PID 1 of
a fresh PID namespace, and root of the new mount namespace). It uses the standard library only
and imports nothing of oncurve but the seccomp filter's file beside it (``_seccomp.py``, loaded
by its path), so nothing of the trainer's environment runs with privileges.

SPEC_FD holds the run's spec as JSON (written by ``oncurve.sandbox``). STDERR_FD is the
program's stderr; this process's own stderr (shared with ``unshare``, whose complaints thus
reach the trainer as sandbox errors, never as the program's output) is the status channel. It
receives JSON lines: first ``{"pid": N}`` (this process as the trainer's /proc numbers it),
then one outcome: ``{"exit": code, "cpu": s}``, ``{"signal": n, "cpu": s}``,
``{"timeout": true}``, ``{"stopped": true}`` (SIGTERM from the trainer) or
``{"error": message}`` when the sandbox could not be set up.

Modes (``spec["mode"]``):

- ``root-ns``: root in new namespaces. The program gets a new root on a size-limited tmpfs
  (read-only ``/usr``, the interpreter's prefix, four device nodes, its own /proc, a writable
  ``/sandbox`` and ``/tmp``), and runs chrooted as uid 1000 of a user namespace of its own,
  which is ``spec["uid"]`` outside, a user no other run of the trainer has.
- ``user-ns``: a non-root trainer under ``unshare --user --map-root-user``. The same world; the
  program runs as uid 1000 of a nested user namespace (the trainer's uid outside), so it holds
  no capability over the namespaces this process set up.
- ``fallback``: no namespaces. The program runs in ``spec["workdir"]`` on the host, as
  ``spec["uid"]`` when the trainer is root, behind an audit hook that refuses sockets,
  ``exec`` and ctypes (see RUNNER); this process is its subreaper and kills every descendant
  at the end.

In every mode the program joins the run's cgroup (``spec["cgroup_procs"]``), gets a session
keyring of its own and, on x86_64, a seccomp filter (``_seccomp.py``), just before exec.
"""

import ctypes
import errno
import importlib.util
import json
import os
import resource
import signal
import sys
import time

# In the private mount namespace the new root is mounted over /tmp (a directory every Linux has);
# the host's /tmp is untouched.
NEW_ROOT = "/tmp"
WORKDIR = "/sandbox"
# The program's user in user-ns mode: any id but 0, so exec drops its capabilities.
INNER_UID = 1000
SCRATCH_INODES = 4096

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME = 0x4000, 0x40000, 0x200000
ST_RELATIME = 0x1000  # statvfs's bit for relatime differs from the mount flag's
CLONE_NEWUSER = 0x10000000
SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING = 250, 1
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 36, 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
_libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
_libc.unshare.argtypes = (ctypes.c_int,)

# ``-I`` keeps this file's directory off sys.path, and the package is not imported here: the
# filter's file is loaded by its path, before the program's root hides it.
_SECCOMP_SPEC = importlib.util.spec_from_file_location(
    "oncurve_sandbox_seccomp",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "_seccomp.py"),
)
_seccomp = importlib.util.module_from_spec(_SECCOMP_SPEC)
_SECCOMP_SPEC.loader.exec_module(_seccomp)

# The program's first lines: ``python -I -S`` skips site (38 ms of .pth files in a full base
# install, and site-packages the program should not see), so give back the two builtins that
# model-written code calls, exit and quit. In the fallback (``--audit``) an audit hook is the one
# network barrier: hooks cannot be removed, and it also refuses the ways out of the interpreter
# that would leave it behind (exec, ctypes, _posixsubprocess) and signals to other processes.
# Native code could still get around it: docs/sandbox.md says so. Given ``--uid``, it first
# becomes that user: the change of user leaves the process undumpable, so that what it forks
# (a judge's program) cannot read its memory or its files in /proc.
RUNNER = """\
import _sitebuiltins, builtins, os, sys
if "--uid" in sys.argv:
    _uid = int(sys.argv[sys.argv.index("--uid") + 1])
    os.setgroups([])
    os.setresgid(_uid, _uid, _uid)
    os.setresuid(_uid, _uid, _uid)
    del _uid
builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
def _hook(event, args, _getpid=os.getpid,
          _events=frozenset({"socket.__new__", "os.exec", "os.posix_spawn", "os.system",
                             "os.killpg", "subprocess.Popen", "ctypes.dlopen"}),
          _modules=frozenset({"_ctypes", "_posixsubprocess"})):
    if (event in _events or (event == "import" and args[0] in _modules)
            or (event == "os.kill" and args[0] != _getpid())):
        raise PermissionError(f"{event} is refused in this sandbox")
if "--audit" in sys.argv:
    sys.addaudithook(_hook)
sys.argv = ["main.py"]
def _run(namespace, builtins=builtins):
    with open("main.py", "rb") as file:
        code = compile(file.read(), os.path.abspath("main.py"), "exec")
    # The program's globals are __main__'s own (pickle finds its functions), emptied of ours.
    namespace.clear()
    namespace.update(__name__="__main__", __file__="main.py", __builtins__=builtins)
    exec(code, namespace)
_run(globals())
"""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    ret = _libc.mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data))
    _check(ret, f"mount {target}")


def _bind_readonly(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    # A remount inside a user namespace must keep the source's locked flags (atime, noexec...),
    # so carry them over from statvfs, as bubblewrap does.
    host_flags = os.statvfs(source).f_flag
    kept = host_flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    if host_flags & ST_RELATIME:
        kept |= MS_RELATIME
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | kept
    _mount(None, target, None, flags)


def _report(fd: int, **message: object) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _build_root(spec: dict) -> None:
    """Mount the program's filesystem at NEW_ROOT: system files read-only, its own scratch."""
    # Nothing mounted here may reach the trainer's mount namespace.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Everything the program writes lives in this tmpfs, bounded, and vanishes with it.
    options = f"size={spec['scratch_mb']}m,nr_inodes={SCRATCH_INODES},mode=755"
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + name
        if os.path.islink(host):  # merged /usr: keep the link a link
            os.symlink(os.readlink(host), NEW_ROOT + host)
        elif os.path.isdir(host):
            os.mkdir(NEW_ROOT + host)
            _bind_readonly(host, NEW_ROOT + host)
    prefix = spec["prefix"]
    if not prefix.startswith("/usr/"):
        os.makedirs(NEW_ROOT + prefix)
        _bind_readonly(prefix, NEW_ROOT + prefix)
    # The standard library only: an empty read-only tmpfs over every directory of packages.
    for path in spec["hidden"]:
        if os.path.isdir(NEW_ROOT + path):
            _mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    dev = NEW_ROOT + "/dev"
    os.mkdir(dev)
    for name in ("null", "zero", "random", "urandom"):
        open(f"{dev}/{name}", "x").close()
        _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    # A procfs of the new PID namespace: it shows the sandbox's processes only, and of those
    # only the program's own (hidepid): not this process, whose command line names the host's
    # paths.
    os.mkdir(NEW_ROOT + "/proc")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc", NEW_ROOT + "/proc", "proc", flags, "hidepid=invisible")
    os.mkdir(NEW_ROOT + "/tmp")
    os.chmod(NEW_ROOT + "/tmp", 0o1777)
    os.mkdir(NEW_ROOT + WORKDIR, 0o700)
    if spec["uid"] is not None:
        os.chown(NEW_ROOT + WORKDIR, spec["uid"], spec["uid"])


def _limit_ipc(megabytes: int) -> None:
    """Bound SysV IPC in the run's IPC namespace, behind the filter that refuses it (and in its
    stead where there is no filter): shared memory at ``megabytes`` in all, few queues."""
    for name, value in (
        ("shmmax", megabytes << 20),
        ("shmall", (megabytes << 20) // 4096),  # in pages
        ("shmmni", 16),
        ("msgmni", 16),
    ):
        with open(f"/proc/sys/kernel/{name}", "w") as file:
            file.write(str(value))


def _become_unprivileged(outer: int) -> None:
    """Enter a nested user namespace as INNER_UID, which is ``outer`` outside: exec then drops
    every capability. The namespace is the run's own, so what the kernel counts or keeps per
    user (RLIMIT_NPROC, the user keyring) is per run, whatever ``outer`` another run has."""
    _check(_libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{INNER_UID} {outer} 1"),
        ("gid_map", f"{INNER_UID} {outer} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)


def _set_limits(limits: dict) -> None:
    for name, value in limits.items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        # soft == hard: the program may lower a limit, never raise it back.
        resource.setrlimit(which, (value, value))


def _start_program(spec: dict, status_fd: int) -> int:
    """Fork the program: confine the child, drop its privileges and exec the interpreter."""
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        # The program is the kernel's first choice when memory runs out, in its cgroup or in
        # any above it (a container's). Written with CAP_SYS_RESOURCE in the host's user
        # namespace, 1000 is also the floor the program may not lower it under; without it (in
        # most containers) the floor is the trainer's own value.
        with open("/proc/self/oom_score_adj", "w") as file:
            file.write("1000")
        # Into the run's cgroup while still root there: every process of the program is born
        # in it. This process stays out, so that it outlives the program at the memory limit.
        for path in spec["cgroup_procs"]:
            with open(path, "w") as file:
                file.write("0")
        uid = spec["uid"]
        # In the fallback the interpreter takes its user itself (RUNNER): exec would make the
        # process dumpable again, and a change of user after it makes it undumpable.
        if uid is not None and spec["mode"] != "fallback":
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            # The change of user made this process undumpable, which makes its /proc files
            # root's: it needs them to write its user namespace's maps.
            _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl dumpable")
        if spec["mode"] != "fallback":
            # Before chroot: the kernel refuses a user namespace to a chrooted process. In
            # root-ns mode ``uid`` is the run's user outside; in user-ns mode the trainer's
            # user is 0 of the namespace that unshare made.
            _become_unprivileged(0 if uid is None else uid)
        argv = [spec["python"], "-I", "-S", "-c", RUNNER]
        if spec["mode"] == "fallback":
            workdir = spec["workdir"]
            argv.append("--audit")
            if uid is not None:
                argv += ["--uid", str(uid)]
        else:
            os.chroot(NEW_ROOT)
            workdir = WORKDIR
        os.chdir(workdir)
        _set_limits(spec["limits"])
        # A session keyring of its own: the trainer's (a container's, a login's) stays out of
        # reach. The filter then refuses every keyring call.
        joined = _libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0
        # without keyrings (ENOSYS) there is none to hide
        if not joined and ctypes.get_errno() != errno.ENOSYS:
            _check(-1, "keyctl join session keyring")
        # No setuid binary may give the program back what it just lost.
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
        _seccomp.install_seccomp()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "LANG": "C.UTF-8",
            "TMPDIR": workdir if spec["mode"] == "fallback" else "/tmp",
        }
        os.execve(spec["python"], argv, env)
    except BaseException as exc:  # the program has not run yet: any failure is the sandbox's
        _report(status_fd, error=f"starting the program: {type(exc).__name__}: {exc}")
    finally:
        os._exit(127)


def _supervise(child: int, timeout_s: float) -> dict:
    """Reap every child until the program exits, the wall time passes or SIGTERM comes."""
    deadline = time.monotonic() + timeout_s
    waited = {signal.SIGCHLD, signal.SIGTERM}
    while True:
        # Orphans of the program are reparented here (PID 1, or subreaper): reap them too.
        while True:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid == child:
                cpu = round(usage.ru_utime + usage.ru_stime, 3)
                if os.WIFSIGNALED(status):
                    return {"signal": os.WTERMSIG(status), "cpu": cpu}
                return {"exit": os.WEXITSTATUS(status), "cpu": cpu}
        remaining = deadline - time.monotonic()
        info = signal.sigtimedwait(waited, remaining) if remaining > 0 else None
        if info is None:
            return {"timeout": True}
        if info.si_signo == signal.SIGTERM:
            return {"stopped": True}


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                line = file.read()
        except OSError:  # exited meanwhile
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        if int(line[line.rindex(b")") + 2 :].split()[1]) == parent:
            found.append(int(entry))
    return found


def _kill_descendants(uid: int | None) -> None:
    """Fallback: kill and reap every descendant, detached ones included (we are subreaper).
    With a uid of the program's own, one kill(-1) from that uid first: it reaches them all at
    once, where a fork bomb refills faster than one pass over /proc kills, on a loaded machine,
    and the trainer would then kill this process and leave the bomb to the machine's init."""
    if uid is not None:
        helper = os.fork()
        if helper == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
    me = os.getpid()
    while True:
        children = _children(me)
        for pid in children:
            # Safe from PID reuse: a child's PID is held until we reap it.
            os.kill(pid, signal.SIGKILL)
        try:
            # Killing a process hands its children to us; the next pass finds them.
            os.waitpid(-1, 0 if children else os.WNOHANG)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    spec_fd, stderr_fd = int(argv[1]), int(argv[2])
    # SIGCHLD and SIGTERM are taken by sigtimedwait, never by handlers; blocked before the fork
    # so that none is lost. The child unblocks them before exec.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
    status_fd = os.dup(2)  # not inheritable: the program never holds it
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)
    _report(status_fd, pid=int(os.readlink("/proc/self")))
    try:
        with os.fdopen(spec_fd, "rb") as file:
            spec = json.load(file)
        if spec["mode"] == "fallback":
            _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl subreaper")
            workdir = spec["workdir"]
        else:
            _build_root(spec)
            _limit_ipc(spec["scratch_mb"])
            workdir = NEW_ROOT + WORKDIR
        # Not dumpable: the program cannot ptrace this process or read its /proc entries.
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl dumpable")
        with open(f"{workdir}/main.py", "w", encoding="utf-8") as file:
            file.write(spec["source"])
        child = _start_program(spec, status_fd)
    except Exception as exc:  # reported to the trainer, which raises it
        _report(status_fd, error=f"setting up the sandbox: {type(exc).__name__}: {exc}")
        return 70
    outcome = _supervise(child, spec["timeout_s"])
    if spec["mode"] == "fallback":
        _kill_descendants(spec["uid"])
    # In a PID namespace our exit kills whatever is left in it.
    _report(status_fd, **outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
