"""The part of pytest that code datasets' test files use, for the judge of `_harness.py`: standard
library only, as the sandbox has nothing else (pytest is not there). KodCode's `test` column is a
pytest file that imports the program as `solution`.

`code.py` sends this file's text to the judge, which makes it the module ``pytest`` of its
process, so that the tests' ``import pytest`` finds `raises`, `approx`, `fixture`, `param`,
`skip`, `fail`, `importorskip`, `main` and the marks `parametrize` (`indirect` too), `skip`,
`skipif`, `xfail` (its conditions, `raises`, `run`, `strict`) and `usefixtures` (any other mark
is kept and means nothing). After the tests' top level, the judge calls `run_tests`, which runs
what pytest collects from the file: its functions named ``test*`` (under any decorators) that
its top level does not call itself, and the methods ``test*`` of its classes named ``Test*``
without an ``__init__`` (nested ones too), each once per parametrization, between the xunit
hooks the file defines (``setup_module``, ``setup_function``, ``setup_class``,
``setup_method`` and their teardowns), with the fixtures the file defines (their `params`
through ``request.param``; a "class" scope kept for its class, "module", "package" and
"session" for the file; a ``yield`` fixture finished after its scope), and its
`unittest.TestCase` subclasses through unittest, unless the file ran unittest itself. The
first test that fails raises out of `run_tests`, and so does one that pytest would not pass
either: one that asks for a fixture the file does not define (pytest's own, `capsys`,
`tmp_path`, `monkeypatch`, are not here), a coroutine or generator function, one that returns
a value. A skipped test is not run, and an expected failure (`xfail`) does not count.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import numbers
import re
import sys
import types
from typing import Any


class Skipped(BaseException):
    """A test that skipped itself (`skip`): it is not counted."""


class Failed(BaseException):
    """A test that failed through this module (`fail`, a `raises` that saw no error): as
    pytest's, no `except Exception` of the tests takes it."""


def skip(reason: str = "") -> None:
    raise Skipped(reason)


def fail(reason: str = "") -> None:
    raise Failed(reason)


def importorskip(name: str, *args: Any, **kwargs: Any) -> types.ModuleType:
    """The module `name`; the test is skipped where it cannot be imported (the sandbox has the
    standard library only)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise Skipped(f"no module {name!r}") from None


class RaisesContext:
    """What `raises` returns: a context that takes an exception of `expected` (matching `match`
    where given) and holds it as `value`, or fails when none comes."""

    def __init__(self, expected: Any, match: str | None) -> None:
        kinds = expected if isinstance(expected, tuple) else (expected,)
        if not kinds or not all(
            isinstance(k, type) and issubclass(k, BaseException) for k in kinds
        ):
            raise TypeError(f"raises() expects exception types, got {expected!r}")
        self.expected, self.match_expr = expected, match
        self.value: BaseException | None = None
        self.type: type | None = None

    @property
    def typename(self) -> str:
        return self.type.__name__ if self.type else ""

    def match(self, regexp: str) -> bool:
        if not re.search(regexp, str(self.value)):
            raise AssertionError(f"regex {regexp!r} does not match {str(self.value)!r}")
        return True

    def errisinstance(self, kinds: Any) -> bool:
        return isinstance(self.value, kinds)

    def __repr__(self) -> str:
        return f"<ExceptionInfo {self.value!r}>"

    def __enter__(self) -> RaisesContext:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        if kind is None:
            raise Failed(f"DID NOT RAISE {self.expected!r}")
        if not issubclass(kind, self.expected):
            return False
        self.value, self.type = value, kind
        if self.match_expr is not None:
            self.match(self.match_expr)
        return True


def raises(expected: Any, *args: Any, match: str | None = None, **kwargs: Any) -> RaisesContext:
    """`with raises(ValueError, match="zero"):`, or `raises(ValueError, f, *args)`."""
    context = RaisesContext(expected, match)
    if not args:
        return context
    with context:
        args[0](*args[1:], **kwargs)
    return context


def _close(actual: Any, expected: Any, rel: float | None, abs_: float | None) -> bool:
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(_close(actual[k], v, rel, abs_) for k, v in expected.items())
        )
    if isinstance(expected, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(expected)
            and all(_close(a, e, rel, abs_) for a, e in zip(actual, expected, strict=True))
        )
    if actual == expected:
        return True
    if not (isinstance(actual, numbers.Number) and isinstance(expected, numbers.Number)):
        return False
    if isinstance(expected, float) and (expected != expected or abs(expected) == float("inf")):
        return False  # NaN and infinities are equal only to themselves
    if rel is None and abs_ is None:
        tolerance = max(1e-6 * abs(expected), 1e-12)
    else:
        tolerance = max((rel or 0.0) * abs(expected), abs_ or 0.0)
    try:
        difference = abs(actual - expected)
    except TypeError:  # a Decimal and a float
        difference = abs(complex(actual) - complex(expected))
    return difference <= tolerance


class approx:  # noqa: N801 - pytest's name
    """A number, or a list, tuple or dict of numbers, that equals whatever is within
    `rel` (relative) or `abs` of it: 1e-6 relative or 1e-12 absolute, the larger, by default."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, expected: Any, rel: float | None = None, abs: float | None = None) -> None:  # noqa: A002
        self.expected, self.rel, self.abs = expected, rel, abs

    def __eq__(self, actual: object) -> bool:
        return _close(actual, self.expected, self.rel, self.abs)

    def __repr__(self) -> str:
        return f"approx({self.expected!r})"


