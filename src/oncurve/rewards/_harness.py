"""The sandboxed side of an assert-style `code_tests` case: runs as main.py, standard library only.

`code.py` sends this file's text with ``run(<program source>)`` appended, and on stdin a JSON
object {"secret", "tests"}. The process forks before it reads stdin:

- the child runs the program (stdin empty, stdout merged into stderr), then serves requests
  from the parent: call one of its objects, read an attribute, iterate, set a global the program
  reads. Its answers travel by value (marshal, which takes exact built-in types only: an
  object that always says equal, or any subclass, comes back as an opaque reference);
- the parent runs the tests in a process of its own, with the program's names bound to
  references into the child: every comparison, builtin and assert runs here, on values the
  child sent, so nothing the program patches, prints or exits with reaches the verdict. When the
  tests finish it prints ``<secret> pass`` on the stdout that the child never held. The child
  never sees the secret or the tests: they arrive after the fork, and this process is not
  dumpable, so the child cannot read them through /proc.

A case passes when stdout is exactly that line. Globals that the program reads but does not
define (MBPP's ``test_setup_code``) are copied to the child as the tests define them.
"""

from __future__ import annotations

import ast
import builtins
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


def _serve(source: str, requests: int, replies: int) -> None:
    """The child: run the program, then answer the parent until it hangs up."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    objects = [namespace]
    dumps, send, receive = marshal.dumps, _send, _receive

    def encode(value):
        try:
            dumps(value)
            return ("value", value)
        except (ValueError, RecursionError):  # not plain data: the parent gets a reference
            objects.append(value)
            return ("ref", len(objects) - 1)

    try:
        exec(compile(source, "main.py", "exec"), namespace)
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
                elif kind == "set":
                    target[rest[0]] = rest[1]
                    reply = ("value", None)
                else:  # "import"
                    target[rest[0]] = __import__(rest[1])
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
        return self._link.ask("getattr", self._ref, name)

    def __iter__(self):
        return iter(self._link.ask("iter", self._ref))

    def __bool__(self):
        # an object that calls itself true would pass `assert f(x)` whatever f computed
        raise TypeError("an object of the program has no truth value in the tests")

    def __repr__(self):
        return "<object of the program>"


def _mark(value: Any) -> Any:
    return (_REF, value._ref) if type(value) is _Remote else value


class _Link:
    def __init__(self, requests: int, replies: int) -> None:
        self.requests, self.replies = requests, replies

    def ask(self, *request: object) -> Any:
        try:
            _send(self.requests, request)
        except ValueError:  # marshal: an argument that is not plain data
            raise TypeError("only plain data can be passed to the program") from None
        return self.decode(_receive(self.replies))

    def decode(self, reply: Any) -> Any:
        if reply[0] == "ref" and type(reply[1]) is int:
            return _Remote(self, reply[1])
        if reply[0] == "raise":
            found = getattr(builtins, str(reply[1]), None)
            error = found if isinstance(found, type) and issubclass(found, Exception) else None
            raise (error or RuntimeError)(f"{reply[1]}: {reply[2]}")
        if reply[0] != "value" or not _plain(reply[1]):
            raise TypeError("the program's process sent something other than plain data")
        return reply[1]


def _read_globals(source: str) -> set[str]:
    """Names that the program's code reads as globals, from its compiled code objects."""
    names, stack = set(), [compile(source, "main.py", "exec")]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _judge(source: str, link: _Link) -> None:
    """The parent: run the tests against the child's objects; print the verdict when they all
    pass (a failed assert raises out of here)."""
    job = json.loads(sys.stdin.read())
    program = {name: link.decode(reply) for name, reply in _receive(link.replies).items()}
    namespace = {"__name__": "__tests__", "__builtins__": builtins, **program}
    shared = _read_globals(source) - set(program)
    for statement in ast.parse(job["tests"]).body:
        before = {name: namespace.get(name) for name in shared}
        exec(compile(ast.Module([statement], []), "<tests>", "exec"), namespace)
        for name in shared:
            value = namespace.get(name)
            if name not in namespace or value is before[name]:
                continue
            if isinstance(value, types.ModuleType):
                link.ask("import", 0, name, value.__name__)
            elif _plain(value):
                link.ask("set", 0, name, value)
    os.write(1, f"{job['secret']} pass\n".encode())


def run(source: str) -> None:
    """Judge one case of ``source`` (module docstring); exit 1 when a test fails."""
    # Not dumpable before the fork: the child (the program) cannot open this process's
    # /proc/PID/mem or /proc/PID/fd/0, where the secret and the tests are. Without ctypes (the
    # fallback's audit hook refuses it) that barrier is missing, as the README says.
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
        _serve(source, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    try:
        _judge(source, _Link(requests_w, replies_r))
    except BaseException as exc:
        print(f"the tests failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
