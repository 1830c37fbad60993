"""Test code as code datasets write it beyond bare asserts, through `code_tests`: tests that expect
the program to raise, and pytest files (KodCode's `test` column: `from solution import f`,
`test_` functions and `Test` classes, `pytest.raises`, `approx`, `parametrize`, fixtures).

A row is (tests, right program, wrong programs): the right program scores 1, each wrong one 0."""

from __future__ import annotations

import json

import pytest
from helpers.programs import fenced

from oncurve.data.tasks.convert import kodcode_rows
from oncurve.errors import UserError
from oncurve.rewards.code import CodeTestsReward

ADD = "def add(a, b):\n    return a + b\n"
SUB = "def add(a, b):\n    return a - b\n"
THREE = "def add(a, b):\n    return 3\n"
DIVIDE = (
    "def divide(a, b):\n    if b == 0:\n        raise ValueError('division by zero')\n"
    "    return a // b\n"
)
ACCOUNT = (
    "class InsufficientFunds(Exception):\n    pass\n"
    "def withdraw(balance, amount):\n    if amount > balance:\n"
    "        raise InsufficientFunds(f'{amount} > {balance}')\n    return balance - amount\n"
)
STACK = (
    "class Stack:\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n"
    "    def pop(self):\n        return self.items.pop()\n"
)

BANK = (
    "class BankError(Exception):\n    pass\n"
    "class InsufficientFunds(BankError, ArithmeticError):\n"
    "    def __init__(self, needed):\n        super().__init__()\n        self.needed = needed\n"
    "    def __str__(self):\n        return f'short by {self.needed}'\n"
    "def withdraw(balance, amount):\n    if amount > balance:\n"
    "        raise InsufficientFunds(amount - balance)\n    return balance - amount\n"
)
INVENTORY = (
    "class Inventory:\n    def __init__(self):\n        self.items = {}\n"
    "    def add(self, name, n):\n        self.items[name] = self.items.get(name, 0) + n\n"
    "    def count(self, name):\n        return self.items.get(name, 0)\n"
)
VERSION_STACK = (
    "class Version:\n    def __init__(self, s):\n"
    "        self.parts = tuple(int(p) for p in s.split('.'))\n"
    "    def __lt__(self, other):\n        if not isinstance(other, Version):\n"
    "            return NotImplemented\n        return self.parts < other.parts\n"
    "    def __le__(self, other):\n        return self.parts <= other.parts\n"
    "    def __eq__(self, other):\n        return self.parts == other.parts\n"
    "class Stack:\n    __slots__ = ('items',)\n    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n"
    "    def __len__(self):\n        return len(self.items)\n"
    "    def __getitem__(self, i):\n        return self.items[i]\n"
    "    def __str__(self):\n        return f'Stack({self.items})'\n"
)

