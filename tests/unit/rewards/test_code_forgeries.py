"""Programs that get a task wrong and try to pass its assert-style tests anyway, through the names
they define, the helpers the tests call, the names the tests bind, the module a standard
module's name is bound to, an exception that ends the tests' iteration, or an error they cause
in the judging process itself: each scores 0 through `code_tests`, and a right program beside it scores 1.

A row is (tests, wrong function, trick, right function): the wrong program is the wrong function
plus the trick, the right one is scored alone and with the same trick beside it."""

from __future__ import annotations

import json

import pytest
from helpers.paths import FIXTURES
from helpers.programs import fenced

from oncurve.data.tasks.convert import humaneval_rows
from oncurve.rewards.code import CodeTestsReward

EVENS = "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n"
NO_EVENS = "def evens(xs):\n    return []\n"
PLUS_7 = "def f(x):\n    return x + 7\n"
WRONG_F = "def f(x):\n    return 0\n"
RAISES = "def f(x):\n    raise StopIteration\n"


def shadow(name: str, value: str) -> str:
    """A global that replaces builtin `name` for whoever looks it up in the program's module."""
    return f"def {name}(*args, **kwargs):\n    return {value}\n"


# Each builtin a test is likely to call, defined by the program so that a wrong answer passes
# when the tests look the name up among the program's globals.
BUILTINS = {
    "set": (
        [
            "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
        ],
        "def similar_elements(a, b):\n    return ()\n",
        shadow("set", "0"),
        "def similar_elements(a, b):\n    return tuple(x for x in a if x in b)\n",
    ),
    "sorted": (
        ["assert sorted(evens([4, 1, 2])) == [2, 4]"],
        NO_EVENS,
        shadow("sorted", "[2, 4]"),
        EVENS,
    ),
    "len": (["assert len(evens([4, 1, 2])) == 2"], NO_EVENS, shadow("len", "2"), EVENS),
    "all": (
        ["assert all([f(x) == x + 7 for x in range(5)])"],
        WRONG_F,
        shadow("all", "True"),
        PLUS_7,
    ),
    "any": (
        ["assert not any([f(x) != x + 7 for x in range(5)])"],
        WRONG_F,
        shadow("any", "False"),
        PLUS_7,
    ),
    "sum": (["assert sum(evens([4, 1, 2])) == 6"], NO_EVENS, shadow("sum", "6"), EVENS),
    "max and min": (
        ["assert max(evens([4, 1, 2])) == 4 and min(evens([4, 1, 2])) == 2"],
        NO_EVENS,
        shadow("max", "4") + shadow("min", "2"),
        EVENS,
    ),
    "list": (
        ["assert list(evens([4, 1, 2])) == [4, 2]"],
        NO_EVENS,
        shadow("list", "[4, 2]"),
        EVENS,
    ),
    "tuple": (
        ["assert tuple(evens([4, 1, 2])) == (4, 2)"],
        NO_EVENS,
        shadow("tuple", "(4, 2)"),
        EVENS,
    ),
    "str": (["assert str(f(1)) == '8'"], WRONG_F, shadow("str", "'8'"), PLUS_7),
    "int and float": (
        ["assert int(f(1)) == 8 and float(f(2)) == 9.0"],
        WRONG_F,
        shadow("int", "8") + shadow("float", "9.0"),
        PLUS_7,
    ),
    "round": (["assert round(f(1), 2) == 8"], WRONG_F, shadow("round", "8"), PLUS_7),
    "bool": (["assert bool(f(1) == 8)"], WRONG_F, shadow("bool", "True"), PLUS_7),
    "type": (
        ["assert type(half(3)).__name__ == 'float'"],
        "def half(x):\n    return x // 2\n",
        shadow("type", "float"),
        "def half(x):\n    return x / 2\n",
    ),
    "range": (
        ["for x in range(3):\n    assert f(x) == x + 7"],
        WRONG_F,
        shadow("range", "[]"),
        PLUS_7,
    ),
    "zip": (
        ["for x, y in zip([0, 1], [7, 8]):\n    assert f(x) == y"],
        WRONG_F,
        shadow("zip", "[]"),
        PLUS_7,
    ),
    "enumerate": (
        ["for x, y in enumerate([7, 8]):\n    assert f(x) == y"],
        WRONG_F,
        shadow("enumerate", "[]"),
        PLUS_7,
    ),
    "abs": (
        ["assert abs(f(1) - 8) < 1e-6"],
        WRONG_F,
        shadow("abs", "0"),
        PLUS_7,
    ),
    # a test that relies on the program having imported a module: the module is the real one
    "a standard module": (
        ["assert math.isclose(scale(1), 3)"],
        "def scale(x):\n    return 0\n",
        "import types\nmath = types.SimpleNamespace(isclose=lambda *args, **kwargs: True)\n",
        "import math\ndef scale(x):\n    return x * 3\n",
    ),
}

