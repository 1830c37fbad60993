"""The sandboxed side of an assert-style `code_tests` case: runs as main.py, standard library only.

`code.py` sends this file's text with ``run(<program source>, <setup source>)`` appended, and on
stdin a JSON object {"secret", "tests", "setup", "entry_point", "pytest"} ("pytest": the text of
`_pytest_style.py`). The process forks before it reads stdin:

- the child runs the program (stdin empty, what it prints discarded; an exit or exception at
  its top level, a demo block's, ends only that code), then the row's setup code (so the
  program's functions read the names it defines, and it may use the program's classes), then
  serves requests from the parent: call one of its objects, read or set an attribute, apply one
  of the operators that give the tests a value (`_OPERATIONS`: `len`, `str`, `[]`, ...), take
  the next items of an iterator. Its answers travel by value (marshal, which takes exact built-in
  types only: an object that always says equal, or any other subclass, comes back as an opaque
  reference), except a few standard-library types (`_STANDARD`), sent as their plain contents
  and rebuilt in the parent by its own constructors (a named tuple as one with its name and
  fields, a builtin type or function by its name); an object sent twice is one reference, so
  one object in the tests (`detect_cycle(a) is b`), and what a call both puts into an argument
  and returns is one object there.
  A call's arguments travel by value too, but the lists, dicts and sets among them (and the
  standard library's deques, Counters, OrderedDicts and defaultdicts) stay the tests' own
  (`_containers`): after the call each holds what the child's copy holds (a sort in
  place, a rotation), and one the call returns, or holds in what it returns, is the tests'
  object itself (so `deep_copy(x) is not x` fails for `return x`). A container the child kept
  from an earlier call is its own copy: later changes on either side do not reach the other;
- the parent runs the setup code and the tests in a process of its own, where the program's
  names are references into the child: every comparison, builtin and assert runs here, on
  values the child sent, so nothing the program patches, prints or exits with reaches the
  verdict. The tests run as the main script (what they print, to stdout or stderr, is
  discarded); when they finish, having used the program (called it, or read a value of its),
  it prints ``<secret> pass`` on the stdout that the child never held. The child never sees
  the secret or the tests: they arrive after the fork, and this process is not dumpable, so
  the child cannot read them through /proc.

What the tests see (``_tests_namespace``): those of the program's names that they or the setup
code read, except that a builtin's name is always the builtin, a standard module's name always
the real module (imported here), and a name the setup code defines always the setup's; the
row's entry point, when given, is always the program's (MBPP's task 126 names its function
`sum`), and a program that does not define it fails. Nothing the tests bind reaches the child.
The program is also the module `SOLUTION` (``from solution import f``; a star import binds
none of the names the tests have bound), and ``import pytest`` gets `_pytest_style.py`, whose
`run_tests` runs a pytest file's tests after its top level. An object of the program's equals only
itself, and an operator that would judge for the tests, handed what they expect (`==` with a value
of the tests', `!=`, `<`, `in`, a set's or a dict's too, arithmetic: `_JUDGING`), fails the
case, as does asking it for a truth value; an instance of a subclass of a built-in scalar type
(`_BASES`: an IntEnum's member) comes with its built-in value, taken through the built-in type's
own slot, and its comparisons, hash, truth value, `in`, arithmetic and the built-in type's
methods that only read it (`_READERS`: `startswith`, `count`) are that value's here, whatever its
methods say, and `isinstance` finds it an instance of that type; so are those of a container of
the program's objects, or an instance of a built-in container's subclass (`_CONTAINERS`), the
contents it holds, read through the container's own methods each time the tests use them. A
dataclass instance of the program's equals another of its class, one of them made by the tests'
call of the class with arguments its fields hold (`_Link.same_fields`), when their compared
fields are equal (`_dataclass_fields`). A dict's keys and items views travel as `_STANDARD`
objects.

An exception the program raises reaches the tests as an instance of the same builtin class,
made here from its arguments and plain attributes (`_Link.exception`; a class of the
program's own arrives as a class of that name deriving from its bases as they arrive, with
the message its `__str__` gave), for the tests to expect or not;
except those in `_SIGNALS` and those that are not an Exception, which fail the case whatever the
tests do with them: they arrive as ``ProgramRaised``, which no iteration takes for its end and
``except Exception`` does not catch, and the verdict is withheld even if a bare ``except``
swallows it. So is an error the program causes here without raising (a reply that is not plain
data, its process ended, an object of its own asked for a truth value).

A case passes when stdout is exactly that line.
"""

from __future__ import annotations

import ast
import builtins
import collections
import datetime
import decimal
import dis
import fractions
import functools
import importlib
import json
import marshal
import operator
import os
import signal
import sys
import types
from typing import Any

# Built-in data; a bytearray or memoryview travels as the bytes it equals (an array.array,
# which equals no bytes, is no plain data)
_PLAIN = (
    *(int, float, complex, str, bytes, bytearray, memoryview, bool, type(None)),
    *(tuple, list, dict, set, frozenset),
)
# Marks, in a call's arguments, a reference to an object of the program's (`Pair(5, 24)` made
# by an earlier call and passed back): (_REF, index).
_REF = "\0oncurve-ref"
# Marks a standard-library object sent as its plain contents: (_STD, kind, contents).
_STD = "\0oncurve-std"
# Marks, in a call's reply, one of the containers the call was given (`_containers`),
# which the tests get back as their own object: (_ARG, position).
_ARG = "\0oncurve-arg"
# Marks, in a container a call changed, an object of the program's it now holds: (_OBJ, index)
_OBJ = "\0oncurve-obj"
# The standard library's containers a call may change in place, kept as lists, dicts and sets
_STANDARD_MUTABLE = (
    collections.Counter,
    collections.OrderedDict,
    collections.defaultdict,
    collections.deque,
)
_MUTABLE = (list, dict, set, *_STANDARD_MUTABLE)
_MAPPINGS = frozenset((dict, collections.Counter, collections.OrderedDict, collections.defaultdict))
_WALKED = frozenset((list, tuple, dict, set, *_STANDARD_MUTABLE))
_SCALARS = frozenset((int, float, complex, str, bytes, bool, type(None)))
_STANDARD = {
    collections.Counter: ("Counter", dict, collections.Counter),
    collections.OrderedDict: ("OrderedDict", lambda v: list(v.items()), collections.OrderedDict),
    collections.deque: ("deque", lambda v: (list(v), v.maxlen), lambda c: collections.deque(*c)),
    fractions.Fraction: (
        "Fraction",
        lambda v: (v.numerator, v.denominator),
        lambda c: fractions.Fraction(*c),
    ),
    decimal.Decimal: ("Decimal", str, lambda c: _quiet_decimal(decimal.Decimal(c))),
    range: ("range", lambda v: (v.start, v.stop, v.step), lambda c: range(*c)),
    slice: ("slice", lambda v: (v.start, v.stop, v.step), lambda c: slice(*c)),
    datetime.date: ("date", lambda v: v.isoformat(), datetime.date.fromisoformat),
    datetime.datetime: ("datetime", lambda v: v.isoformat(), datetime.datetime.fromisoformat),
    datetime.time: ("time", lambda v: v.isoformat(), datetime.time.fromisoformat),
    datetime.timedelta: (
        "timedelta",
        lambda v: (v.days, v.seconds, v.microseconds),
        lambda c: datetime.timedelta(*c),
    ),
    # a dict's views of its keys and items compare as sets: rebuilt as views of a dict here
    type({}.keys()): ("dict_keys", list, lambda c: dict.fromkeys(c).keys()),
    type({}.items()): ("dict_items", list, lambda c: dict(c).items()),
}
_REBUILD = {kind: rebuild for kind, _, rebuild in _STANDARD.values()}
# The built-in types whose subclasses' instances (an IntEnum's members) travel as references
# with their built-in value, which their comparisons and hash read (`_Remote`), and how that
# value is taken: through the built-in type's own slot, which no method of the subclass replaces
_BASES = {
    int: int.__int__,
    float: float.__float__,
    complex: complex.__complex__,
    str: str.__str__,
    bytes: bytes.__bytes__,
}
# A reference's built-in value where it has none
_NO_VALUE = object()


def _base_value(value: Any) -> Any:
    """The built-in value of an instance of a subclass of one of `_BASES` (`Color.GREEN`'s 2),
    else `_NO_VALUE`."""
    for base, slot in _BASES.items():
        if issubclass(type(value), base) and type(value) is not base:
            try:
                found = slot(value)
            except Exception:
                return _NO_VALUE
            return found if type(found) is base else _NO_VALUE
    return _NO_VALUE