EXPECTED_EXCEPTIONS = {
    "try/except of the exception's type": (
        "assert divide(7, 2) == 3\ntry:\n    divide(1, 0)\nexcept ValueError as e:\n"
        "    assert 'zero' in str(e) and e.args == ('division by zero',)\n"
        "else:\n    raise AssertionError('no error')\n",
        DIVIDE,
        [
            "def divide(a, b):\n    return a // b if b else None\n",  # no error
            "def divide(a, b):\n    return a // b\n",  # ZeroDivisionError, not ValueError
            DIVIDE.replace("division by zero", "bad"),  # another message
        ],
    ),
    "pytest.raises with match": (
        "import pytest\nfrom solution import divide\n\ndef test_floor():\n"
        "    assert divide(7, 2) == 3\n\ndef test_zero():\n"
        "    with pytest.raises(ValueError, match='by zero') as info:\n        divide(1, 0)\n"
        "    assert info.type is ValueError\n",
        DIVIDE,
        [
            "def divide(a, b):\n    return a // b if b else None\n",
            "def divide(a, b):\n    return a // b\n",
            DIVIDE.replace("division by zero", "bad"),
        ],
    ),
    "the program's own exception class": (
        "import pytest\nfrom solution import withdraw, InsufficientFunds\n\ndef test_ok():\n"
        "    assert withdraw(10, 3) == 7\n\ndef test_over():\n"
        "    with pytest.raises(InsufficientFunds, match='5 > 1'):\n        withdraw(1, 5)\n"
        "    assert issubclass(InsufficientFunds, Exception)\n",
        ACCOUNT,
        [
            ACCOUNT.replace("raise InsufficientFunds", "raise ValueError"),
            ACCOUNT + "class Other(Exception):\n    pass\n"
            "def withdraw(balance, amount):\n    if amount > balance:\n        raise Other()\n"
            "    return balance - amount\n",
        ],
    ),
    "the program's class hierarchy, attributes and message": (
        "import pytest\nfrom solution import withdraw, BankError, InsufficientFunds\n\n"
        "def test_ok():\n    assert withdraw(10, 3) == 7\n\ndef test_base():\n"
        "    with pytest.raises(BankError):\n        withdraw(10, 100)\n"
        "    with pytest.raises(ArithmeticError):\n        withdraw(10, 100)\n\n"
        "def test_details():\n    with pytest.raises(InsufficientFunds) as info:\n"
        "        withdraw(10, 100)\n    assert info.value.needed == 90\n"
        "    assert 'short by 90' in str(info.value)\n",
        BANK,
        [
            BANK.replace("raise InsufficientFunds(amount - balance)", "raise BankError()"),
            BANK.replace("amount - balance)", "amount)"),
            BANK.replace("self.needed = needed", "self.needed = -needed"),
        ],
    ),
    "a standard module's error": (
        "import json\nimport pytest\nfrom solution import parse\n\ndef test_bad():\n"
        "    with pytest.raises(json.JSONDecodeError):\n        parse('{')\n\n"
        "def test_ok():\n    assert parse('[1]') == [1]\n",
        "import json\ndef parse(s):\n    return json.loads(s)\n",
        [
            "import json\ndef parse(s):\n    if s == '{':\n        raise ValueError(s)\n"
            "    return json.loads(s)\n",
            "import json\ndef parse(s):\n    try:\n        return json.loads(s)\n"
            "    except ValueError:\n        return None\n",
        ],
    ),
    "a class of the program's caught by its builtin base": (
        "assert parse('4') == 4\ntry:\n    parse('x')\nexcept ValueError as e:\n"
        "    assert type(e).__name__ == 'ParseError'\nelse:\n    raise AssertionError\n",
        "class ParseError(ValueError):\n    pass\n"
        "def parse(s):\n    if not s.isdigit():\n        raise ParseError(s)\n    return int(s)\n",
        [
            "def parse(s):\n    if not s.isdigit():\n        raise TypeError(s)\n    return int(s)\n",
            "def parse(s):\n    if not s.isdigit():\n        raise ValueError(s)\n    return int(s)\n",
        ],
    ),
    "unittest's assertRaises": (
        "import unittest\nfrom solution import divide\n\nclass TestDivide(unittest.TestCase):\n"
        "    def test_zero(self):\n        with self.assertRaises(ValueError):\n"
        "            divide(1, 0)\n    def test_floor(self):\n"
        "        self.assertEqual(divide(7, 2), 3)\n",
        DIVIDE,
        ["def divide(a, b):\n    return a // b if b else 0\n", "def divide(a, b):\n    return 0\n"],
    ),
    "an error raised while the tests iterate": (
        "from solution import gen\nimport pytest\n\ndef test_gen():\n    g = gen(2)\n"
        "    assert next(g) == 0 and next(g) == 1\n    with pytest.raises(RuntimeError):\n"
        "        next(g)\n    assert list(g) == []\n",
        "def gen(n):\n    yield from range(n)\n    raise RuntimeError('spent')\n",
        [
            "def gen(n):\n    yield from range(n)\n",
            "def gen(n):\n    yield from range(n)\n    yield 5\n",
        ],
    ),
}