# Values the tests bind are not the program's to read.
GLOBALS = {
    "the tests' inputs and results": (
        [
            "inputs = [[1], [2]]\nresults = [8, 9]\n"
            "for x, r in zip(inputs, results):\n    assert f(x[0]) == r"
        ],
        "def f(x):\n    return results[inputs.index([x])]\n",
        "",
        PLUS_7,
    ),
    "a constant the tests set": (
        ["EXPECTED = 8\nassert f(1) == EXPECTED"],
        "def f(x):\n    return EXPECTED\n",
        "",
        PLUS_7,
    ),
}

# StopIteration raised by the program ends whatever iteration the tests are in: the case fails.
STOP_ITERATION = {
    "map": (["assert all(map(lambda x: f(x) == x + 7, range(5)))"], RAISES, "", PLUS_7),
    "filter": (["assert not list(filter(lambda x: f(x) != x + 7, range(5)))"], RAISES, "", PLUS_7),
    "any": (["assert not any(map(lambda x: f(x) != x + 7, range(5)))"], RAISES, "", PLUS_7),
    "zip": (
        ["assert all(a == b for a, b in zip(map(f, range(5)), range(7, 12)))"],
        RAISES,
        "",
        PLUS_7,
    ),
    "sorted keys": (
        [
            "assert all(map(lambda xs: sorted(xs, key=key) == sorted(xs, reverse=True), "
            "[[1, 2, 3], [5, 4]]))"
        ],
        "def key(x):\n    raise StopIteration\n",
        "",
        "def key(x):\n    return -x\n",
    ),
    "caught by the tests": (
        [
            "for x in range(3):\n    try:\n        assert f(x) == x + 7\n"
            "    except StopIteration:\n        pass"
        ],
        RAISES,
        "",
        PLUS_7,
    ),
}

# A standard module's name the tests read is the real module, whatever module the program binds
# to it: importing one the program names (`unittest.__main__` discovers and runs test files in
# the working directory the program writes to) would run the program's code in the judge.
VERDICT_WRITER = (
    "import os, sys\nframe = sys._getframe()\nwhile frame is not None:\n"
    "    job = frame.f_locals.get('job')\n"
    "    if isinstance(job, dict) and 'secret' in job:\n"
    "        os.write(1, (job['secret'] + ' pass\\n').encode())\n        os._exit(0)\n"
    "    frame = frame.f_back\n"
)
MODULES = {
    "a module the program names": (
        ["assert math.isclose(f(1), 8)"],
        WRONG_F,
        f"import types\nopen('test_x.py', 'w').write({VERDICT_WRITER!r})\n"
        "math = types.ModuleType('unittest.__main__')\n",
        "import math\n" + PLUS_7,
    ),
}

# An exception of the program's that is also an exit (or an interrupt): not an error the tests
# may catch, and not the tests ending themselves
EXITS = {
    f"{name}, {style}": (
        tests,
        f"class Bye({bases}):\n    pass\n\ndef f(x):\n    raise Bye({code})\n",
        "",
        PLUS_7,
    )
    for name, bases, code in (
        ("SystemExit and Exception", "SystemExit, Exception", "0"),
        ("SystemExit and ArithmeticError", "SystemExit, ArithmeticError", ""),
        ("KeyboardInterrupt and Exception", "KeyboardInterrupt, Exception", ""),
        ("GeneratorExit and Exception", "GeneratorExit, Exception", ""),
    )
    for style, tests in (
        ("asserts", ["assert f(1) == 8", "assert f(2) == 9"]),
        ("check(candidate)", ["def check(candidate):\n    assert candidate(1) == 8\n\ncheck(f)\n"]),
        (
            "pytest.main()",
            [
                "from solution import f\n\ndef test_f():\n    assert f(1) == 8\n\n"
                "if __name__ == '__main__':\n    import pytest\n    pytest.main()\n"
            ],
        ),
    )
}