# The built-in containers whose subclasses' instances (a `class Row(list)`, a named tuple with
# methods of its own) travel as references that compare and hash as their contents (`_Remote`),
# read at each comparison (they change), and how those are taken: through the built-in type's own
# methods, which no method of the subclass replaces
_CONTAINERS = {
    list: list.copy,
    tuple: lambda v: tuple(tuple.__iter__(v)),
    dict: lambda v: dict(dict.items(v)),
    set: lambda v: set(set.__iter__(v)),
    frozenset: lambda v: frozenset(frozenset.__iter__(v)),
}
_CONTAINER_NAMES = {base.__name__: base for base in _CONTAINERS}


def _public(kind: type) -> frozenset[str]:
    return frozenset(name for name in dir(kind) if not name.startswith("_"))


# The methods of the built-in types of `_BASES` and `_CONTAINERS` that read a value without
# changing it: on an instance of a subclass, the built-in type's, applied to the value it
# compares as (`_Remote.__getattr__`)
_READERS = {
    **{base: _public(base) for base in (*_BASES, tuple, frozenset)},
    list: _public(tuple) | {"copy"},
    dict: frozenset(("get", "keys", "values", "items", "copy")),
    set: _public(frozenset),
}


# What `collections.namedtuple` writes into a named tuple's class
_NAMED_TUPLE_MADE = frozenset(
    ("__new__", "_make", "_replace", "__repr__", "_asdict", "__getnewargs__")
)


def _named_tuple_methods(kind: type) -> bool:
    """Whether named tuple class `kind`, or a class it derives from, defines a method or property
    of its own: its instances then travel as references (`_container_base`), whose methods the
    tests may call, not as their fields."""
    own = (types.FunctionType, property, classmethod, staticmethod)
    return any(
        isinstance(member, own) and name not in _NAMED_TUPLE_MADE
        for klass in kind.__mro__
        if klass is not tuple and klass is not object
        for name, member in vars(klass).items()
    )


def _container_base(value: Any) -> type | None:
    """The built-in container `value`'s class derives from (`_CONTAINERS`), where it is a
    subclass of one that no other rule sends (not a named tuple without methods of its own, nor
    a Counter or the like);
    None for any other value."""
    kind = type(value)
    if kind in _CONTAINERS or kind in _STANDARD or kind in _STANDARD_MUTABLE:
        return None
    if issubclass(kind, tuple) and hasattr(kind, "_fields") and not _named_tuple_methods(kind):
        return None
    return next((base for base in _CONTAINERS if issubclass(kind, base)), None)


def _dataclass_fields(value: Any) -> tuple[tuple, tuple, tuple] | None:
    """For an instance of a dataclass whose `==` is the one `dataclasses` wrote (its class asked
    for one and defines none of its own), without init-only fields: the fields its `__init__`
    takes, in order, and the names and values of those `==` compares; None for any other value."""
    kind = type(value)
    fields = getattr(kind, "__dataclass_fields__", None)
    params = getattr(kind, "__dataclass_params__", None)
    equal = getattr(getattr(kind, "__eq__", None), "__code__", None)
    if type(fields) is not dict or not getattr(params, "eq", False):
        return None
    if getattr(equal, "co_filename", None) != "<string>":  # not the one `dataclasses` wrote
        return None
    kinds = [getattr(getattr(f, "_field_type", None), "name", None) for f in fields.values()]
    if "_FIELD_INITVAR" in kinds:  # its `__init__` takes arguments that are no field
        return None
    own = [f for f, k in zip(fields.values(), kinds, strict=True) if k == "_FIELD"]
    compared = [f.name for f in own if f.compare]
    return (
        tuple(f.name for f in own if f.init),
        tuple(compared),
        tuple(getattr(value, name) for name in compared),
    )


def _quiet_decimal(value: decimal.Decimal) -> decimal.Decimal:
    """`value`, unless it is a signalling NaN (every comparison with it raises)."""
    if value.is_snan():
        raise ValueError("a signalling NaN")
    return value


# a defaultdict travels with its factory when that is one of these
_FACTORIES = {t.__name__: t for t in (list, dict, set, frozenset, int, float, str, tuple, bool)}
_REBUILD["defaultdict"] = lambda c: collections.defaultdict(
    _FACTORIES[c[0]] if c[0] is not None else None, c[1]
)
_REBUILD["namedtuple"] = lambda c: _named_tuple_class(c[0], tuple(c[1]))(*c[2])
_REBUILD["builtin"] = lambda name: _rebuild_builtin(name)
# items fetched ahead from an iterator of the program's, at most (doubling from 1 per request),
# and the iterators read ahead: the builtin containers', which run no code of the program's
_MAX_ITEMS = 1024
_READ_AHEAD = frozenset(
    type(iter(container))
    for container in ([], (), range(0), "", b"", bytearray(), {}, {}.values(), {}.items(), set())
)
_MAX_MESSAGE = 1 << 28
# the module test files import the program as (KodCode's `from solution import f`)
SOLUTION = "solution"
_BUILTIN_NAMES = frozenset(dir(builtins))
_BINDING_OPS = frozenset(("STORE_NAME", "DELETE_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"))


class _Missing(AttributeError):
    """A program's object without one of the attributes `_PROBED` or `_NAMED`, as `getattr`
    says to `dict()`, which probes for `keys`, or to the tests' `hasattr(x, "__dict__")` (a class
    with `__slots__` has none) and `hasattr(x, "__name__")`; any other missing attribute is the
    program's error (one it could raise on purpose to end a `try` the tests wrote for another)."""


_PROBED = frozenset(("keys", "__dict__"))
# Names a program's object answers for itself though they are a protocol's (`functools.wraps`
# copies them; tests read them)
_NAMED = frozenset(("__name__", "__qualname__", "__doc__"))


class ProgramRaised(BaseException):
    """An error of the program's that fails its case, as the tests see it: a BaseException, so
    that neither an iteration (StopIteration) nor ``except Exception`` in the tests takes it for
    theirs."""


# Python's own protocols take these for a signal (an iteration's end, a missing attribute), so
# one the program raised would end a loop, or answer a `getattr` or `hasattr`, that the tests
# did not write for it: the program's fail its case. Every other exception (an Exception's
# subclass) reaches the tests as the same builtin class, for them to expect or not; a class that
# is an exit or an interrupt as well (`class Bye(SystemExit, Exception)`) is one too.
_SIGNALS = (
    StopIteration,
    StopAsyncIteration,
    AttributeError,
    BaseExceptionGroup,
    SystemExit,
    KeyboardInterrupt,
    GeneratorExit,
)
_BUILTIN_EXCEPTIONS = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


# Where an exception of a class of the program's keeps the message its `__str__` gave there.
_MESSAGE = "\0message"


def _program_str(self: BaseException) -> str:
    return self.__dict__.get(_MESSAGE, Exception.__str__(self))


class _Thrown:
    """A reply that says the program raised `exception`, which the request raises in the
    tests."""

    def __init__(self, exception: BaseException) -> None:
        self.exception = exception


def _unmarked(part: Any) -> Any:
    return part


def _pack(value: Any, swap: Any = _unmarked, depth: int = 0, memo: dict | None = None) -> Any:
    """`value` as plain data: each standard-library object of `_STANDARD`, or a defaultdict
    (with its factory where that is a builtin type), as (_STD, kind, contents); a named tuple as a tuple; each part that
    `swap` changes (a reference of the tests') swapped; a container (`_MUTABLE`) that is in two
    places one object still, as marshal keeps it. TypeError for anything else."""
    if depth > 200:
        raise TypeError("nested too deep")
    found = swap(value)
    if found is not value:
        return found
    kind = type(value)
    if kind in (int, float, complex, str, bytes, bool, type(None)):
        return value
    memo = {} if memo is None else memo
    if kind in _MUTABLE and (seen := memo.get(id(value))) is not None and seen[0] is value:
        return seen[1]
    if kind in (list, tuple, set, frozenset):
        packed = kind(_pack(item, swap, depth + 1, memo) for item in value)
    elif kind is dict:
        packed = {
            _pack(k, swap, depth + 1, memo): _pack(v, swap, depth + 1, memo)
            for k, v in value.items()
        }
    elif kind in _STANDARD_MUTABLE:
        packed = _pack_object(value, swap, depth, memo)
    else:
        return _pack_object(value, swap, depth, memo)
    if kind in _MUTABLE:  # kept beside its source, whose id no other object takes meanwhile
        memo[id(value)] = (value, packed)
    return packed


