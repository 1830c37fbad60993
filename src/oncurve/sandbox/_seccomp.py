"""The seccomp filter of a sandboxed run: a classic BPF program (libseccomp's Python bindings
are not on PyPI) that the bootstrap (``_boot.py``) installs in the program's process just
before exec.

Like the bootstrap, it uses the standard library only and imports nothing of oncurve: the
bootstrap, started as a file outside the package (``python -I -S``), loads this one by its path.
"""

import ctypes
import os

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

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4


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


def install_seccomp() -> None:
    """Install the filter; without it (another architecture, a kernel without seccomp) the
    program runs unfiltered, and the trainer's probe, which reads /proc/self/status, says so.
    Raises OSError when prctl refuses it."""
    if os.uname().machine != "x86_64":
        return
    program = seccomp_program()
    filters = (_SockFilter * len(program))(*(_SockFilter(*ins) for ins in program))
    prog = _SockFprog(len(program), filters)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl seccomp: {os.strerror(err)}")
