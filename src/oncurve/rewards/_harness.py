"""The sandboxed side of an assert-style `code_tests` case: runs as main.py, standard library only.

`code.py` sends this file's text with ``run(<program source>, <setup source>)`` appended, and on
stdin a JSON object {"secret", "tests", "setup", "entry_point"}. The process forks before it
reads stdin:

- the child runs the program (stdin empty, stdout merged into stderr), then the row's setup code
  (so the program's functions read the names it defines, and it may use the program's classes),
  then serves requests from the parent: call one of its objects, read or set an attribute,
  iterate. Its answers travel by value (marshal, which takes exact built-in types only: an
  object that always says equal, or any subclass, comes back as an opaque reference);
- the parent runs the setup code and the tests in a process of its own, where the program's
  names are references into the child: every comparison, builtin and assert runs here, on
  values the child sent, so nothing the program patches, prints or exits with reaches the
  verdict. When the tests finish it prints ``<secret> pass`` on the stdout that the child never
  held. The child never sees the secret or the tests: they arrive after the fork, and this
  process is not dumpable, so the child cannot read them through /proc.

What the tests see (``_tests_namespace``): those of the program's names that they or the setup
code read, except that a builtin's name is always the builtin, a standard module's name always
the real module (imported here), and a name the setup code defines always the setup's; the
row's entry point, when given, is always the program's (MBPP's task 126 names its function
`sum`). Nothing the tests bind reaches the child.
An exception the program raises fails the case, whatever the tests do with it: it arrives as
``ProgramRaised``, which no iteration takes for its end and ``except Exception`` does not catch,
and the verdict is withheld even if a bare ``except`` swallows it. So is an error the program
causes here without raising (a reply that is not plain data, its process ended, an object of its
own asked for a truth value).

A case passes when stdout is exactly that line.
"""

from __future__ import annotations

import builtins
import importlib
import json
import marshal
import os
import sys
import types
from typing import Any

_PLAIN = (int, float, complex, str, bytes, bool, type(None), tuple, list, dict, set, frozenset)
# Marks, in a call's arguments, a reference to an object of the program's (`Pair(5, 24)` made
# by an earlier call and passed back): (_REF, index).
_REF = "\0oncurve-ref"
_MAX_MESSAGE = 1 << 28
_BUILTIN_NAMES = frozenset(dir(builtins))


class ProgramRaised(BaseException):
    """An exception of the program's, as the tests see it: a BaseException, so that neither an
    iteration (StopIteration) nor ``except Exception`` in the tests takes it for theirs."""


def _send(fd: int, message: object) -> None:
    data = marshal.dumps(message)
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the program's process ended")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int) -> Any:
    size = int.from_bytes(_read_exactly(fd, 4), "big")
    if size > _MAX_MESSAGE:
        raise ValueError("oversized message from the program's process")
    return marshal.loads(_read_exactly(fd, size))


def _serve(source: str, setup: str, requests: int, replies: int) -> None:
    """The child: run the program and the setup code, then answer the parent until it hangs
    up."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    objects = [namespace]
    dumps, send, receive = marshal.dumps, _send, _receive

    def encode(value):
        if type(value) is types.ModuleType:  # the parent imports the real one by its name
            return ("module", value.__name__)
        try:
            dumps(value)
            return ("value", value)
        except (ValueError, RecursionError):  # not plain data: the parent gets a reference
            objects.append(value)
            return ("ref", len(objects) - 1)

    try:
        exec(compile(source, "main.py", "exec"), namespace)
        if setup:
            exec(compile(setup, "<setup>", "exec"), namespace)
        send(replies, {k: encode(v) for k, v in namespace.items() if not k.startswith("__")})
        while True:
            kind, ref, *rest = receive(requests)
            target = objects[ref]
            try:
                if kind == "call":
                    args, kwargs, refs = rest
                    if refs:
                        args, kwargs = _map_refs((args, kwargs), lambda v: _deref(v, objects))
                    reply = encode(target(*args, **kwargs))
                elif kind == "getattr":
                    reply = encode(getattr(target, rest[0]))
                elif kind == "iter":
                    reply = encode(list(target))
                else:  # "setattr"
                    name, value, refs = rest
                    if refs:
                        value = _map_refs(value, lambda v: _deref(v, objects))
                    setattr(target, name, value)
                    reply = ("value", None)
            except Exception as exc:
                reply = ("raise", type(exc).__name__, str(exc)[:300])
            send(replies, reply)
    except BaseException as exc:
        print(f"the program stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        os._exit(0)


def _map_refs(value: Any, swap: Any) -> Any:
    """`value` with `swap` applied to each part, containers rebuilt around what it changed."""
    found = swap(value)
    if found is not value:
        return found
    kind = type(value)
    if kind in (list, tuple, set, frozenset):
        return kind(_map_refs(item, swap) for item in value)
    if kind is dict:
        return {_map_refs(k, swap): _map_refs(v, swap) for k, v in value.items()}
    return value


def _deref(value: Any, objects: list) -> Any:
    if type(value) is tuple and len(value) == 2 and value[0] == _REF and type(value[1]) is int:
        return objects[value[1]]
    return value


def _plain(value: object, depth: int = 0) -> bool:
    """Whether `value` is built-in data all the way down (no code objects, no subclasses)."""
    if type(value) not in _PLAIN or depth > 200:
        return False
    if type(value) is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if type(value) in (tuple, list, set, frozenset):
        return all(_plain(item, depth + 1) for item in value)
    return True


class _Remote:
    """An object of the program's: every use is a request to the child."""

    __slots__ = ("_link", "_ref")

    def __init__(self, link, ref):
        self._link, self._ref = link, ref

    def __call__(self, *args, **kwargs):
        try:
            marshal.dumps((args, kwargs))
            refs = False
        except ValueError:  # objects of the program's among them, or what cannot travel
            args, kwargs = _map_refs((args, kwargs), _mark)
            refs = True
        return self._link.ask("call", self._ref, args, kwargs, refs)

    def __getattr__(self, name):
        if name.startswith("__"):  # protocols the tests' code probes for (copy, pickle)
            raise AttributeError(name)
        return self._link.ask("getattr", self._ref, name)

    def __setattr__(self, name, value):
        if name in _Remote.__slots__:
            object.__setattr__(self, name, value)
            return
        try:
            marshal.dumps(value)
            refs = False
        except ValueError:
            value, refs = _map_refs(value, _mark), True
        self._link.ask("setattr", self._ref, name, value, refs)

    def __iter__(self):
        return iter(self._link.ask("iter", self._ref))

    def __bool__(self):
        # an object that calls itself true would pass `assert f(x)` whatever f computed
        self._link.raised = True
        raise ProgramRaised("an object of the program has no truth value in the tests")

    def __repr__(self):
        return "<object of the program>"