def _pack_object(value: Any, swap: Any, depth: int, memo: dict) -> Any:
    """`_pack` of a value that is no builtin container."""
    kind = type(value)
    if kind in _STANDARD:
        name, contents, _ = _STANDARD[kind]
        return (_STD, name, _pack(contents(value), swap, depth + 1, memo))
    if kind is collections.defaultdict:
        factory = value.default_factory
        builtin = _FACTORIES.get(getattr(factory, "__name__", None)) is factory
        # a factory of the program's (a lambda) cannot travel: its mapping goes without one
        name = factory.__name__ if factory is not None and builtin else None
        return (_STD, "defaultdict", (name, _pack(dict(value), swap, depth + 1, memo)))
    if isinstance(value, tuple) and hasattr(kind, "_fields") and not _named_tuple_methods(kind):
        # a named tuple, with its fields
        items = tuple(_pack(item, swap, depth + 1, memo) for item in tuple.__iter__(value))
        fields = getattr(kind, "_fields", None)
        named = type(fields) is tuple and all(type(f) is str for f in fields)
        if not (named and len(fields) == len(items) and str.isidentifier(kind.__name__)):
            return items
        return (_STD, "namedtuple", (kind.__name__, fields, items))
    if kind in (type, types.BuiltinFunctionType):  # a builtin (`int`, `len`), by its name
        name = getattr(value, "__name__", None)
        if name in _BUILTIN_NAMES and getattr(builtins, name) is value:
            return (_STD, "builtin", name)
    raise TypeError(f"{kind.__name__} is not plain data")


@functools.lru_cache(maxsize=256)
def _named_tuple_class(name: str, fields: tuple) -> type:
    return collections.namedtuple(name, fields, rename=True)


def _rebuild_builtin(name: Any) -> Any:
    if type(name) is not str or name not in _BUILTIN_NAMES:
        raise ValueError(f"no builtin {name!r}")
    found = getattr(builtins, name)
    if type(found) not in (type, types.BuiltinFunctionType):
        raise ValueError(f"{name!r} is no builtin type or function")
    return found


def _unpack(value: Any, swap: Any = _unmarked, depth: int = 0, memo: dict | None = None) -> Any:
    """`value` with each (_STD, kind, contents) rebuilt and each other part that `swap` changes
    (a reference of the program's) swapped, a container (`_MUTABLE`) in two places one object still;
    ValueError for a mark that rebuilds nothing (and TypeError for a rebuilt object that cannot
    be a key or in a set)."""
    if depth > 200:
        raise ValueError("nested too deep")
    found = swap(value)
    if found is not value:
        return found
    kind = type(value)
    memo = {} if memo is None else memo
    if kind is tuple and len(value) == 3 and value[0] == _STD:
        # one packed deque or Counter in two places is one object, as a list is
        if (seen := memo.get(id(value))) is not None and seen[0] is value:
            return seen[1]
        rebuild = _REBUILD.get(value[1])
        try:
            rebuilt = rebuild(_unpack(value[2], swap, depth + 1, memo))
        except Exception as exc:
            raise ValueError(f"a malformed {value[1]!r}: {exc}") from None
        memo[id(value)] = (value, rebuilt)
        return rebuilt
    if kind in _MUTABLE and (seen := memo.get(id(value))) is not None and seen[0] is value:
        return seen[1]
    if kind in (list, tuple, set, frozenset):
        unpacked = kind(_unpack(item, swap, depth + 1, memo) for item in value)
    elif kind is dict:
        unpacked = {
            _unpack(k, swap, depth + 1, memo): _unpack(v, swap, depth + 1, memo)
            for k, v in value.items()
        }
    else:
        return value
    if kind in _MUTABLE:  # kept beside its source, whose id no other object takes meanwhile
        memo[id(value)] = (value, unpacked)
    return unpacked


def _containers(values: tuple, skip: dict | None = None, owners: list | None = None) -> list:
    """The containers (`_MUTABLE`) in `values` (a call's arguments, keyword ones last), each
    once, in the order a walk first meets them (into lists, tuples, named tuples, deques and the
    mappings' values, 200 deep; not into the objects whose ids `skip` holds, the program's
    own): the same positions in the tests' process and the program's, as marshal and
    `_pack`/`_unpack` keep an object that is in two places one object, and a named tuple
    travels as a tuple. `owners` gets, for each, the position in `values` of the argument it was met in."""
    found: list = []
    seen: dict[int, None] = {**(skip or {})}  # a dict: the program may have replaced `set`

    def walk(value: Any, depth: int) -> None:
        if id(value) in seen:
            return
        seen[id(value)] = None
        kind = type(value)
        if kind in _MUTABLE:
            found.append(value)
        if depth >= 200 or kind is set:
            return
        if kind in _MAPPINGS:
            items = [*value.values()]
        elif kind in (list, tuple):
            items = value
        else:  # a deque, or a named tuple as `_pack` reads one
            items = [*value] if kind is collections.deque else [*tuple.__iter__(value)]
        if _SCALARS.issuperset(map(type, items)):  # plain numbers and text: no loop in Python
            return
        for item in items:
            kind = type(item)
            if kind is list and _SCALARS.issuperset(map(type, item)):  # a row: no call for it
                if id(item) not in seen:
                    seen[id(item)] = None
                    found.append(item)
            elif kind in _WALKED or _walked(item):
                walk(item, depth + 1)

    seen[id(values)] = None
    for position, value in enumerate(values):
        met = len(found)
        if _walked(value):
            walk(value, 1)
        if owners is not None:
            owners.extend([position] * (len(found) - met))
    return found


def _packs(value: Any) -> bool:
    """Whether `_pack` reads `value` as data (of its kind, not its contents)."""
    kind = type(value)
    return (
        kind in _SCALARS
        or kind in (list, tuple, set, frozenset, dict, collections.defaultdict)
        or kind in _STANDARD
        or (
            isinstance(value, tuple) and hasattr(kind, "_fields") and not _named_tuple_methods(kind)
        )
        # a builtin by its name; a class of the program's (or `math.sqrt`) is its object
        or (
            kind in (type, types.BuiltinFunctionType)
            and getattr(builtins, getattr(value, "__name__", None) or "", None) is value
        )
    )


def _walked(item: Any) -> bool:
    """Whether `_containers` walks into `item`: a tuple, a named tuple or a `_MUTABLE`."""
    return type(item) in _WALKED or (isinstance(item, tuple) and hasattr(type(item), "_fields"))


def _holds(value: Any, received: list) -> bool:
    """Whether `value` is or holds one of the containers `received` (`_containers`)."""
    inside = {id(c) for c in _containers((value,))}
    return any(id(c) in inside for c in received)


def _marker(received: list) -> Any:
    """A `_pack` swap that marks each of the containers `received` as (_ARG, its position)."""
    positions = {id(c): k for k, c in enumerate(received)}

    def mark(part: Any) -> Any:
        if type(part) in _MUTABLE and id(part) in positions:
            return (_ARG, positions[id(part)])
        return part

    return mark


