"""First stage of a sandboxed run: build the program's world, start it, supervise it.

The trainer starts this file as ``python -I -S _boot.py SPEC_FD STDERR_FD`` with the base
interpreter, under ``unshare`` when the machine gives namespaces (then this process is PID 1 of
a fresh PID namespace, and root of the new mount namespace). It uses the standard library only
and imports nothing of oncurve, so nothing of the trainer's environment runs with privileges.

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
keyring of its own and, on x86_64, a seccomp filter (``seccomp_program``), just before exec.
"""

import ctypes
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

# The program's first lines: ``python -I -S`` skips site (38 ms of .pth files in a full base
# install, and site-packages the program should not see), so give back the two builtins that
# model-written code calls, exit and quit. In the fallback (``--audit``) an audit hook is the one
# network barrier: hooks cannot be removed, and it also refuses the ways out of the interpreter
# that would leave it behind (exec, ctypes, _posixsubprocess) and signals to other processes.
# Native code could still get around it: docs/sandbox.md says so.
RUNNER = """\
import _sitebuiltins, builtins, os, sys
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


# --- the seccomp filter: a classic BPF program (libseccomp's Python bindings are not on PyPI) ---
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x50000, 0x7FFF0000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
AF_UNIX = 1
# Namespace flags of clone: a program that needs none of them must not make its own.
CLONE_NEW_ANY = 0x7E020080  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
# x86_64 calls a test program never needs, refused with EPERM, by group:
REFUSED_X86_64 = {
    # kernel interfaces with a large attack surface: io_uring, userfaultfd, bpf, perf
    **{"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427},
    **{"userfaultfd": 323, "bpf": 321, "perf_event_open": 298},
    # limits the host shares among all its processes: Linux AIO takes from fs.aio-max-nr
    **{"io_setup": 206, "io_destroy": 207, "io_getevents": 208, "io_submit": 209},
    **{"io_cancel": 210, "io_pgetevents": 333},
    # keyrings: the run joins a session keyring of its own, then may not touch any
    **{"add_key": 248, "request_key": 249, "keyctl": 250},
    # reaching into another process as ptrace does
    **{"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312},
    **{"pidfd_getfd": 438, "process_madvise": 440, "process_mrelease": 448},
    # memory that no rlimit counts, and IPC objects that outlive a fallback run in the host's
    # IPC namespace: memfd, SysV shared memory, semaphores and message queues, POSIX queues
    **{"memfd_create": 319, "memfd_secret": 447},
    **{"shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67},
    **{"semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220},
    **{"msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71},
    **{"mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243},
    **{"mq_notify": 244, "mq_getsetattr": 245},
    # what would show a run the other runs' and the trainer's use of the files they share
    **{"flock": 73, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300},
    # mounts and namespaces
    **{"mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272},
    **{"setns": 308, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431},
    **{"fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467},
    # the host's own: kernel images and modules, power, swap, accounting, its log, clock,
    # names, I/O ports, quotas, file handles, the LDT, obsolete calls
    **{"kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313},
    **{"delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163},
    **{"syslog": 103, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305},
    **{"adjtimex": 159, "sethostname": 170, "setdomainname": 171, "iopl": 172},
    **{"ioperm": 173, "vhangup": 153, "quotactl": 179, "quotactl_fd": 443},
    **{"name_to_handle_at": 303, "open_by_handle_at": 304, "modify_ldt": 154},
    **{"uselib": 134, "lookup_dcookie": 212},
}
# Every call up to this number was decided (refused above, or allowed); the kernel's later ones
# get ENOSYS until they are, as a call the kernel lacks would.
LAST_DECIDED_X86_64 = 469
SYS_CLONE, SYS_CLONE3, SYS_SOCKET, SYS_SOCKETPAIR, SYS_FCNTL = 56, 435, 41, 53, 72
# fcntl's record locks (F_GETLK, F_SETLK, F_SETLKW and their OFD forms) and F_NOTIFY (dnotify):
# like flock and inotify, they would show a run what others do with the files they share.
FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1026)
ENOSYS, EPERM, EAFNOSUPPORT = 38, 1, 97


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program() -> list[tuple[int, int, int, int]]:
    """The filter, as (code, jt, jf, k): refuse REFUSED_X86_64 with EPERM; clone3 with ENOSYS
    (its flags are out of a filter's sight: libc falls back to clone), and every call past
    LAST_DECIDED_X86_64; clone with a namespace flag; fcntl's FCNTL_REFUSED commands; socket
    and socketpair of any family but AF_UNIX. Another architecture, or x32 calls, kill the
    process: their numbers mean other calls."""

    def ret(value: int) -> tuple[int, int, int, int]:
        return (BPF_RET_K, 0, 0, value)

    allow, deny = ret(SECCOMP_RET_ALLOW), ret(SECCOMP_RET_ERRNO | EPERM)
    checks = [(number, deny) for number in REFUSED_X86_64.values()]
    checks.append((SYS_CLONE3, ret(SECCOMP_RET_ERRNO | ENOSYS)))
    head = [
        (BPF_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ret(SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        ret(SECCOMP_RET_KILL_PROCESS),
        (BPF_JGE_K, 0, 1, LAST_DECIDED_X86_64 + 1),
        ret(SECCOMP_RET_ERRNO | ENOSYS),
    ]
    # Each refused number: jeq nr -> its return, laid out after all the jumps.
    jumps = [(BPF_JEQ_K, 0, 0, number) for number, _ in checks]
    fcntl_jumps = len(FCNTL_REFUSED)
    tail = [
        (BPF_JEQ_K, 0, 3, SYS_CLONE),
        (BPF_LD_W_ABS, 0, 0, 16),  # args[0], low half: clone's flags
        (BPF_JSET_K, 0, 1, CLONE_NEW_ANY),
        deny,
        (BPF_LD_W_ABS, 0, 0, 0),
        (BPF_JEQ_K, 0, fcntl_jumps + 3, SYS_FCNTL),
        (BPF_LD_W_ABS, 0, 0, 24),  # args[1]: the command
        # the k-th command jumps over the rest of them to `deny`
        *[(BPF_JEQ_K, fcntl_jumps - k, 0, cmd) for k, cmd in enumerate(FCNTL_REFUSED)],
        ret(SECCOMP_RET_ALLOW),
        deny,
        (BPF_LD_W_ABS, 0, 0, 0),
        (BPF_JEQ_K, 1, 0, SYS_SOCKET),
        (BPF_JEQ_K, 0, 3, SYS_SOCKETPAIR),
        (BPF_LD_W_ABS, 0, 0, 16),  # args[0]: the address family
        (BPF_JEQ_K, 1, 0, AF_UNIX),
        ret(SECCOMP_RET_ERRNO | EAFNOSUPPORT),
        allow,
    ]
    returns = [result for _, result in checks]
    program = head + jumps + tail
    for i, (code, _, _, number) in enumerate(jumps):
        # a jump's offset counts from the next instruction; its return sits after the tail
        at = len(program) + i
        offset = at - (len(head) + i) - 1
        if offset > 255:  # a classic BPF jump's offset is one byte
            raise ValueError("seccomp filter: too many refused calls for one jump table")
        program[len(head) + i] = (code, offset, 0, number)
    return program + returns


def _install_seccomp() -> None:
    """Install the filter; without it (another architecture, a kernel without seccomp) the
    program runs unfiltered, and the trainer's probe, which reads /proc/self/status, says so."""
    if os.uname().machine != "x86_64":
        return
    program = seccomp_program()
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    prog = _SockFprog(len(program), filters)
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
        "prctl seccomp",
    )


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
        if uid is not None:
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
        else:
            os.chroot(NEW_ROOT)
            workdir = WORKDIR
        os.chdir(workdir)
        _set_limits(spec["limits"])
        # A session keyring of its own: the trainer's (a container's, a login's) stays out of
        # reach. The filter then refuses every keyring call.
        joined = _libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0
        if not joined and ctypes.get_errno() != ENOSYS:  # without keyrings there is none to hide
            _check(-1, "keyctl join session keyring")
        # No setuid binary may give the program back what it just lost.
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
        _install_seccomp()
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