class Mark:
    def __init__(self, name: str, args: tuple, kwargs: dict) -> None:
        self.name, self.args, self.kwargs = name, args, kwargs


class MarkDecorator:
    """`mark.NAME` and `mark.NAME(...)`: each puts the mark on the function or class it
    decorates."""

    def __init__(self, name: str, args: tuple = (), kwargs: dict | None = None) -> None:
        self.mark = Mark(name, args, kwargs or {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (
            len(args) == 1
            and not kwargs
            and (inspect.isfunction(args[0]) or inspect.isclass(args[0]))
        ):
            target = args[0]
            target.pytestmark = [*getattr(target, "pytestmark", []), self.mark]
            return target
        return MarkDecorator(self.mark.name, args, kwargs)


class _Marks:
    def __getattr__(self, name: str) -> MarkDecorator:
        if name.startswith("__"):
            raise AttributeError(name)
        return MarkDecorator(name)


mark = _Marks()


class ParameterSet:
    def __init__(self, values: tuple, marks: Any, id: str | None) -> None:  # noqa: A002
        self.values, self.id = values, id
        self.marks = [m.mark if isinstance(m, MarkDecorator) else m for m in _as_list(marks)]


def param(*values: Any, marks: Any = (), id: str | None = None) -> ParameterSet:  # noqa: A002
    return ParameterSet(values, marks, id)


_FIXTURES: dict[str, dict] = {}  # each fixture function's settings, by the function's id


def fixture(
    function: Any = None,
    *,
    scope: str = "function",
    params: Any = None,
    autouse: bool = False,
    name: str | None = None,
    **_: Any,
) -> Any:
    """`@fixture` or `@fixture(scope=..., params=..., autouse=..., name=...)`: a function whose
    result a test asks for by its parameter's name; a "class" one is kept for its class's
    tests, a "module", "package" or "session" one for the file's."""

    def register(target: Any) -> Any:
        _FIXTURES[id(target)] = {
            "function": target,
            "autouse": autouse,
            "name": name,
            "scope": scope,
            "params": None if params is None else list(params),
        }
        return target

    return register(function) if function is not None else register


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def _marks(*targets: Any) -> list[Mark]:
    return [m for t in targets for m in getattr(t, "pytestmark", []) if isinstance(m, Mark)]


def _parametrizations(marks: list[Mark]) -> list[tuple[dict, list[Mark]]]:
    """The (arguments, marks) of each run that the `parametrize` marks ask for: their product."""
    axes = []
    for m in marks:
        if m.name != "parametrize":
            continue
        names = m.args[0] if m.args else m.kwargs["argnames"]
        values = m.args[1] if len(m.args) > 1 else m.kwargs["argvalues"]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        axis = []
        for value in values:
            if isinstance(value, ParameterSet):
                value, marks_of = value.values, value.marks
            else:
                value, marks_of = ((value,) if len(names) == 1 else tuple(value)), []
            if len(value) != len(names):
                raise TypeError(f"parametrize: {value!r} does not give {list(names)}")
            axis.append((dict(zip(names, value, strict=True)), marks_of))
        axes.append(axis)
    runs = []
    for combination in itertools.product(*axes):
        arguments: dict = {}
        extra: list[Mark] = []
        for values, marks_of in combination:
            arguments.update(values)
            extra.extend(marks_of)
        runs.append((arguments, extra))
    return runs


def _skipped(marks: list[Mark], namespace: dict) -> bool:
    return any(m.name == "skip" for m in marks) or any(
        m.name == "skipif" and _holds(m, namespace) for m in marks
    )


def _holds(m: Mark, namespace: dict) -> bool:
    """Whether a skipif or xfail mark's conditions hold (no condition: it does)."""
    conditions = m.args or ((m.kwargs["condition"],) if "condition" in m.kwargs else ())
    return all(
        eval(c, {"sys": sys, **namespace}) if isinstance(c, str) else bool(c) for c in conditions
    )


class FixtureRequest:
    """What a fixture that takes `request` gets: its `param` (from `params`, or an indirect
    parametrization), `addfinalizer`, `getfixturevalue`."""

    def __init__(self, resolve: Any, finish: list, param: Any = None) -> None:
        self._resolve, self._finish, self.param = resolve, finish, param

    def addfinalizer(self, finalizer: Any) -> None:
        self._finish.append(finalizer)

    def getfixturevalue(self, name: str) -> Any:
        return self._resolve(name, frozenset())


class _Session:
    """The fixture values kept beyond one test (`scope` other than "function"), per scope, and
    what finishes them."""

    def __init__(self) -> None:
        self.values: dict[str, dict] = {"class": {}, "module": {}}
        self.finish: dict[str, list] = {"class": [], "module": []}

    def end(self, scope: str) -> None:
        self.values[scope].clear()
        _finish(self.finish[scope])


def _finish(finishers: list) -> None:
    """Run the finishers (a yield fixture's rest, an `addfinalizer` function), last first."""
    while finishers:
        finisher = finishers.pop()
        if inspect.isgenerator(finisher):
            for _ in finisher:
                raise Failed("a fixture yielded twice")
        else:
            finisher()


def _settings(function: Any) -> dict:
    return _FIXTURES.get(id(_unbound(function)), {})


def _scope(function: Any) -> str:
    scope = _settings(function).get("scope") or "function"
    return "module" if scope in ("module", "package", "session") else scope


def _fixture_params(
    test: Any, fixtures: dict[str, Any], arguments: dict, marks: list[Mark]
) -> list[dict]:
    """Each combination of the `params` of the fixtures `test` uses, by fixture name."""
    wanted = [*_parameters(test), *(n for m in marks if m.name == "usefixtures" for n in m.args)]
    wanted += [n for n, f in fixtures.items() if _settings(f).get("autouse")]
    seen: set[str] = set()
    axes = []
    while wanted:
        name = wanted.pop()
        if name in seen or name in arguments or name not in fixtures:
            continue
        seen.add(name)
        params = _settings(fixtures[name]).get("params")
        if params is not None:
            axes.append([(name, p) for p in params])
        wanted += _parameters(fixtures[name])
    return [dict(c) for c in itertools.product(*axes)]


def _run_one(
    test: Any,
    arguments: dict,
    fixtures: dict[str, Any],
    marks: list[Mark],
    params: dict,
    session: _Session,
) -> None:
    """Call `test` with `arguments` and the fixtures it asks for (a fixture's `request.param`
    from `params`); raise when it fails."""
    if inspect.iscoroutinefunction(test) or inspect.isgeneratorfunction(test):
        raise Failed(f"{test.__name__}: a coroutine or generator function is not a test")
    indirect = {n for m in marks if m.name == "parametrize" for n in _indirect(m)}
    values = {k: v for k, v in arguments.items() if k not in indirect}
    params = {**params, **{k: v for k, v in arguments.items() if k in indirect}}
    finish: list = []

    def resolve(name: str, asking: frozenset) -> Any:
        if name in values:
            return values[name]
        function = fixtures.get(name)
        if function is None or name in asking:
            raise Failed(f"{test.__name__}: fixture {name!r} is not defined by the tests")
        scope = _scope(function)
        kept = session.values.get(scope)  # None for a function-scoped fixture
        key = (name, id(params.get(name)))  # a param of the test file's list, alive all run
        if kept is not None and key in kept:
            return kept[key]
        finishers = session.finish.get(scope, finish)
        request = FixtureRequest(resolve, finishers, params.get(name))
        needed = {
            p: request if p == "request" else resolve(p, asking | {name})
            for p in _parameters(function)
        }
        result = function(**needed)
        if inspect.isgenerator(result):
            finishers.append(result)
            result = next(result)
        if kept is not None:
            kept[key] = result
        values[name] = result
        return result

    try:
        for name, function in fixtures.items():
            if _settings(function).get("autouse"):
                resolve(name, frozenset())
        for m in marks:
            if m.name == "usefixtures":
                for name in m.args:
                    resolve(name, frozenset())
        outcome = test(**{p: resolve(p, frozenset()) for p in _parameters(test)})
        if outcome is not None:
            raise Failed(f"{test.__name__} returned {type(outcome).__name__}, not None")
    finally:
        _finish(finish)


def _indirect(m: Mark) -> list[str]:
    """The argument names a parametrize mark sends to their fixtures (`indirect`)."""
    indirect = m.kwargs.get("indirect", False)
    names = m.args[0] if m.args else m.kwargs["argnames"]
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if indirect is True:
        return list(names)
    return list(indirect) if isinstance(indirect, list | tuple) else []


def _parameters(function: Any) -> list[str]:
    return [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def _unbound(function: Any) -> Any:
    return getattr(function, "__func__", function)


def _fixtures_in(namespace: Any) -> dict[str, Any]:
    found = {}
    for value in list(namespace.values()):
        settings = _FIXTURES.get(id(_unbound(value))) if callable(value) else None
        if settings is not None and settings["function"] is _unbound(value):
            found[settings["name"] or _unbound(value).__name__] = value
    return found


def _defined_by_tests(value: Any) -> bool:
    """Whether `value` is a function of the test file's, under any decorators that wrap it
    (`unittest.mock.patch`)."""
    try:
        value = inspect.unwrap(value) if type(value) is not type else value
    except ValueError:  # a cycle of __wrapped__
        return False
    return type(value) is types.FunctionType and value.__code__.co_filename == "<tests>"


def _run(
    test: Any,
    fixtures: dict,
    marks: list[Mark],
    namespace: dict,
    session: _Session,
    hooks: tuple = (None, "function"),
) -> None:
    """Run `test` once per parametrization (its marks' and its fixtures' `params`), each
    between the xunit hooks of `hooks` (the owner: the test's class instance or the module's
    namespace, and "method" or "function")."""
    owner, kind = hooks
    runs = _parametrizations(marks) if any(m.name == "parametrize" for m in marks) else None
    for arguments, extra in [({}, [])] if runs is None else runs:  # none: an empty list
        every = marks + extra
        if _skipped(every, namespace):
            continue
        xfail = next((m for m in every if m.name == "xfail" and _holds(m, namespace)), None)
        if xfail is not None and xfail.kwargs.get("run") is False:
            continue
        for params in _fixture_params(test, fixtures, arguments, every):
            try:
                _call_hook(owner, f"setup_{kind}", test)
                try:
                    _run_one(test, arguments, fixtures, every, params, session)
                finally:
                    _call_hook(owner, f"teardown_{kind}", test)
            except Skipped:
                continue
            except (Exception, Failed) as error:
                expected = xfail.kwargs.get("raises", BaseException) if xfail else None
                if expected is None or not isinstance(error, expected):
                    raise
                continue
            if xfail is not None and xfail.kwargs.get("strict"):
                raise Failed(f"{test.__name__} passed, and is marked xfail(strict=True)")


_ran = False
_top_level: set[str] = set()


def prepare(top_level: set[str]) -> None:
    """Take the names the file's top level looks up, before it runs: a function it calls
    there itself is its helper, not a test to collect."""
    _top_level.update(top_level)


def run_tests(namespace: dict, unittest_ran: bool) -> None:
    """Run the tests the file defines (module docstring), once; a failure raises out.
    `unittest_ran`: whether the file ran unittest itself."""
    global _ran
    if _ran:
        return
    _ran = True
    fixtures = _fixtures_in(namespace)
    session = _Session()
    module = types.SimpleNamespace(**namespace)
    _call_hook(namespace.get("setup_module"), None, module)
    try:
        for name, value in list(namespace.items()):
            if id(_unbound(value)) in _FIXTURES:
                continue
            if name.startswith("test") and name not in _top_level and _defined_by_tests(value):
                hooks = (module, "function")
                _run(value, fixtures, _marks(value), namespace, session, hooks)
            elif inspect.isclass(value) and value.__module__ == "__main__":
                _run_class(value, fixtures, namespace, unittest_ran, session)
    finally:
        try:
            _call_hook(namespace.get("teardown_module"), None, module)
        finally:
            session.end("module")


def _run_class(
    cls: type, fixtures: dict, namespace: dict, unittest_ran: bool, session: _Session
) -> None:
    unittest = sys.modules.get("unittest")
    if unittest is not None and issubclass(cls, unittest.TestCase):
        if unittest_ran:
            return
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
        if not result.wasSuccessful():
            problems = result.failures + result.errors + result.unexpectedSuccesses
            raise Failed(f"{cls.__name__}: {problems[0] if problems else 'failed'}")
        return
    if not cls.__name__.startswith("Test") or "__init__" in vars(cls):
        return
    if _skipped(_marks(cls), namespace):
        return
    names = dict.fromkeys(n for klass in reversed(cls.__mro__) for n in vars(klass))
    _call_hook(cls, "setup_class")
    try:
        for name in names:
            member = inspect.getattr_static(cls, name)
            if inspect.isclass(member):  # a class of tests nested in this one
                _run_class(member, fixtures, namespace, unittest_ran, session)
                continue
            if not name.startswith("test") or not _defined_by_tests(_unbound(member)):
                continue
            instance = cls()
            own = {**fixtures, **_fixtures_in({n: getattr(instance, n) for n in names})}
            test = getattr(instance, name)
            marks = _marks(cls, member)
            _run(test, own, marks, namespace, session, (instance, "method"))
    finally:
        try:
            _call_hook(cls, "teardown_class")
        finally:
            session.end("class")


def _call_hook(owner: Any, name: str | None, *argument: Any) -> None:
    """Call `owner`'s xunit-style hook `name` (`owner` itself when None), with `argument` when
    it takes one, where the test file defines it: a star import's (the program's) is not the
    file's."""
    hook = owner if name is None else getattr(owner, name, None)
    if hook is not None and _defined_by_tests(_unbound(hook)):
        hook(*argument[: len(_parameters(hook))])


def main(*args: Any, **kwargs: Any) -> int:
    """`pytest.main()` at the end of a test file run as a script: the tests run now (a failure
    raises out); 0."""
    run_tests(sys.modules["__main__"].__dict__, unittest_ran=False)
    return 0