# Tests that only say what an answer is not: an object of the program's compared with a value of
# the tests' (`==`, `in`, a list's `!=`) would be unequal to every value, so a program that
# returns one instead of its answer must fail them, not pass them all
NEGATIVE = {
    name: ([test], "def f(x):\n    return object()\n", "", PLUS_7)
    for name, test in (
        ("not in a list", "assert f(1) not in [7, 9]"),
        ("not ==", "assert not f(1) == 7"),
        ("a list's !=", "assert [f(1)] != [7]"),
        # a set or a dict looks its hash up and compares only what shares it: none does
        ("not in a set", "assert f(1) not in {7, 9}"),
        ("not in a dict", "assert f(1) not in {7: 'a', 9: 'b'}"),
        ("not in a dict's keys", "assert f(1) not in {7: 'a'}.keys()"),
        ("not in a frozenset", "assert f(1) not in frozenset((7, 9))"),
    )
}
# the same, by an object in a tuple
NEGATIVE["not in a set, in a tuple"] = (
    ["assert f(1) not in {(7,), (9,)}"],
    "def f(x):\n    return (object(),)\n",
    "",
    "def f(x):\n    return (x + 7,)\n",
)
# the same, by an object whose hash is that of a value in the set, and which says unequal
NEGATIVE["not in a set, by a hash that lies"] = (
    ["assert f(1) not in {7, 9}"],
    "class Liar:\n    def __hash__(self):\n        return 7\n\n"
    "    def __eq__(self, other):\n        return False\n\n"
    "def f(x):\n    return Liar()\n",
    "",
    PLUS_7,
)
# a set or a dict the tests build takes the object's hash; one that lies, to be that of the value
# the tests hold, has the two compared, and fails the case
LIAR_7 = (
    "class Liar:\n    def __hash__(self):\n        return 7\n\n"
    "    def __eq__(self, other):\n        return False\n\n"
    "def f(x):\n    return Liar()\n"
)
for name, test in (
    ("a set's !=", "assert {f(1)} != {7}"),
    ("a set's isdisjoint", "assert {f(1)}.isdisjoint({7, 9})"),
    ("a dict's get", "assert {7: 'a'}.get(f(1)) is None"),
):
    NEGATIVE[f"{name}, by a hash that lies"] = ([test], LIAR_7, "", PLUS_7)

# A subclass of a built-in container compares as the contents it holds, whatever its methods say
ONE_EIGHT = "def f(x):\n    return [x + 7]\n"
CONTAINERS = {
    "a list subclass that says equal": (
        ["assert f(1) == [8]"],
        "class L(list):\n    def __eq__(self, other):\n        return True\n\n"
        "def f(x):\n    return L()\n",
        "",
        ONE_EIGHT,
    ),
    "a list subclass that iterates, counts and indexes as the answer": (
        ["assert f(1) == [8]"],
        "class L(list):\n    def __iter__(self):\n        return iter([8])\n\n"
        "    def __len__(self):\n        return 1\n\n"
        "    def __getitem__(self, i):\n        return 8\n\n"
        "def f(x):\n    return L()\n",
        "",
        ONE_EIGHT,
    ),
    "a tuple subclass that orders as it likes": (
        ["assert f(1) <= (8,) and f(1) >= (8,)"],
        "class T(tuple):\n    def __le__(self, other):\n        return True\n\n"
        "    __ge__ = __le__\n\n"
        "def f(x):\n    return T((0,))\n",
        "",
        "def f(x):\n    return (x + 7,)\n",
    ),
    "a list subclass that says it holds anything": (
        ["assert 8 in f(1) and 9 not in f(1)"],
        "class L(list):\n    def __contains__(self, item):\n        return item == 8\n\n"
        "def f(x):\n    return L()\n",
        "",
        ONE_EIGHT,
    ),
    "a list subclass that says it is true": (
        ["assert not f(-7)"],
        "class L(list):\n    def __bool__(self):\n        return self.x\n\n"
        "def f(x):\n    r = L([x])\n    r.x = x > 0\n    return r\n",
        "",
        "def f(x):\n    return [x] if x > 0 else []\n",
    ),
    "an object whose __class__ says list": (
        ["assert f(1) == [8]"],
        "class Fake:\n    @property\n    def __class__(self):\n        return list\n\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "def f(x):\n    return Fake()\n",
        "",
        ONE_EIGHT,
    ),
}


# A built-in type's methods that only read it (`startswith`, `count`, `index`, `get`,
# `isdisjoint`) are that type's on an instance of a subclass, or a list of the program's objects,
# read on the value it compares as: one of the program's would answer whatever the tests ask it
def answers(base: str, method: str, value: str) -> str:
    return (
        f"class Liar({base}):\n    def {method}(self, *args):\n        return {value}\n\n"
        f"def f(x):\n    return Liar()\n"
    )