def _mark(value: Any) -> Any:
    return (_REF, value._ref) if type(value) is _Remote else value


class _Link:
    def __init__(self, requests: int, replies: int) -> None:
        self.requests, self.replies = requests, replies
        self.raised = False  # the program raised during the tests: the case fails

    def ask(self, *request: object) -> Any:
        try:
            marshal.dumps(request)
        except ValueError:  # an argument of the tests' that is not plain data
            raise TypeError("only plain data can be passed to the program") from None
        try:
            _send(self.requests, request)
            reply = _receive(self.replies)
        except (OSError, EOFError, ValueError, TypeError) as exc:  # its process ended or lied
            self.raised = True
            raise ProgramRaised(f"the program's process failed: {exc}") from None
        return self.decode(reply, request)

    def decode(self, reply: Any, request: tuple = ("names",)) -> Any:
        if type(reply) is tuple and reply and reply[0] == "ref" and type(reply[1]) is int:
            return _Remote(self, reply[1])
        if type(reply) is tuple and reply and reply[0] == "raise":
            if request[0] == "getattr" and reply[1] == "AttributeError":
                raise AttributeError(str(reply[2]))  # a missing attribute, as getattr says
            self.raised = True
            raise ProgramRaised(f"{reply[1]}: {reply[2]}")
        if type(reply) is not tuple or reply[0] != "value" or not _plain(reply[1]):
            self.raised = True
            raise ProgramRaised("the program's process sent something other than plain data")
        return reply[1]


def _real_module(name: str) -> types.ModuleType | None:
    """The top-level standard-library module `name`, imported here; None for any other name."""
    if name not in sys.stdlib_module_names:
        return None
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _names_read(*sources: str) -> set[str]:
    """The names that the code of `sources` looks up, from its compiled code objects."""
    names, stack = set(), [compile(source, "<tests>", "exec") for source in sources]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _tests_namespace(names: Any, link: _Link, read: set[str], entry_point: str | None) -> dict:
    """The tests' globals before the setup code runs: those of the program's names that the
    tests or the setup code read (module docstring)."""
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    if type(names) is not dict:
        raise TypeError("the program's process sent something other than its names")
    for name, reply in names.items():
        if type(name) is not str or type(reply) is not tuple or not reply:
            raise TypeError("the program's process sent something other than its names")
        if name not in read or (name != entry_point and name in _BUILTIN_NAMES):
            continue
        if reply[0] == "module" or (name != entry_point and name in sys.stdlib_module_names):
            # by the tests' name, never the program's: importing a module the program names
            # (`unittest.__main__`) could run code of its own here
            module = _real_module(name)
            if module is not None:
                namespace[name] = module
            continue
        namespace[name] = link.decode(reply)
    return namespace


def _judge(link: _Link) -> None:
    """The parent: run the setup code and the tests against the child's objects; print the
    verdict when they all pass and the program never raised (a failed assert raises out of
    here)."""
    job = json.loads(sys.stdin.read())
    entry_point = job.get("entry_point")
    read = _names_read(job["tests"], job.get("setup") or "")
    namespace = _tests_namespace(_receive(link.replies), link, read, entry_point)
    program_entry = namespace.get(entry_point) if entry_point else None
    if job.get("setup"):
        exec(compile(job["setup"], "<setup>", "exec"), namespace)
    if program_entry is not None:
        namespace[entry_point] = program_entry
    exec(compile(job["tests"], "<tests>", "exec"), namespace)
    if link.raised:
        raise ProgramRaised("the program raised, and the tests went on")
    os.write(1, f"{job['secret']} pass\n".encode())


def run(source: str, setup: str = "") -> None:
    """Judge one case of ``source`` after ``setup`` (module docstring); exit 1 when a test
    fails."""
    # Not dumpable before the fork: the child (the program) cannot open this process's
    # /proc/PID/mem or /proc/PID/fd/0, where the secret and the tests are. Without ctypes (the
    # fallback's audit hook refuses it) that barrier is missing, as docs/sandbox.md says.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    if os.fork() == 0:
        os.close(requests_w)
        os.close(replies_r)
        _serve(source, setup, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    try:
        _judge(_Link(requests_w, replies_r))
    except BaseException as exc:
        print(f"the tests failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