PYTEST_FILES = {
    "test functions": (
        "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\n"
        "def test_negative():\n    assert add(-1, -2) == -3\n",
        ADD,
        [SUB, THREE],
    ),
    "import solution": (
        "import solution\n\ndef test_add():\n    assert solution.add(2, 2) == 4\n",
        ADD,
        [SUB],
    ),
    "a star import": (
        "from solution import *\n\ndef test_add():\n    assert add(2, 5) == 7\n",
        ADD,
        [SUB],
    ),
    # xunit hooks are the file's: the program's, which a star import brings in, are neither
    # run (nor asked for their signature) by the tests' runner
    "a star import of a program with xunit hooks": (
        "from solution import *\n\ndef test_add():\n    assert add(2, 5) == 7\n",
        ADD
        + "".join(
            f"def {when}_{scope}(*args):\n    pass\n\n"
            for when in ("setup", "teardown")
            for scope in ("module", "function")
        ),
        [SUB + "def setup_module():\n    pass\n"],
    ),
    "a test class with setup_method": (
        "from solution import add\n\nclass TestAdd:\n    def setup_method(self):\n"
        "        self.base = 10\n\n    def test_base(self):\n        assert add(self.base, 1) == 11\n"
        "\n    def test_zero(self):\n        assert add(0, 0) == 0\n",
        ADD,
        [SUB, "def add(a, b):\n    return 11\n"],
    ),
    "approx": (
        "import pytest\nfrom pytest import approx\nfrom solution import mean\n\ndef test_mean():\n"
        "    assert mean([0.1, 0.2]) == approx(0.15)\n"
        "    assert mean([1, 2, 4]) == pytest.approx(2.3333333)\n"
        "    assert [mean([1, 2]), 1.0] == approx([1.5, 1.0])\n"
        "    assert mean([1, 2]) != approx(1.6)\n",
        "def mean(xs):\n    return sum(xs) / len(xs)\n",
        [
            "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n",
            "def mean(xs):\n    return round(sum(xs) / len(xs), 1)\n",
        ],
    ),
    "parametrize": (
        "import pytest\nfrom solution import square\n\n"
        "@pytest.mark.parametrize('x, expected', [(2, 4), (3, 9), pytest.param(-2, 4, id='neg')])\n"
        "def test_square(x, expected):\n    assert square(x) == expected\n\n"
        "@pytest.mark.parametrize('a', [1, 2])\n@pytest.mark.parametrize('b', [0, 3])\n"
        "def test_product(a, b):\n    assert square(a + b) == (a + b) ** 2\n",
        "def square(x):\n    return x * x\n",
        [
            "def square(x):\n    return x * 2\n",
            "def square(x):\n    return x * x if x > 0 else -x * x\n",
            "def square(x):\n    return {2: 4, 3: 9, -2: 4}.get(x, 0)\n",
        ],
    ),
    "fixtures": (
        "import pytest\nfrom solution import Stack\n\n@pytest.fixture\ndef base():\n    return 1\n\n"
        "@pytest.fixture\ndef stack(base):\n    s = Stack()\n    s.push(base)\n    yield s\n"
        "    assert s.items == []\n\n"
        "def test_pop(stack):\n    assert stack.pop() == 1\n\n"
        "def test_empty(stack):\n    stack.pop()\n    with pytest.raises(IndexError):\n"
        "        stack.pop()\n",
        STACK,
        [
            STACK.replace(
                "return self.items.pop()", "return self.items.pop() if self.items else None"
            ),
            STACK.replace("return self.items.pop()", "return self.items[-1]"),
        ],
    ),
    "unittest test cases without unittest.main": (
        "import unittest\nfrom solution import add\n\nclass AddTests(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
        ADD,
        [SUB],
    ),
    "skip marks": (
        "import sys\nimport pytest\nfrom solution import add\n\n@pytest.mark.skip(reason='later')\n"
        "def test_later():\n    assert add(1, 1) == 99\n\n"
        "@pytest.mark.skipif(sys.version_info < (3, 0), reason='old')\n"
        "def test_now():\n    assert add(1, 1) == 2\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_known():\n    assert add(1, 1) == 3\n",
        ADD,
        [SUB],
    ),
    "a star import leaves builtins and standard modules alone": (
        "import math\nfrom solution import *\n\ndef test_it():\n"
        "    assert sorted(pairs(5)) == [(1, 4), (2, 3)]\n"
        "    assert math.isclose(area(2), 12.566370614359172)\n",
        "import math as m\ndef pairs(n):\n    return [(a, n - a) for a in range(1, n // 2 + 1)]\n"
        "def area(r):\n    return m.pi * r * r\n",
        [
            "import math as m\ndef pairs(n):\n    return []\ndef area(r):\n    return m.pi * r * r\n"
            "def sorted(*args, **kwargs):\n    return [(1, 4), (2, 3)]\n",
            "def pairs(n):\n    return [(a, n - a) for a in range(1, n // 2 + 1)]\n"
            "def area(r):\n    return -1.0\nclass math:\n    @staticmethod\n"
            "    def isclose(*args, **kwargs):\n        return True\n",
        ],
    ),
    "xfail conditions and raises": (
        "import sys\nimport pytest\nfrom solution import add\n\ndef test_add():\n"
        "    assert add(1, 1) == 2\n\n@pytest.mark.xfail(sys.version_info < (3, 0), reason='old')\n"
        "def test_not_expected_to_fail():\n    assert add(2, 2) == 4\n\n"
        "@pytest.mark.xfail(raises=NotImplementedError)\ndef test_only_that_error():\n"
        "    assert add(3, 3) == 6\n",
        ADD,
        ["def add(a, b):\n    return 2\n"],
    ),
    "test classes named in their own code, nested ones": (
        "import unittest\nfrom solution import add\n\nclass TestAdd(unittest.TestCase):\n"
        "    def setUp(self):\n        super(TestAdd, self).setUp()\n\n    def test_add(self):\n"
        "        self.assertEqual(add(2, 2), 4)\n\nclass TestOuter:\n    class TestInner:\n"
        "        def test_add(self):\n            assert add(5, 1) == 6\n",
        ADD,
        ["def add(a, b):\n    return 4\n"],
    ),
    "fixture params, indirect parametrization, scopes, xunit functions": (
        "import pytest\nfrom solution import Inventory\n\nLOG = []\n\n"
        "def setup_module(module):\n    LOG.append('module')\n\n"
        "def setup_function(function):\n    LOG.append(function.__name__)\n\n"
        "@pytest.fixture(scope='module')\ndef shared():\n    return Inventory()\n\n"
        "@pytest.fixture(params=[1, 2])\ndef amount(request):\n    return request.param * 10\n\n"
        "def test_first(shared, amount):\n    shared.add('apple', amount)\n"
        "    assert shared.count('apple') in (10, 30)\n\n"
        "@pytest.mark.parametrize('amount', [5], indirect=True)\n"
        "def test_indirect(shared, amount):\n    assert amount == 50\n"
        "    assert shared.count('apple') == 30\n    assert LOG[0] == 'module'\n",
        INVENTORY,
        [INVENTORY.replace("self.items.get(name, 0) + n", "n")],
    ),
    "a star import leaves the names the tests imported before it alone": (
        "import pytest\nfrom math import isclose\nfrom solution import *\n\n"
        "@pytest.mark.parametrize('r', [1, 2])\ndef test_area(r):\n"
        "    assert isclose(area(r), 3.14159 * r * r, rel_tol=1e-3)\n",
        "import math\nfrom math import isclose\ndef area(r):\n    return math.pi * r * r\n",
        [
            "def area(r):\n    return 0\ndef isclose(*args, **kwargs):\n    return True\n",
            "def area(r):\n    return 0\nclass pytest:\n    class mark:\n"
            "        @staticmethod\n        def parametrize(*args):\n            return ValueError\n",
        ],
    ),
    "operators that give the tests a value": (
        "import pytest\nfrom solution import Stack, mean\n\ndef test_stack():\n    s = Stack()\n"
        "    s.push(1)\n    s.push(2)\n"
        "    assert len(s) == 2 and s[0] == 1 and s[-1:] == [2] and str(s) == 'Stack([1, 2])'\n"
        "    with pytest.raises(TypeError):\n        s[0] = 5\n"
        "    assert not hasattr(s, '__dict__')\n\ndef test_mean():\n"
        "    assert abs(mean([1, 2]) - 1.5) < 1e-9\n",
        VERSION_STACK + "def mean(xs):\n    return sum(xs) / len(xs)\n",
        [
            VERSION_STACK + "    def __setitem__(self, i, x):\n        self.items[i] = x\n"
            "def mean(xs):\n    return sum(xs) / len(xs)\n",
            VERSION_STACK.replace("    __slots__ = ('items',)\n", "")
            + "def mean(xs):\n    return sum(xs) / len(xs)\n",
            # an answer that says it is as close to anything as asked
            VERSION_STACK + "class Near:\n    def __sub__(self, other):\n        return 0.0\n"
            "    __rsub__ = __sub__\ndef mean(xs):\n    return Near()\n",
        ],
    ),
    "a standard module's class the tests never import": (
        "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        "from subprocess import CalledProcessError\n" + ADD,
        [SUB],
    ),
    "an empty parametrization": (
        "import pytest\nfrom solution import add\n\n@pytest.mark.parametrize('a', [])\n"
        "def test_none(a):\n    assert add(a, 0) == -1\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        ADD,
        [SUB],
    ),
    "pytest.main at the end": (
        "import sys\nimport pytest\nfrom solution import add\n\ndef test_add():\n"
        "    assert add(2, 3) == 5\n\nif __name__ == '__main__':\n"
        "    sys.exit(pytest.main([__file__]))\n",
        ADD,
        [SUB],
    ),
    "a test function the file calls itself": (
        "def test_add(f, a, b, expected):\n    assert f(a, b) == expected\n\n"
        "test_add(add, 2, 3, 5)\n",
        ADD,
        [SUB],
    ),
}