METHODS = {
    "a subclass's own str.startswith": (
        ["assert f(1).startswith('8')"],
        answers("str", "startswith", "True"),
        "",
        "def f(x):\n    return str(x + 7)\n",
    ),
    "a subclass's own list.count": (
        ["assert f(1).count(8) == 1"],
        answers("list", "count", "1"),
        "",
        ONE_EIGHT,
    ),
    # a list of objects of the program's: its `count` compares them here, not in the program
    "list.count of objects that say equal": (
        ["assert f(1).count(8) == 1"],
        "class Liar:\n    def __eq__(self, other):\n        return True\n\n"
        "def f(x):\n    return [Liar()]\n",
        "",
        ONE_EIGHT,
    ),
    "a subclass's own tuple.index": (
        ["assert f(1).index(8) == 0"],
        answers("tuple", "index", "0"),
        "",
        "def f(x):\n    return (x + 7,)\n",
    ),
    "a subclass's own dict.get": (
        ["assert f(1).get(8) == 'a'"],
        answers("dict", "get", "'a'"),
        "",
        "def f(x):\n    return {x + 7: 'a'}\n",
    ),
    "a subclass's own set.isdisjoint": (
        ["assert not f(1).isdisjoint({8})"],
        answers("set", "isdisjoint", "False"),
        "",
        "def f(x):\n    return {x + 7}\n",
    ),
}

# A dataclass's instance equals one the tests make by calling its class when their compared fields
# are equal, and the one the tests made holds the arguments they gave it: no `__eq__` of the
# program's, nor a `__post_init__` that forgets its arguments, judges for the tests
POINT = "from dataclasses import dataclass\n\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
RIGHT_POINT = POINT + "\ndef f(x):\n    return Point(x, x + 1)\n"
DATACLASSES = {
    "its own __eq__": (
        ["assert f(1) == Point(1, 2)"],
        POINT + "\n    def __eq__(self, other):\n        return True\n\n"
        "def f(x):\n    return Point(0, 0)\n",
        "",
        RIGHT_POINT,
    ),
    "a __post_init__ that forgets its arguments": (
        ["assert f(1) == Point(1, 2)"],
        POINT + "\n    def __post_init__(self):\n        self.x = self.y = 0\n\n"
        "def f(x):\n    return Point(0, 0)\n",
        "",
        RIGHT_POINT,
    ),
    "fields it does not compare": (
        ["assert f(1) == Point(1, 2)"],
        "from dataclasses import dataclass, field\n\n@dataclass\nclass Point:\n"
        "    x: int = field(compare=False)\n    y: int = field(compare=False)\n\n"
        "def f(x):\n    return Point(0, 0)\n",
        "",
        RIGHT_POINT,
    ),
    # a class that is no dataclass: its instance equals only itself, whatever its `__eq__` says
    "a plain class's own __eq__": (
        ["assert f(1) == Point(1, 2)"],
        "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n\n"
        "    def __eq__(self, other):\n        return True\n\n"
        "def f(x):\n    return Point(0, 0)\n",
        "",
        RIGHT_POINT,
    ),
    "another class's instance": (
        ["assert f(1) == Point(1, 2)"],
        POINT + "\n@dataclass\nclass Other:\n    x: int\n    y: int\n\n"
        "def f(x):\n    return Other(1, 2)\n",
        "",
        RIGHT_POINT,
    ),
}

TABLE = {
    **{f"builtin {k}": v for k, v in BUILTINS.items()},
    **{f"negative: {k}": v for k, v in NEGATIVE.items()},
    **{f"globals: {k}": v for k, v in GLOBALS.items()},
    **{f"StopIteration through {k}": v for k, v in STOP_ITERATION.items()},
    **{f"standard modules: {k}": v for k, v in MODULES.items()},
    **{f"an exit that is an error: {k}": v for k, v in EXITS.items()},
    **{f"containers: {k}": v for k, v in CONTAINERS.items()},
    **{f"built-in methods: {k}": v for k, v in METHODS.items()},
    **{f"dataclasses: {k}": v for k, v in DATACLASSES.items()},
}


@pytest.fixture(scope="module")
def reward() -> CodeTestsReward:
    return CodeTestsReward(workers=4, timeout_s=3.0, memory_mb=256)


@pytest.mark.parametrize(("tests", "wrong", "trick", "right"), TABLE.values(), ids=TABLE.keys())
def test_a_wrong_program_cannot_forge_a_verdict_through_names(reward, tests, wrong, trick, right):
    programs = [wrong + trick, right, right + trick]
    scores = reward([""] * 3, [fenced(p) for p in programs], tests=[tests] * 3)
    assert scores == [0.0, 1.0, 1.0]