def _send(fd: int, message: object, data: bytes | None = None) -> None:
    """Writes `message`, or `data` where the caller has marshalled it already."""
    data = marshal.dumps(message) if data is None else data
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
    notes = os.dup(2)  # why the child stopped, for whoever reads the run's stderr
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    objects = [namespace]
    dereferenced: dict[int, None] = {}  # ids of the program's own objects among a call's arguments
    dumps, send, receive = marshal.dumps, _send, _receive
    references: dict[int, int] = {id(namespace): 0}  # each object's index in `objects`

    def reference(value):
        """The one reference of `value` (its index in `objects`): the same object is the same
        object in the tests (`detect_cycle(a) is b`)."""
        if id(value) not in references:  # `objects` keeps it, and so its id, alive
            objects.append(value)
            references[id(value)] = len(objects) - 1
        return references[id(value)]

    def describe(cls, depth=0):
        """A builtin exception class's name; a standard module's as ("std", module, name); a
        class of the program's as (reference, name, its exception bases described)."""
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
        module = getattr(cls, "__module__", None)
        top = module.partition(".")[0] if type(module) is str else None
        if top in sys.stdlib_module_names and top != "__main__":
            return ("std", module, cls.__qualname__)
        if depth > 30:
            raise RecursionError("exception classes nested too deep")
        bases = tuple(
            describe(b, depth + 1)
            for b in cls.__bases__
            if isinstance(b, type) and issubclass(b, BaseException)
        )
        return (reference(cls), cls.__name__, bases)

    def plain(value):
        try:
            dumps(value)
            return _plain(value)
        except (ValueError, RecursionError):
            return False

    def raised(exc):
        """("raise", its class described, str(exc), args, plain attributes)."""
        args = exc.args if plain(exc.args) else (str(exc)[:300],)
        own = getattr(exc, "__dict__", {})
        attributes = {
            k: v for k, v in own.items() if type(k) is str and not k.startswith("__") and plain(v)
        }
        return ("raise", describe(type(exc)), str(exc)[:300], args, attributes)

    def based(value, mark=_unmarked):
        """A `_pack` swap: `mark`, an instance of a subclass of a built-in scalar type (an
        IntEnum's member) as (_OBJ, its reference, its built-in value), and one of a built-in
        container's (`_container_base`) as (_OBJ, its reference, [that container's name])."""
        found = mark(value)
        if found is not value or type(value) in _SCALARS:
            return found
        base = _base_value(value)
        if base is not _NO_VALUE:
            return (_OBJ, reference(value), base)
        container = _container_base(value)
        return value if container is None else (_OBJ, reference(value), [container.__name__])

    def encode(value, mark=None, memo=None):
        """A reply's value: plain data as it is, a standard-library object packed (an IntEnum's
        member in it as a reference with its built-in value), anything else (a list of the
        program's other objects too: one live object, compared by its contents) a reference,
        with its built-in value where it has one. `mark`: a call's result that holds what the
        call was given, or shares a container it sends back changed, packed with `memo`, those
        containers' packing (an object in both is one)."""
        if type(value) is types.ModuleType:  # the parent imports the real one by its name
            return ("module", value.__name__)
        if isinstance(value, type) and issubclass(value, BaseException):
            return ("exception class", describe(value))
        if mark is not None:
            try:
                packed = _pack(value, lambda part: based(part, mark), 0, memo)
                dumps(packed)
                return ("packed", packed)
            except (TypeError, ValueError, RecursionError):
                pass
        if plain(value):  # marshal would send an array as the bytes it does not equal
            return ("value", value)
        base = _base_value(value)
        if base is not _NO_VALUE:
            return ("ref", reference(value), base)
        try:
            packed = _pack(value, based)
            dumps(packed)
            return ("packed", packed)
        except (TypeError, ValueError, RecursionError):  # not plain data: a reference
            pass
        # a container subclass, or a container holding objects of the program's: its contents
        # are read when the tests compare it
        container = type(value) if type(value) in _CONTAINERS else _container_base(value)
        if container is not None:
            return ("ref", reference(value), [container.__name__])
        return ("ref", reference(value))

    def deref(value):
        if type(value) is tuple and len(value) == 2 and value[0] == _REF:
            found = objects[value[1]]
            dereferenced[id(found)] = None
            return found
        return value

    def snapshot(container):
        # marshal's version 2 writes no references, whose flags follow reference counts: the
        # same contents give the same bytes however many names hold them; a deque or Counter
        # in it as `_pack` writes it
        try:
            return marshal.dumps(container, 2)
        except (ValueError, RecursionError):
            pass
        try:
            return marshal.dumps(_pack(container), 2)
        except (TypeError, ValueError, RecursionError):
            return None

    def objects_marked(mark):
        """`mark`, and an object of the program's (what `_pack` takes for no data) as
        (_OBJ, its reference): a list it sorted or grew holds them."""

        def swap(part):
            found = based(part, mark)
            if found is not part or _packs(part):
                return found
            return (_OBJ, reference(part))

        return swap

    def contents(received, changed, mark, memo):
        """Each container a call was given as it is after the call: ("value", items) (a dict's
        items as pairs) where they are numbers and text, else ("packed", items) with the
        containers in them marked; None for one in an argument the call left as it was, or
        that holds what cannot travel."""
        states = []
        for container, moved in zip(received, changed, strict=True):
            state = None
            if moved:
                mapping = type(container) in _MAPPINGS
                items = list(container.items()) if mapping else list(container)
                flat = [*container.keys(), *container.values()] if mapping else items
                try:
                    if _SCALARS.issuperset(map(type, flat)):  # marshal's own speed
                        state = ("value", items)
                    else:
                        state = ("packed", _pack(items, objects_marked(mark), 3, memo))
                    dumps(state)
                except (TypeError, ValueError, RecursionError):
                    state = None
            states.append(state)
        return states

    try:
        try:
            exec(compile(source, "main.py", "exec"), namespace)
        except BaseException as exc:  # a demo block's exit or input(): the tests call the rest
            os.write(notes, f"the program's top level raised {type(exc).__name__}\n".encode())
        if setup:
            exec(compile(setup, "<setup>", "exec"), namespace)
        send(replies, {k: encode(v) for k, v in namespace.items() if not k.startswith("__")})
        while True:
            kind, ref, *rest = receive(requests)
            target = objects[ref]
            try:
                if kind == "call":
                    args, kwargs, packed = rest
                    dereferenced.clear()
                    if packed:
                        args, kwargs = _unpack((args, kwargs), deref)
                    arguments, owners = (*args, *kwargs.values()), []
                    # the containers given, as given (the call may move them); the tests' side
                    # walks its own only when the reply says one changed or came back
                    received = _containers(arguments, dereferenced, owners)
                    # an argument's snapshot holds its containers': one unchanged left them so
                    before = {}
                    for k, argument in enumerate(arguments):
                        if _walked(argument) and id(argument) not in dereferenced:
                            before[k] = snapshot(argument)
                    value, returned = None, False
                    try:
                        value = target(*args, **kwargs)
                        returned = True
                    except Exception as exc:  # what it did to its arguments before still counts
                        reply = raised(exc)
                    changed = {
                        k
                        for k, was in before.items()
                        if was is None or snapshot(arguments[k]) != was
                    }
                    if not (changed or (returned and _walked(value))):
                        received = []  # nothing given came back changed, nor could be returned
                    mark, memo = _marker(received), {}
                    if returned:
                        # packed with the containers sent back changed where it shares one: a
                        # row it added to an argument and returned is one row in the tests
                        now = tuple(arguments[k] for k in changed)
                        shares = bool(now) and _walked(value)
                        shares = shares and _holds(value, _containers(now, dereferenced))
                        gives_back = shares or (bool(received) and _holds(value, received))
                        reply = encode(value, mark if gives_back else None, memo)
                    if received:
                        moved = [k in changed for k in owners]
                        states = contents(received, moved, mark, memo)
                        reply = ("shared", reply, states, len(received))
                elif kind == "method":  # a protocol of its class (`len(x)`, `x < y`, `x[i]`)
                    name, args, packed = rest
                    if packed:
                        args = _unpack(args, deref)
                    reply = encode(_OPERATIONS[name](target, *args))
                elif kind == "getattr":
                    reply = encode(getattr(target, rest[0]))
                elif kind == "contents":  # a container's, with the program's objects marked
                    base = type(target) if type(target) in _CONTAINERS else _container_base(target)
                    found = _CONTAINERS[base](target)
                    reply = ("packed", _pack(found, objects_marked(_unmarked)))
                    dumps(reply)
                elif kind == "fields":  # a dataclass instance's, for `==` in the tests
                    found = _dataclass_fields(target)
                    reply = ("value", None)
                    try:
                        if found is not None:
                            init, names, values = found
                            packed = _pack(values, objects_marked(_unmarked))
                            dumps(packed)
                            reply = ("packed", (reference(type(target)), init, names, packed))
                    except (TypeError, ValueError, RecursionError):  # too deep: compared as one
                        pass
                elif kind == "iter":
                    reply = ("ref", reference(iter(target)))
                elif kind == "next":
                    items, end = [], ("more",)
                    # a builtin iterator is read ahead; one of the program's code one item at a
                    # time (its side effects happen when the tests ask)
                    count = rest[0] if type(target) in _READ_AHEAD else 1
                    try:
                        while len(items) < count:
                            items.append(encode(next(target)))
                    except StopIteration:
                        end = ("stop",)
                    except Exception as exc:  # the tests see it after the items before it
                        end = raised(exc)
                    reply = ("items", items, end)
                else:  # "setattr"
                    name, value, packed = rest
                    if packed:
                        value = _unpack(value, deref)
                    setattr(target, name, value)
                    reply = ("value", None)
            except Exception as exc:
                reply = raised(exc)
            send(replies, reply)
    except BaseException as exc:
        os.write(notes, f"the program stopped: {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(0)


def _plain(value: object, depth: int = 0) -> bool:
    """Whether `value` is built-in data all the way down (no code objects, no subclasses)."""
    if type(value) not in _PLAIN or depth > 200:
        return False
    if type(value) is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if type(value) in (tuple, list, set, frozenset):
        if _SCALARS.issuperset(map(type, value)):  # numbers and text: no call per item
            return True
        return all(_plain(item, depth + 1) for item in value)
    return True


class _Remote:
    """An object of the program's: every use is a request to the child."""

    __slots__ = ("_oncurve_link", "_oncurve_ref", "_oncurve_value", "_oncurve_container")

    def __init__(self, link, ref, value=_NO_VALUE, container=None):
        self._oncurve_link, self._oncurve_ref = link, ref
        # an instance of a built-in scalar type's subclass: its built-in value (`_base_value`)
        self._oncurve_value = value
        # an instance of a built-in container's subclass: that container (`_container_base`)
        self._oncurve_container = container

    @property
    def __class__(self) -> type:
        # what `isinstance` reads beside the type: an instance of a built-in type's subclass is
        # an instance of that built-in type (`isinstance(row, list)`), as the child found it
        if self._oncurve_container is not None:
            return self._oncurve_container
        if self._oncurve_value is not _NO_VALUE:
            return type(self._oncurve_value)
        return _Remote

    def _valued(self) -> bool:
        """Whether this object compares as a built-in value (`_builtin`)."""
        return self._oncurve_value is not _NO_VALUE or self._oncurve_container is not None

    def _builtin(self) -> Any:
        """The built-in value this object compares as: a scalar subclass's, or a container's
        contents as they are now, a container of that type (anything else fails the case) whose
        objects of the program's are references; `_NO_VALUE` for an object without one."""
        if self._oncurve_container is None:
            return self._oncurve_value
        contents = self._oncurve_link.ask("contents", self._oncurve_ref)
        if type(contents) is not self._oncurve_container:
            self._oncurve_link.raised = True
            raise ProgramRaised("the program's process sent contents of another type")
        return contents

    def __call__(self, *args, **kwargs):
        arguments = (*args, *kwargs.values())
        request = ("call", self._oncurve_ref, args, kwargs, False)
        try:
            data = marshal.dumps(request)  # what is sent: a large argument is written once
        except ValueError:  # objects of the program's among them, or of the standard library
            packed_args, packed_kwargs = self._oncurve_link.outgoing((args, kwargs))
            request = ("call", self._oncurve_ref, packed_args, packed_kwargs, True)
            data = None
        self._oncurve_link.arguments = arguments
        try:
            made = self._oncurve_link.ask(*request, data=data)
            if type(made) is _Remote and made._oncurve_ref not in self._oncurve_link.made:
                # what the tests made by calling this object (a class): a dataclass instance
                # that holds these arguments equals one of the program's with the same fields
                self._oncurve_link.made[made._oncurve_ref] = (self._oncurve_ref, args, kwargs)
            return made
        finally:
            self._oncurve_link.arguments = ()
            self._oncurve_link.given = []

    def __getattr__(self, name):
        # protocols the tests' code probes for (copy, pickle) are not the program's, but
        # whether its object has a `__dict__` (a class with `__slots__` has none) is, and its
        # names are
        if name.startswith("__") and name not in _PROBED and name not in _NAMED:
            raise AttributeError(name)
        found = self._oncurve_link.ask("getattr", self._oncurve_ref, name)
        if type(found) is _Remote and name in _READERS.get(self.__class__, ()):
            # code of the program's where its built-in type has a method that only reads it (a
            # named tuple's field of that name is data): a subclass's `startswith` or `count`
            # would answer whatever the tests ask, so the built-in type's answers, on the value
            # this object compares as
            return getattr(self._builtin(), name)
        return found

    @property
    def __doc__(self):  # the program's object's, not this class's
        return self._oncurve_link.ask("getattr", self._oncurve_ref, "__doc__")

    def __setattr__(self, name, value):
        if name in _Remote.__slots__:
            object.__setattr__(self, name, value)
            return
        try:
            marshal.dumps(value)
            packed = False
        except ValueError:
            value, packed = self._oncurve_link.outgoing(value), True
        self._oncurve_link.ask("setattr", self._oncurve_ref, name, value, packed)

    def __iter__(self):
        iterator = self._oncurve_link.ask("iter", self._oncurve_ref)
        if type(iterator) is not _Remote:  # else `iter()` would raise the judge's TypeError
            self._oncurve_link.raised = True
            raise ProgramRaised("the program's process sent something other than an iterator")
        # iterated again: an object that starts over (its `__iter__` resets it) may have more
        items, end, _ = self._oncurve_link.fetched.get(iterator._oncurve_ref, ([], ("more",), 1))
        if not items and end in (("more",), ("stop",)):  # an error it ended on stays pending
            self._oncurve_link.fetched.pop(iterator._oncurve_ref, None)
        return iterator

    def __next__(self):
        return self._oncurve_link.next_item(self._oncurve_ref)

    def __bool__(self):
        # an object that calls itself true would pass `assert f(x)` whatever f computed: only
        # one with a built-in value has one, that value's
        if not self._valued():
            self._oncurve_link.raised = True
            raise ProgramRaised("an object of the program has no truth value in the tests")
        return bool(self._builtin())

    def __contains__(self, item):
        # `x in f(y)` would ask the program whether the tests' item is there
        if not self._valued():
            return _refused("__contains__")(self, item)
        return item in self._builtin()

    def __eq__(self, other):
        # identity among the program's objects: an object that says it equals anything passes
        # no `f(x) == Point(4, 6)` with a point the program makes; against a value of the tests'
        # it would judge for them (unequal to all: `assert f(x) not in [4, 5]`, `assert not
        # f(x) == 4`), so the case fails, unless it is an instance of a built-in scalar type's
        # subclass (`Color.GREEN == 2`), which compares its built-in value, whatever its own
        # `__eq__` says
        if not self._valued() and type(other) is not _Remote:
            return _refused("__eq__")(self, other)
        if other is not self and not self._valued() and not other._valued():
            same = self._oncurve_link.same_fields(self, other)
            if same is not None:
                return same
        return self._compared(other, operator.eq)

    def __ne__(self, other):
        if not self._valued():
            return _refused("__ne__")(self, other)
        return self._compared(other, operator.ne)

    def __lt__(self, other):
        return self._ordered(other, "__lt__", operator.lt)

    def __le__(self, other):
        return self._ordered(other, "__le__", operator.le)

    def __gt__(self, other):
        return self._ordered(other, "__gt__", operator.gt)

    def __ge__(self, other):
        return self._ordered(other, "__ge__", operator.ge)

    def __hash__(self):
        if not self._valued():
            # `x in s` with a set or a dict looks up the hash and compares only the items that
            # share it: none would, and `f(x) not in {4, 5}` would pass whatever f returned
            if _judging_hash(sys._getframe(1)):
                return _refused("__hash__")(self)
            return self._oncurve_link.method(self._oncurve_ref, "__hash__", ())
        return hash(self._builtin())

    def _compared(self, other, compare):
        """`compare` on the built-in values of this object and `other` (a reference with one, or
        the tests' own value); NotImplemented where either reference has none."""
        if type(other) is _Remote:
            if not other._valued():
                return NotImplemented
            other = other._builtin()
        if not self._valued():
            return NotImplemented
        return compare(self._builtin(), other)

    def _ordered(self, other, name, compare):
        """An ordering by built-in values (`_compared`); refused for a reference without one."""
        if not self._valued():
            return _refused(name)(self, other)
        found = self._compared(other, compare)
        return _refused(name)(self, other) if found is NotImplemented else found


_CONTAINS_OP = dis.opmap["CONTAINS_OP"]


def _judging_hash(frame: types.FrameType | None) -> bool:
    """Whether a hash asked for by `frame` is for an `in` or `not in`: the first frame outside
    this file (whose own code takes the hash of a container's contents) is at its CONTAINS_OP
    instruction."""
    here = _judging_hash.__code__.co_filename
    while frame is not None and frame.f_code.co_filename == here:
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _CONTAINS_OP


def _forwarded(name: str) -> Any:
    def protocol(self, *args):
        return self._oncurve_link.method(self._oncurve_ref, name, args)

    protocol.__name__ = name
    return protocol


def _refused(name: str) -> Any:
    def protocol(self, *args):
        self._oncurve_link.raised = True
        raise ProgramRaised(f"the tests applied {name} to an object of the program's")

    protocol.__name__ = name
    return protocol


def _arithmetic(name: str, function: Any, reflected: bool) -> Any:
    """Operator `name` of `_JUDGING` (`function`, its operands swapped where `reflected`) on a
    reference with a built-in value: on that value (`Color.RED + 1`, `abs(half(3) - 1.5)`), and
    the other operand's where it is such a reference too; refused for a reference without one."""
    refused = _refused(name)

    def protocol(self, *args):
        if not self._valued():
            return refused(self, *args)
        value = self._builtin()
        args = tuple(a._builtin() if type(a) is _Remote and a._valued() else a for a in args)
        return function(*args, value) if reflected else function(value, *args)

    protocol.__name__ = name
    return protocol


# The protocols of a program's object that give the tests a value to judge (`len`, `str`,
# `repr`, `[]`, `hash`, `abs`, `int`, `round`, `format`): the child applies the operator itself,
# with Python's fallbacks, and the result comes back as any reply does (an unsupported one as the
# TypeError Python raises). The protocols that would judge for the tests, handed the value they
# expect (`!=`, `<`, `in`, `-`: `abs(f(x) - y) < 1e-6` would ask the program's `__sub__` how far
# it is from `y`), fail the case instead, as the TypeError the judge would raise could be caught,
# unless the object has a built-in value, which they are applied to here (`_arithmetic`).
_OPERATIONS = {
    "__len__": len,
    "__getitem__": operator.getitem,
    "__setitem__": operator.setitem,
    "__delitem__": operator.delitem,
    "__hash__": hash,
    "__str__": str,
    "__repr__": repr,
    "__neg__": operator.neg,
    "__pos__": operator.pos,
    "__abs__": abs,
    "__int__": int,
    "__float__": float,
    "__index__": operator.index,
    "__round__": round,
    "__format__": format,
    # `isinstance(s, Stack)` with a class of the program's: its own answer, as in one process
    "__instancecheck__": lambda cls, instance: isinstance(instance, cls),
    "__subclasscheck__": lambda cls, subclass: issubclass(subclass, cls),
}
_BINARY = {
    **{op: getattr(operator, op) for op in ("add", "sub", "mul", "matmul", "truediv", "floordiv")},
    **{"mod": operator.mod, "pow": pow, "divmod": divmod},
    **{"and": operator.and_, "or": operator.or_, "xor": operator.xor},
}
_JUDGING = {
    **{f"__{op}__": (function, False) for op, function in _BINARY.items()},
    **{f"__r{op}__": (function, True) for op, function in _BINARY.items()},
    "__lshift__": (operator.lshift, False),
    "__rshift__": (operator.rshift, False),
}
for _name in _OPERATIONS.keys() - {"__hash__"}:  # `_Remote.__hash__` forwards it itself
    setattr(_Remote, _name, _forwarded(_name))
for _name, (_function, _reflected) in _JUDGING.items():
    setattr(_Remote, _name, _arithmetic(_name, _function, _reflected))


def _outgoing(value: Any) -> Any:
    """An argument of the tests' as plain data, with the program's objects as (_REF, index);
    TypeError for one that cannot travel."""

    def mark(part):
        return (_REF, part._oncurve_ref) if type(part) is _Remote else part

    try:
        return _pack(value, mark)
    except TypeError:
        raise TypeError("only plain data can be passed to the program") from None


class _Link:
    def __init__(self, requests: int, replies: int) -> None:
        self.requests, self.replies = requests, replies
        self.raised = False  # the program raised during the tests: the case fails
        self.used = False  # the tests called the program or read a value of its
        # each reference's object here (the same object for the same reference), and the class
        # standing in for each exception class of the program's
        self.remotes: dict[int, Any] = {}
        # per iterator of the program's: (items fetched ahead, how it ended, next batch size)
        self.fetched: dict[int, tuple[list, tuple, int]] = {}
        # the call being made: its arguments, and the containers among them
        # (`_containers`), walked when its reply says it changed or returned one
        self.arguments: tuple = ()
        self.given: list = []
        # while a call's reply is read: one unpacking of its value and the containers it sent
        # back changed, so an object in both is one object
        self.memo: dict | None = None
        # each reference the tests' call of another made first: (that one, args, kwargs)
        self.made: dict[int, tuple[int, tuple, dict]] = {}

    def fields(self, remote: _Remote) -> tuple | None:
        """(its class's reference, its `__init__`'s fields, the names and values of its compared
        fields) for a dataclass instance of the program's (`_dataclass_fields`); None for any
        other object."""
        found = self.ask("fields", remote._oncurve_ref)
        if found is None:
            return None
        if not (
            type(found) is tuple
            and len(found) == 4
            and type(found[0]) is int
            and all(type(part) is tuple for part in found[1:])
            and all(type(name) is str for name in (*found[1], *found[2]))
            and len(found[2]) == len(found[3])
        ):
            self.raised = True
            raise ProgramRaised("the program's process sent malformed fields")
        return found

    def holds_what_was_given(self, remote: _Remote, fields: tuple) -> bool:
        """Whether the tests made `remote` by calling the class `fields` names, its class
        compares some field, and each field they gave a value (by position, in `__init__`'s
        order, or by name) is one it compares that holds it: the same object of the program's,
        or data (`_PLAIN`, `_STANDARD`) of the same type and value. (A field it does not compare
        would make every instance equal whatever the tests gave it.)"""
        made = self.made.get(remote._oncurve_ref)
        if made is None or made[0] != fields[0]:
            return False
        _, args, kwargs = made
        init, names, values = fields[1:]
        if len(args) > len(init):
            return False
        given = {**dict(zip(init, args, strict=False)), **kwargs}
        compared = dict(zip(names, values, strict=True))
        if not compared:
            return False
        for name, argument in given.items():
            if name not in compared:
                return False
            value = compared[name]
            data = _plain(argument) or type(argument) in _STANDARD
            if not (
                value is argument or (data and type(value) is type(argument) and value == argument)
            ):
                return False
        return True

    def same_fields(self, a: _Remote, b: _Remote) -> bool | None:
        """`a == b` for two dataclass instances of the program's, one of them made by the tests
        with the fields they gave it (`holds_what_was_given`): the same class, and equal compared
        fields; None (they are unequal unless one object) for any other two objects."""
        found_a, found_b = self.fields(a), self.fields(b)
        if found_a is None or found_b is None:
            return None
        if not (self.holds_what_was_given(a, found_a) or self.holds_what_was_given(b, found_b)):
            return None
        same_class = found_a[0] == found_b[0] and found_a[2] == found_b[2]
        return same_class and found_a[3] == found_b[3]

    def method(self, ref: int, name: str, args: tuple) -> Any:
        """What protocol `name` of the program's object `ref` gives for `args`."""
        packed = False
        try:
            marshal.dumps(args)
        except ValueError:
            args, packed = self.outgoing(args), True
        return self.ask("method", ref, name, args, packed)

    def outgoing(self, value: Any) -> Any:
        """`_outgoing(value)`; a value of the tests' that cannot reach the program fails the
        case (the tests cannot be run on it as written, and an error here would be theirs to
        catch)."""
        try:
            return _outgoing(value)
        except TypeError:
            self.raised = True
            raise ProgramRaised("the tests pass the program a value that cannot reach it") from None

    def ask(self, *request: object, data: bytes | None = None) -> Any:
        """The child's answer to `request` (`data`: the request marshalled, where the caller
        has it)."""
        self.used = True
        try:
            data = marshal.dumps(request) if data is None else data
        except ValueError:  # an argument of the tests' that is not plain data
            self.raised = True
            raise ProgramRaised("the tests pass the program a value that cannot reach it") from None
        try:
            _send(self.requests, request, data)
            result = self.decode(_receive(self.replies), request)
        except (ProgramRaised, _Missing):
            raise
        except Exception as exc:  # its process ended or lied (a MemoryError, a RecursionError)
            self.raised = True
            raise ProgramRaised(f"the program's process failed: {type(exc).__name__}") from None
        if type(result) is _Thrown:
            raise result.exception
        return result

    def next_item(self, ref: int) -> Any:
        """The next item of the program's iterator `ref`, asked for in batches that double up to
        `_MAX_ITEMS` (the child fills them only from a builtin container's iterator, one item
        otherwise); StopIteration at its end, and its error after the items before it."""
        items, end, batch = self.fetched.get(ref, ([], ("more",), 1))
        if not items and end == ("more",):
            reply = self.ask("next", ref, batch)
            if type(reply) is not tuple or len(reply) != 2 or type(reply[0]) is not list:
                self.raised = True
                raise ProgramRaised("the program's process sent something other than items")
            items, end, batch = reply[0], reply[1], min(2 * batch, _MAX_ITEMS)
        if items:
            self.fetched[ref] = (items[1:], end, batch)
            return items[0]
        if end == ("stop",):
            self.fetched[ref] = ([], end, batch)
            raise StopIteration
        error = self.exception(end)
        # an error the tests may catch ends this batch only: asked again, the program's iterator
        # says what comes next (a generator that raised has ended); any other stays pending
        self.fetched[ref] = ([], ("more",) if not self.raised else end, batch)
        raise error

    def given_back(self, part: Any) -> Any:
        """An `_unpack` swap: (_ARG, position) as the tests' own container the call gave,
        (_OBJ, reference) as the program's object."""
        if type(part) is tuple and len(part) in (2, 3) and part[0] == _OBJ and type(part[1]) is int:
            return self.decode(("ref", *part[1:]))
        if type(part) is tuple and len(part) == 2 and part[0] == _ARG:
            position = part[1]
            if type(position) is not int or not 0 <= position < len(self.given):
                raise ValueError("a mark of no container the call gave")
            return self.given[position]
        return part

    def restored(self, state: Any) -> Any:
        """The items of one container as `contents` sent them (None: leave it)."""
        if state is None:
            return None
        if type(state) is not tuple or len(state) != 2 or state[0] not in ("value", "packed"):
            raise ValueError("a state that is no (kind, items)")
        return state[1] if state[0] == "value" else _unpack(state[1], self.given_back, 0, self.memo)

    def restore(self, states: Any) -> None:
        """Makes each container the call gave hold what the program's copy holds after it
        (`_Link.given`, states as `contents` sends them; None leaves one as it was)."""
        if type(states) is not list or len(states) != len(self.given) or not _plain(states):
            self.raised = True
            raise ProgramRaised("the program's process sent malformed arguments back")
        try:
            unpacked = [self.restored(state) for state in states]
            for container, items in zip(self.given, unpacked, strict=True):
                if items is None:
                    continue
                if type(items) is not list:
                    raise ValueError("contents that are not a list")
                if type(container) is list:
                    container[:] = items
                    continue
                if type(container) is collections.deque:
                    container.clear()
                    container.extend(items)
                    continue
                rebuilt = dict(items) if type(container) in _MAPPINGS else set(items)
                container.clear()
                container.update(rebuilt)  # a Counter's after `clear`: set, not added
        except Exception as exc:  # unhashable items, pairs that are not pairs
            self.raised = True
            raise ProgramRaised(
                f"the program's process sent arguments back malformed: {exc}"
            ) from None

    def exception(self, reply: Any) -> BaseException:
        """The exception of a ("raise", class described, message, args, attributes) reply, as
        the tests see it: an instance of that builtin class, or of the class standing in for the
        program's (`exception_class`), made from `args` here, with the program's plain
        attributes and, for a class of the program's, its message; ProgramRaised (and the case
        fails) for one that is not catchable, and for a malformed reply."""
        if type(reply) is not tuple or len(reply) != 5 or not _plain(reply):
            self.raised = True
            return ProgramRaised("the program's process sent a malformed error")
        _, description, message, args, attributes = reply
        kind = self.exception_class(description)
        catchable = (
            kind is not None and issubclass(kind, Exception) and not issubclass(kind, _SIGNALS)
        )
        if not catchable or type(args) is not tuple or type(attributes) is not dict:
            self.raised = True
            name = description if type(description) is str else "an exception of its own"
            return ProgramRaised(f"{name}: {message}")
        try:
            error = kind(*args)
        except Exception:  # arguments its constructor refuses (UnicodeDecodeError's five)
            error = kind.__new__(kind)
            error.args = args
        for name, value in attributes.items():
            if type(name) is str and name.isidentifier() and not name.startswith("__"):
                error.__dict__[name] = value
        if kind.__str__ is _program_str:
            error.__dict__[_MESSAGE] = message  # what the program's own `__str__` said
        return error

    def exception_class(self, description: Any, depth: int = 0) -> type | None:
        """The class a described exception class is here: a builtin one, or for a class of the
        program's, (reference, name, bases), one of that name deriving from its bases as they
        are here, the same for every reply that names the reference; None for a malformed
        description."""
        if type(description) is str:
            return _BUILTIN_EXCEPTIONS.get(description)
        if type(description) is not tuple or len(description) != 3 or depth > 30:
            return None
        if description[0] == "std":
            return _standard_class(description[1], description[2])
        ref, name, bases = description
        if type(ref) is not int or type(name) is not str or not name.isidentifier():
            return None
        if ref not in self.remotes:
            parents = [self.exception_class(b, depth + 1) for b in bases]
            if not parents or None in parents:
                return None
            try:
                self.remotes[ref] = type(
                    name,
                    tuple(parents),
                    {"__module__": SOLUTION, "__qualname__": name, "__str__": _program_str},
                )
            except TypeError:  # bases that cannot be combined here
                return None
        found = self.remotes[ref]
        return found if isinstance(found, type) else None

    def decode(self, reply: Any, request: tuple = ("names",)) -> Any:
        """The value a reply carries; _Thrown for an exception the program raised."""
        kind = reply[0] if type(reply) is tuple and reply else None
        if kind == "shared" and request[0] == "call" and len(reply) == 4:
            self.given = _containers(self.arguments)
            if reply[3] != len(self.given):  # the two walks disagree: the call's by value only
                self.given = []
                return self.decode(reply[1], request)
            self.memo = {}
            try:
                self.restore(reply[2])
                return self.decode(reply[1], request)
            finally:
                self.memo = None
        based = len(reply) == 3 and type(reply[2]) in _BASES if kind == "ref" else False
        # a container subclass's instance: ("ref", reference, [the container's name])
        named = kind == "ref" and len(reply) == 3 and type(reply[2]) is list and len(reply[2]) == 1
        container = (
            _CONTAINER_NAMES.get(reply[2][0]) if named and type(reply[2][0]) is str else None
        )
        if kind == "ref" and (len(reply) == 2 or based or container) and type(reply[1]) is int:
            if reply[1] not in self.remotes:
                value = reply[2] if based else _NO_VALUE
                self.remotes[reply[1]] = _Remote(self, reply[1], value, container)
            return self.remotes[reply[1]]
        if kind == "exception class" and len(reply) == 2:
            found = self.exception_class(reply[1])
            if found is not None:
                return found
            std = type(reply[1]) is tuple and reply[1] and reply[1][0] == "std"
            if std and request[0] == "names":
                return UNAVAILABLE  # a standard module's class not imported here
            if std:  # a call's result, an item: one object for many classes would equal itself
                self.raised = True
                raise ProgramRaised("the program sent a class this process does not have")
            if type(reply[1]) is tuple and reply[1]:
                return self.decode(("ref", reply[1][0]))
        if kind == "raise" and request[0] in ("call", "getattr", "iter", "setattr", "method"):
            if (
                request[0] == "getattr"
                and (request[2] in _PROBED or request[2] in _NAMED)
                and reply[1:2] == ("AttributeError",)
            ):
                raise _Missing(request[2])  # `dict()` or `hasattr` probing an object
            return _Thrown(self.exception(reply))
        if kind == "items" and request[0] == "next" and len(reply) == 3:
            if type(reply[1]) is list and type(reply[2]) is tuple and _plain(reply[2]):
                return [self.decode(item, ("item",)) for item in reply[1]], reply[2]
        elif kind in ("value", "packed") and len(reply) == 2 and _plain(reply[1]):
            if kind == "value":
                return reply[1]
            try:
                return _unpack(reply[1], self.given_back, 0, self.memo)
            except Exception as exc:  # an unhashable rebuilt into a set, too deep
                self.raised = True
                raise ProgramRaised(f"the program's process sent {exc}") from None
        self.raised = True
        raise ProgramRaised("the program's process sent something other than plain data")


# A standard module's class the program binds that this process has not imported: left out of
# the tests' names (tests that use it import it themselves).
UNAVAILABLE = object()


def _standard_class(module: Any, qualname: Any) -> type | None:
    """The exception class `qualname` of standard module `module` (`json.JSONDecodeError`), as
    this process has it: only a module already imported here (by the tests that expect its
    error, or by the judge), as importing one the program names could run code of its own
    (`unittest.__main__`), and none of unittest's, whose errors steer a test run (`SkipTest`
    skips, a stop is a pass); None for any other."""
    if type(module) is not str or type(qualname) is not str:
        return None
    top = module.partition(".")[0]
    if top not in sys.stdlib_module_names or top == "unittest" or module not in sys.modules:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        return None
    # the class itself, not one reached through another module (`doctest.unittest.SkipTest`)
    same = found.__module__ == module and found.__qualname__ == qualname
    return found if same else None


def _real_module(name: str) -> types.ModuleType | None:
    """The top-level standard-library module `name`, imported here; None for any other name."""
    if name not in sys.stdlib_module_names:
        return None
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _names_loaded(source: str) -> set[str]:
    """The global names `source` reads before it binds them itself: at its top level those it
    loads before any store (`x = 1; assert x == 1` reads its own `x`), in its functions and
    class bodies those its top level does not bind first."""
    module = compile(source, "<tests>", "exec")
    first: dict[str, str] = {}  # the top level's first access of each name
    for instruction in dis.get_instructions(module):
        if instruction.opname in ("LOAD_NAME", "LOAD_GLOBAL"):
            first.setdefault(instruction.argval, "load")
        elif instruction.opname in _BINDING_OPS:
            first.setdefault(instruction.argval, "store")
    nested = {
        name
        for code in module.co_consts
        if isinstance(code, types.CodeType)
        for name in _loads(code)
    }
    loads = {name for name, access in first.items() if access == "load"}
    return loads | {name for name in nested if first.get(name) != "store"}


def _names_read(*sources: str) -> set[str]:
    """The names that the code of `sources` looks up, from its compiled code objects."""
    names, stack = set(), [compile(source, "<tests>", "exec") for source in sources]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _tests_namespace(
    names: Any, link: _Link, read: set[str], tests_read: set[str], entry_point: str | None
) -> dict:
    """The tests' globals before the setup code runs: those of the program's names that the
    tests or the setup code read (`read`; module docstring). A plain value of the program's
    that the tests themselves read (`tests_read`) counts as a use of the program."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if type(names) is not dict:
        raise TypeError("the program's process sent something other than its names")
    for name, reply in names.items():
        if type(name) is not str or type(reply) is not tuple or not reply:
            raise TypeError("the program's process sent something other than its names")
        if name not in read or (name != entry_point and name in _BUILTIN_NAMES) or name == "pytest":
            continue
        if name == entry_point and reply[0] == "module":
            raise ProgramRaised(f"the program's {entry_point!r} is a module")
        if reply[0] == "module" or (name != entry_point and name in sys.stdlib_module_names):
            # by the tests' name, never the program's: importing a module the program names
            # (`unittest.__main__`) could run code of its own here
            module = _real_module(name)
            if module is not None:
                namespace[name] = module
            continue
        decoded = link.decode(reply)
        if decoded is not UNAVAILABLE:
            namespace[name] = decoded
        if name in tests_read and reply[0] in ("value", "packed"):
            link.used = True
    return namespace


def _program_module(
    names: dict, link: _Link, source: str, entry_point: str | None
) -> types.ModuleType:
    """The program as the module `SOLUTION`, for tests that import it: all its names, except
    that a builtin's or a standard module's name is the real one (a star import must not rebind
    the tests' `sorted` or `math`) unless the tests take that name from it by name or it is the
    entry point; a star import takes none that the tests have bound already. A plain value of
    the program's that the tests read from it by name counts as a use of the program."""
    by_name, read = _taken_from_program(source)
    module = types.ModuleType(SOLUTION)
    for name, reply in names.items():
        real = name in _BUILTIN_NAMES or name in sys.stdlib_module_names or reply[0] == "module"
        if real and name not in by_name and name != entry_point:
            found = _real_module(name) if name not in _BUILTIN_NAMES else getattr(builtins, name)
            if found is not None:
                module.__dict__[name] = found
            continue
        decoded = link.decode(reply)
        if decoded is UNAVAILABLE:
            continue
        module.__dict__[name] = decoded
        if name in read and reply[0] in ("value", "packed"):
            link.used = True
    programs = {n: v for n, v in module.__dict__.items() if not n.startswith("_")}

    def star(name: str) -> list[str]:
        """`__all__`, for `from solution import *` when it runs: the program's names but those
        the tests have bound to something else by then (`pytest`, `from math import isclose`)."""
        if name != "__all__":
            raise AttributeError(f"module {SOLUTION!r} has no attribute {name!r}")
        bound = sys.modules["__main__"].__dict__
        return [n for n, v in programs.items() if n != "pytest" and bound.get(n, v) is v]

    module.__dict__["__getattr__"] = star
    return module


def _taken_from_program(source: str) -> tuple[set[str], set[str]]:
    """The names the tests take from the program's module by name (`from solution import x`,
    `solution.x`), and those of them they read (an import alone checks nothing)."""
    taken, read, looked_up = set(), set(), _names_looked_up(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == SOLUTION and not node.level:
            taken.update(a.name for a in node.names if a.name != "*")
            read.update(a.name for a in node.names if (a.asname or a.name) in looked_up)
        elif isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == SOLUTION:
            taken.add(node.attr)
            read.add(node.attr)
    return taken, read


def _names_looked_up(source: str, top_level_only: bool = False) -> set[str]:
    """Every global name that the code of `source` reads: anywhere, or at its top level."""
    module = compile(source, "<tests>", "exec")
    return _loads(module, nested=not top_level_only)


def _loads(code: types.CodeType, nested: bool = True) -> set[str]:
    """The global names `code` reads (LOAD_NAME, LOAD_GLOBAL), and those of the code objects
    nested in it."""
    names, stack = set(), [code]
    while stack:
        code = stack.pop()
        names.update(
            i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_NAME", "LOAD_GLOBAL")
        )
        if nested:
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _pytest_module(text: str) -> types.ModuleType:
    """`_pytest_style.py`'s text as the module ``pytest``."""
    module = types.ModuleType("pytest")
    exec(compile(text, "<pytest>", "exec"), module.__dict__)
    return module


def _unittest_results() -> list:
    """The list that every `unittest.TestResult` made from now on joins, so that a failure
    `unittest.main(exit=False)` only records fails the case."""
    import unittest

    results: list = []
    made = unittest.TestResult.__init__

    def joining(self, *args, **kwargs):
        results.append(self)
        made(self, *args, **kwargs)

    unittest.TestResult.__init__ = joining
    return results


def _judge(link: _Link, verdict: int) -> None:
    """The parent: run the setup code and the tests against the child's objects; write the
    verdict to `verdict` when they all pass, having used the program, and the program never
    raised (a failed assert raises out of here)."""
    job = json.loads(sys.stdin.read())
    entry_point = job.get("entry_point")
    tests_read = _names_loaded(job["tests"])
    read = _names_read(job["tests"], job.get("setup") or "")
    names = _receive(link.replies)
    # the tests are the main module, as when run as a script (`unittest.main()` reads it)
    main = types.ModuleType("__main__")
    namespace = main.__dict__
    namespace.update(_tests_namespace(names, link, read, tests_read, entry_point))
    namespace["__file__"] = "test_solution.py"
    sys.modules["__main__"] = main
    sys.modules[SOLUTION] = _program_module(names, link, job["tests"], entry_point)
    pytest = sys.modules["pytest"] = _pytest_module(job["pytest"])
    pytest.prepare(_names_looked_up(job["tests"], top_level_only=True))
    if entry_point and entry_point not in names:
        raise ProgramRaised(f"the program does not define {entry_point!r}")
    program_entry = namespace.get(entry_point) if entry_point else None
    if job.get("setup"):
        exec(compile(job["setup"], "<setup>", "exec"), namespace)
    if program_entry is not None:
        namespace[entry_point] = program_entry
    unittest_results = _unittest_results() if "unittest" in job["tests"] else []
    try:
        exec(compile(job["tests"], "<tests>", "exec"), namespace)
    except SystemExit as exc:  # the tests ended themselves (`unittest.main()`): passed if 0
        code = exc.code
        passed = code is None or code is False or (type(code) is int and code == 0)
        if type(exc) is not SystemExit or not passed:
            raise
    # what a pytest run of the file would run: its test functions and classes
    pytest.run_tests(namespace, unittest_ran=bool(unittest_results))
    if any(not result.wasSuccessful() for result in unittest_results):
        raise AssertionError("a unittest test failed (`unittest.main(exit=False)` says so only)")
    if link.raised:
        raise ProgramRaised("the program raised, and the tests went on")
    if not link.used:
        raise RuntimeError("the tests never called the program nor read a value of its")
    os.write(verdict, f"{job['secret']} pass\n".encode())


def run(source: str, setup: str = "") -> None:
    """Judge one case of ``source`` after ``setup`` (module docstring); exit 1 when a test
    fails."""
    # Not dumpable before the fork: the child (the program) cannot open this process's
    # /proc/PID/mem or /proc/PID/fd/0, where the secret and the tests are. The fallback's audit
    # hook refuses ctypes; there the sandbox made the process undumpable (docs/sandbox.md).
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass
    # the child may signal its parent: an interrupt would be an exception the tests could catch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    if os.fork() == 0:
        os.close(requests_w)
        os.close(replies_r)
        _serve(source, setup, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    # what the tests print, on either stream, goes nowhere: only the verdict is written to the
    # run's stdout, and only why the tests failed to its stderr, whose size the sandbox bounds
    verdict, notes = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    try:
        _judge(_Link(requests_w, replies_r), verdict)
    except BaseException as exc:
        os.write(notes, f"the tests failed: {type(exc).__name__}: {exc}"[:2000].encode() + b"\n")
        sys.exit(1)