# Test files that pay no program (nothing they run uses it), and programs that are wrong
# however the file is read: each program scores 0.
NOTHING_PAID = {
    "every test skipped": (
        "import pytest\nfrom solution import add\n\n@pytest.mark.skip\ndef test_add():\n"
        "    assert add(1, 1) == 2\n",
        [ADD, SUB],
    ),
    "an import and no test": ("from solution import add, LIMIT\n", [ADD + "LIMIT = 3\n"]),
    "a coroutine test": (
        "from solution import add\n\nasync def test_add():\n    assert add(1, 1) == 2\n",
        [ADD],
    ),
    "a test that yields": (
        "from solution import add\n\ndef test_add():\n    yield add(1, 1) == 2\n",
        [ADD],
    ),
    "a fixture the file does not define": (
        "from solution import add\n\ndef test_add(capsys):\n    assert add(1, 1) == 2\n",
        [ADD],
    ),
    # nor do the program's xunit hooks, called by the runner and not by the tests
    "a star import of the program's xunit hooks, and skipped tests": (
        "import pytest\nfrom solution import *\n\ndef test_add():\n"
        "    pytest.importorskip('numpy')\n    assert add(1, 1) == 2\n",
        [
            ADD
            + "def setup_module():\n    return None\n\ndef teardown_module(module=None):\n    pass\n"
        ],
    ),
    # the program's own test functions are not the file's
    "a star import of the program's tests": (
        "from solution import *\n",
        [SUB + "def test_add():\n    assert add(1, 1) == 2\n"],
    ),
    # Python's protocols take StopIteration and AttributeError for signals: the program's fail
    # its case even where the tests expect an exception
    "StopIteration in pytest.raises": (
        "import pytest\nfrom solution import add\n\ndef test_add():\n    assert add(1, 1) == 2\n"
        "    with pytest.raises(Exception):\n        add(None, 1)\n",
        [
            ADD.replace(
                "return a + b", "if a is None:\n        raise StopIteration\n    return a + b"
            )
        ],
    ),
    "AttributeError in pytest.raises": (
        "import pytest\nfrom solution import add\n\ndef test_add():\n    assert add(1, 1) == 2\n"
        "    with pytest.raises(Exception):\n        add(None, 1)\n",
        [
            ADD.replace(
                "return a + b", "if a is None:\n        raise AttributeError\n    return a + b"
            )
        ],
    ),
    "an interrupt the tests catch": (
        "from solution import add\n\ndef test_add():\n    try:\n        assert add(1, 1) == 5\n"
        "    except BaseException:\n        pass\n",
        ["def add(a, b):\n    raise KeyboardInterrupt\n"],
    ),
    "a failure of pytest's the tests catch": (
        "import pytest\nfrom solution import add\n\ndef test_add():\n    try:\n"
        "        with pytest.raises(TypeError):\n            add(1, 2)\n    except Exception:\n"
        "        pass\n",
        [ADD],
    ),
    # a patch of the tests' process does not reach the program's: the tests fail
    "tests that patch what the program reads": (
        "from unittest.mock import patch\nfrom solution import add, main\n\ndef test_add():\n"
        "    assert add(1, 2) == 3\n\n@patch('builtins.input', side_effect=['5'])\n"
        "@patch('builtins.print')\ndef test_main(mock_print, mock_input):\n    main()\n"
        "    mock_print.assert_called_once_with(6)\n",
        [ADD + "def main():\n    print(int(input()) + 1)\n", ADD + "def main():\n    pass\n"],
    ),
    # an object of the tests' own cannot reach the program's process: the case fails rather
    # than the tests catching the judge's error
    "an object of the tests' passed to the program": (
        "import pytest\nfrom solution import first\n\ndef test_first():\n"
        "    with pytest.raises(TypeError):\n        first(object())\n",
        ["def first(x):\n    return x[0]\n", "def first(x):\n    raise TypeError\n"],
    ),
    # operators that would judge for the tests, handed what they expect (`==`, `<`, `in`, `-`
    # on objects of the program's) are its word, not its answer: the case fails, right or wrong
    "operators that would judge for the tests": (
        "from solution import Version\n\ndef test_order():\n"
        "    assert Version('1.2') < Version('1.10')\n    assert Version('1.2') == Version('1.2')\n",
        [VERSION_STACK, VERSION_STACK.replace("return self.parts == other.parts", "return True")],
    ),
    # unittest's own control errors steer a test run (a skip, a stop that counts as a pass)
    "unittest's skip and stop raised by the program": (
        "import unittest\nfrom solution import square\n\nclass TestSquare(unittest.TestCase):\n"
        "    def test_two(self):\n        self.assertEqual(square(2), 4)\n",
        [
            "import unittest\ndef square(x):\n    raise unittest.SkipTest()\n",
            "import unittest.case\ndef square(x):\n    raise unittest.case._ShouldStop()\n",
        ],
    ),
    "unittest's skip reached through another standard module": (
        "import doctest\nimport unittest\nfrom solution import square\n\n"
        "class TestSquare(unittest.TestCase):\n    def test_two(self):\n"
        "        self.assertEqual(square(2), 4)\n",
        [
            "class E(Exception):\n    pass\nE.__module__ = 'doctest'\n"
            "E.__qualname__ = 'unittest.SkipTest'\ndef square(x):\n    raise E('skip')\n"
        ],
    ),
    # classes the judge does not have, returned by a call, would all be one object there
    "standard classes the judge has not imported, as answers": (
        "from solution import canonical\n\ndef test_rotations():\n"
        "    assert canonical('abc') == canonical('bca')\n",
        [
            "import importlib\nKINDS = [importlib.import_module(n).Error for n in "
            "('wa' + 've', 'config' + 'parser')]\n"
            "def canonical(s):\n    return KINDS[len(set(s[:2])) % 2 + (s[0] == 'a')]\n"
        ],
    ),
    "a program's pytest": (
        "def test_add():\n    with pytest.raises(AssertionError):\n        assert add(1, 1) == 2\n",
        [ADD + "class pytest:\n    @staticmethod\n    def raises(kind):\n        return None\n"],
    ),
}