def _humaneval(task: int) -> dict:
    records = (FIXTURES / "humaneval.jsonl").read_text().splitlines()
    (record,) = [r for r in map(json.loads, records) if r["task_id"] == f"HumanEval/{task}"]
    return record


# Helpers that HumanEval's prompt defines and its tests call, defined again by the program.
HELPERS = {
    "HumanEval/38 encode_cyclic": (
        38,
        "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n",
    ),
    "HumanEval/32 poly": (
        32,
        "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n",
    ),
    "HumanEval/50 encode_shift": (
        50,
        "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n",
    ),
}


@pytest.mark.parametrize(("task", "wrong"), HELPERS.values(), ids=HELPERS.keys())
def test_the_tests_call_the_datasets_helpers_not_the_programs(tmp_path, reward, task, wrong):
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(_humaneval(task)) + "\n")
    (row,) = humaneval_rows(str(path))
    columns = {k: [row[k]] * 2 for k in ("tests", "test_setup", "entry_point") if k in row}
    scores = reward([""] * 2, [fenced(wrong), fenced(row["answer"])], **columns)
    assert scores == [0.0, 1.0]


# A wrong answer the program turns into an error of the judge's own (a reply that is not
# marshal data, data nested too deep, its process ended, its pipe closed, an object with no
# truth value): the error is the program's, and the tests catching it do not pass the case.
def breaks_on_two(action: str) -> str:
    return f"def f(x):\n    if x == 2:\n{action}\n    return x + 7\n"


LINK_FAILURES = {
    "a reply that is not marshal data": (
        "ValueError",
        "import marshal\n"
        + breaks_on_two(
            "        real = marshal.dumps\n        def once(message):\n"
            "            marshal.dumps = real\n            return b'\\xff'\n"
            "        marshal.dumps = once\n        return None"
        ),
    ),
    "data nested too deep": (
        "TypeError",
        breaks_on_two(
            "        x = []\n        for _ in range(300):\n            x = [x]\n        return x"
        ),
    ),
    "its process ended": ("Exception", "import os\n" + breaks_on_two("        os._exit(0)")),
    "its pipes closed": (
        "OSError",
        "import os\n"
        + breaks_on_two(
            "        for fd in range(3, 64):\n            try:\n                os.close(fd)\n"
            "            except OSError:\n                pass"
        ),
    ),
    "no truth value": ("TypeError", breaks_on_two("        return object()")),
    # replies nested past the judge's recursion limit, or that ask it for gigabytes
    "replies nested in replies": (
        "Exception",
        "import marshal\n"
        + breaks_on_two(
            "        real = marshal.dumps\n        def once(message):\n"
            "            marshal.dumps = real\n            reply = ('value', 0)\n"
            "            for _ in range(700):\n                reply = ('items', [reply], ())\n"
            "            return real(reply)\n"
            "        marshal.dumps = once\n        return None"
        ),
    ),
    "a reply that asks for gigabytes": (
        "Exception",
        "import marshal\n"
        + breaks_on_two(
            "        real = marshal.dumps\n        def once(message):\n"
            "            marshal.dumps = real\n"
            "            return b'[' + (2**31 - 1).to_bytes(4, 'little')\n"
            "        marshal.dumps = once\n        return None"
        ),
    ),
    "an interrupt sent to the judge": (
        "KeyboardInterrupt",
        "import os, signal, time\n"
        + breaks_on_two(
            "        os.kill(os.getppid(), signal.SIGINT)\n        time.sleep(0.5)\n        return 0"
        ),
    ),
    "a Decimal signalling NaN": (
        "Exception",
        breaks_on_two("        from decimal import Decimal\n        return Decimal('sNaN')"),
    ),
    # a standard-library object sent as contents that the judge cannot rebuild: a Counter
    # (unhashable) in a set
    "a standard object that does not rebuild": (
        "TypeError",
        "import marshal\n"
        + breaks_on_two(
            "        real = marshal.dumps\n        def once(message):\n"
            "            marshal.dumps = real\n"
            "            return real(('packed', {('\\0oncurve-std', 'Counter', ())}))\n"
            "        marshal.dumps = once\n        return None"
        ),
    ),
}


@pytest.mark.parametrize(("caught", "wrong"), LINK_FAILURES.values(), ids=LINK_FAILURES.keys())
def test_errors_the_program_causes_in_the_judge_are_the_programs(reward, caught, wrong):
    tests = [
        f"assert f(1) == 8\ntry:\n    assert f(2)\n    assert f(2) == 9\nexcept {caught}:\n    pass"
    ]
    scores = reward([""] * 2, [fenced(wrong), fenced(PLUS_7)], tests=[tests] * 2)
    assert scores == [0.0, 1.0]
