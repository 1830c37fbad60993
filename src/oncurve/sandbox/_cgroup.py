"""A cgroup per sandboxed run, which bounds what its processes use together: memory (shared
memory, tmpfs and kernel memory included), CPU time per period, and processes.

cgroup v2 where the trainer's own cgroup can have children with the memory, pids and cpu
controllers (a delegated subtree, or the root of the hierarchy); else the v1 hierarchies of
those three controllers, where they are mounted and this process may write them. The trainer
makes the run's cgroup (`RunCgroup`), the bootstrap moves itself into it before it starts the
program (so every process of the run is in it from birth), and the trainer removes it after.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import suppress
from dataclasses import dataclass

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Hierarchy:
    """Where run cgroups go: one parent directory (v2), or one per controller in
    CONTROLLERS' order (v1)."""

    version: int
    parents: tuple[str, ...]


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, filesystem type, super options) of every cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        rest = fields[fields.index("-") + 1 :]
        if rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], rest[0], set(rest[2].split(","))))
    return found


def own_paths(cgroup: str) -> dict[str, str]:
    """A process's cgroup per controller ("" for v2's unified hierarchy), from the text of its
    /proc/PID/cgroup."""
    paths = {}
    for line in cgroup.splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            paths[name] = path
    return paths


def find_hierarchy(mountinfo: str | None = None, cgroup: str | None = None) -> Hierarchy | str:
    """The hierarchy that run cgroups can go into, else why none can (one sentence). Reads this
    process's /proc/self/mountinfo and /proc/self/cgroup unless given their texts."""
    try:
        if mountinfo is None:
            with open("/proc/self/mountinfo") as file:
                mountinfo = file.read()
        if cgroup is None:
            with open("/proc/self/cgroup") as file:
                cgroup = file.read()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    mounts, own = _mounts(mountinfo), own_paths(cgroup)
    v2 = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
    if v2 is not None and "" in own:
        parent = v2 + own[""].rstrip("/")
        try:
            with open(f"{parent}/cgroup.controllers") as file:
                offered = set(file.read().split())
        except OSError:
            offered = set()
        if offered.issuperset(CONTROLLERS):
            try:
                with open(f"{parent}/cgroup.subtree_control", "w") as file:
                    file.write(" ".join(f"+{name}" for name in CONTROLLERS))
                return Hierarchy(2, (parent,))
            except OSError as exc:
                # a non-root cgroup that holds processes (the trainer) cannot delegate
                v2_why = f"cgroup v2 at {parent} cannot enable its controllers ({exc.strerror})"
        else:
            missing = ", ".join(sorted(set(CONTROLLERS) - offered))
            v2_why = f"cgroup v2 at {parent} lacks {missing}"
    else:
        v2_why = "no cgroup v2 mount"
    parents = []
    for name in CONTROLLERS:
        point = next((p for p, kind, opts in mounts if kind == "cgroup" and name in opts), None)
        parent = None if point is None else point + own.get(name, "/").rstrip("/")
        if parent is None or not os.access(parent, os.W_OK):
            return f"{v2_why}; no writable cgroup v1 {name} hierarchy"
        parents.append(parent)
    return Hierarchy(1, tuple(parents))


class RunCgroup:
    """One run's cgroup, limits written: `procs` are the files the bootstrap writes "0" to,
    to move itself in; `oom_kills()` counts the processes the memory limit killed; `remove()`
    once the run's processes are gone."""

    def __init__(self, hierarchy: Hierarchy, memory_bytes: int, processes: int) -> None:
        self.hierarchy = hierarchy
        name = f"oncurve-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        self.dirs = [f"{parent}/{name}" for parent in hierarchy.parents]
        quota = f"{CPU_PERIOD_US} {CPU_PERIOD_US}"  # one CPU's worth per period
        if hierarchy.version == 2:
            settings = {
                "memory.max": memory_bytes,
                "memory.swap.max": 0,
                "memory.oom.group": 1,  # the kernel kills the whole run at once
                "pids.max": processes,
                "cpu.max": quota,
            }
            writes = [(self.dirs[0], settings)]
        else:
            memory, pids, cpu = self.dirs
            writes = [
                (memory, {"memory.limit_in_bytes": memory_bytes}),
                (memory, {"memory.memsw.limit_in_bytes": memory_bytes}),
                (pids, {"pids.max": processes}),
                (cpu, {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": CPU_PERIOD_US}),
            ]
        made = []
        try:
            for path in self.dirs:
                os.mkdir(path)
                made.append(path)
            for path, values in writes:
                for key, value in values.items():
                    if key.startswith(("memory.swap", "memory.memsw")) and not os.path.exists(
                        f"{path}/{key}"
                    ):
                        continue  # no swap accounting: nothing to bound there
                    with open(f"{path}/{key}", "w") as file:
                        file.write(str(value))
        except OSError:
            self.dirs = made
            self.remove()
            raise
        self.procs = [f"{path}/cgroup.procs" for path in self.dirs]

    def unthrottle(self) -> None:
        """Lift the CPU bound: a run that is being killed, or whose program has exited, must
        not wait for its next period for its processes to die."""
        path, key, value = (
            (self.dirs[0], "cpu.max", f"max {CPU_PERIOD_US}")
            if self.hierarchy.version == 2
            else (self.dirs[2], "cpu.cfs_quota_us", "-1")
        )
        with suppress(OSError), open(f"{path}/{key}", "w") as file:
            file.write(value)

    def oom_kills(self) -> int:
        name = "memory.events" if self.hierarchy.version == 2 else "memory.oom_control"
        try:
            with open(f"{self.dirs[0]}/{name}") as file:
                fields = dict(line.split() for line in file if line.strip())
        except OSError:
            return 0
        return int(fields.get("oom_kill", 0))

    def remove(self) -> None:
        """Remove the cgroups; the kernel may take a moment to let go of the last task."""
        for path in self.dirs:
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a task is still on its way out
                    time.sleep(0.01)