@pytest.fixture(scope="module")
def reward() -> CodeTestsReward:
    return CodeTestsReward(workers=4, timeout_s=5.0, memory_mb=256)


TABLE = {
    **{f"expected exceptions: {k}": v for k, v in EXPECTED_EXCEPTIONS.items()},
    **{f"pytest files: {k}": v for k, v in PYTEST_FILES.items()},
}


@pytest.mark.parametrize(("tests", "right", "wrongs"), TABLE.values(), ids=TABLE.keys())
def test_the_right_program_passes_and_each_wrong_one_fails(reward, tests, right, wrongs):
    programs = [right, *wrongs]
    scores = reward(
        [""] * len(programs), [fenced(p) for p in programs], tests=[tests] * len(programs)
    )
    assert scores == [1.0] + [0.0] * len(wrongs)


@pytest.mark.parametrize(("tests", "programs"), NOTHING_PAID.values(), ids=NOTHING_PAID.keys())
def test_test_files_that_run_no_test_of_the_program_pay_nothing(reward, tests, programs):
    scores = reward(
        [""] * len(programs), [fenced(p) for p in programs], tests=[tests] * len(programs)
    )
    assert scores == [0.0] * len(programs)


# Records in KodCode's shape (its `test` a pytest file importing `solution`), written for this test.
KODCODE = [
    {
        "question_id": "Leetcode_1",
        "question": "Return the indices of the two numbers of `nums` that add up to `target`.",
        "solution": "def two_sum(nums, target):\n    seen = {}\n    for i, x in enumerate(nums):\n"
        "        if target - x in seen:\n            return [seen[target - x], i]\n"
        "        seen[x] = i\n    return []\n",
        "test": "from solution import two_sum\n\ndef test_found():\n"
        "    assert two_sum([2, 7, 11, 15], 9) == [0, 1]\n\ndef test_missing():\n"
        "    assert two_sum([1, 2], 7) == []\n",
        "test_info": [
            {"function_name": "two_sum", "function_declaration": "def two_sum(nums, target):"}
        ],
    },
    {
        "question_id": "Prefill_2",
        "question": "Write `safe_sqrt(x)`: the square root of x, a ValueError for negative x.",
        "solution": "import math\n\ndef safe_sqrt(x):\n    if x < 0:\n"
        "        raise ValueError('negative')\n    return math.sqrt(x)\n",
        "test": "import pytest\nfrom solution import safe_sqrt\n\n"
        "@pytest.mark.parametrize('x, root', [(4, 2.0), (2, 1.41421356)])\n"
        "def test_root(x, root):\n    assert safe_sqrt(x) == pytest.approx(root)\n\n"
        "def test_negative():\n    with pytest.raises(ValueError):\n        safe_sqrt(-1)\n",
    },
]


def test_kodcode_rows_score_the_reference_1_and_a_wrong_program_0(tmp_path, reward):
    path = tmp_path / "kodcode.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in KODCODE))
    rows = kodcode_rows(str(path))
    assert [r["task_id"] for r in rows] == ["Leetcode_1", "Prefill_2"]
    assert "`def two_sum(nums, target):`" in rows[0]["prompt"] and "```python" in rows[0]["prompt"]
    assert rows[1]["tests"] == KODCODE[1]["test"]
    references = [fenced(r["answer"]) for r in rows]
    wrongs = [
        fenced("def two_sum(nums, target):\n    return [0, 1]\n"),
        fenced("import math\n\ndef safe_sqrt(x):\n    return math.sqrt(abs(x))\n"),
    ]
    tests = [r["tests"] for r in rows] * 2
    assert reward([""] * 4, references + wrongs, tests=tests) == [1.0, 1.0, 0.0, 0.0]
    path.write_text(json.dumps({**KODCODE[0], "test_info": "two_sum"}) + "\n")
    with pytest.raises(UserError, match=r"line 1: field 'test_info' must be a list of objects"):
        kodcode_rows(str(path))
