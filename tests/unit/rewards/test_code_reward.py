"""The `code_tests` reward: program extraction, both test forms, the fraction passed, failures
that count as failed, its settings; and the MBPP and HumanEval converters it scores."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from helpers.paths import FIXTURES

from oncurve import sandbox
from oncurve.config import load_config
from oncurve.data.prompts import correctness_fn
from oncurve.data.tasks import get_task
from oncurve.data.tasks.convert import humaneval_rows, main, mbpp_rows
from oncurve.envs import PythonToolEnv
from oncurve.errors import UserError
from oncurve.rewards.code import (
    MAX_PROGRAM_CHARS,
    Case,
    CodeTestsReward,
    code_tests_reward,
    compiles,
    extract_program,
    parse_tests,
    same_output,
)
from oncurve.rewards.registry import resolve_reward
from oncurve.run.rewards import build_rewards
from oncurve.sandbox import probing

ADD_ONE = "def f(x):\n    return x + 1\n"


def fenced(code: str, tag: str = "python") -> str:
    return f"Here it is:\n```{tag}\n{code}```\nDone."


@pytest.fixture
def reward() -> CodeTestsReward:
    return CodeTestsReward(workers=4, timeout_s=2.0, memory_mb=256)


@pytest.mark.parametrize(
    ("completion", "program"),
    [
        (fenced(ADD_ONE), ADD_ONE),
        (fenced(ADD_ONE, "py"), ADD_ONE),
        # the last python block wins, over an earlier one and over a later untagged one
        (fenced("x = 1\n") + fenced(ADD_ONE) + "\n```\n5\n```", ADD_ONE),
        # no python block: the last block of any language
        ("```text\nno\n```\n```\nprint(2)\n```", "print(2)\n"),
        ("def f(x):\n    return x + 1", None),  # no fence
        ("```python\n\n```", None),  # blank
        ("```python\ndef f(x):\n    return x", None),  # never closed
    ],
)
def test_extract_program(completion, program):
    assert extract_program(completion) == program


@pytest.mark.parametrize(
    ("completion", "program"),
    [
        (fenced(ADD_ONE) + "\n```python\n```", ADD_ONE),  # a blank block after the code
        ("```text\n43\n```", None),  # another language is no tool call
        ("```\nprint(2)\n```", None),
    ],
)
def test_a_tool_call_is_the_last_python_block_with_code(completion, program):
    assert extract_program(completion, python_only=True) == program


def test_compiles_parses_without_running_and_without_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compiles("x = 'a'(1)\n")  # a SyntaxWarning, were it not silenced
        assert compiles("import os\nos._exit(3)\n")  # parsed, not run
        assert not compiles("def f(:\n")
        assert not compiles("x = 1\0")
    assert not caught


def test_compiles_folds_no_constants_in_the_trainers_process():
    """`'a'*4096 + 'a'*4096 + ...` folded by the compiler holds every partial string at once
    (gigabytes for a 6,000-character program); parsing holds the tree alone. Checked in a child
    process under a 1 GiB address-space limit, where folding runs out of memory."""
    terms = 700
    program = "x = " + "'\U0001f600'*4096+" * terms + "''\n"
    child = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from oncurve.rewards.code import compiles\n"
        "print(compiles(sys.stdin.read()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], input=program, capture_output=True, text=True, timeout=120
    )
    assert done.stdout == "True\n", done.stderr[-500:]


def test_parse_tests_reads_both_forms_and_names_the_bad_item():
    assert parse_tests(None) == parse_tests("") == parse_tests([]) == []
    assert parse_tests("assert f(1) == 2") == [Case(code="assert f(1) == 2")]
    assert parse_tests([{"input": "1\n", "output": "2\n"}, "assert f(2) == 4"]) == [
        Case(stdin="1\n", expected="2\n"),
        Case(code="assert f(2) == 4"),
    ]
    with pytest.raises(UserError, match=r"column 'tests' item 1 must be a string of test code"):
        parse_tests(["assert f(2) == 4", {"input": "1"}])
    with pytest.raises(UserError, match=r"column 'tests' must be .* got int"):
        parse_tests(3)


def test_same_output_compares_each_lines_tokens_and_numbers_printed_to_other_digits():
    """As judges' usual checkers: each line's tokens, however spaced; a number with a fraction
    printed to other digits (within 1e-7, or 1e-9 of it), no other; an integer exactly."""
    assert same_output("1 2  \n3\n\n", "1 2\n3")
    assert same_output("1  2\t\n 3", "1 2\n3")
    assert same_output("0.3333333333333333\n", "0.333333333\n")
    assert same_output("0.666666667", "0.6666666667")
    assert same_output("2.00000004 1.5e3", "2.000000 1500.0")
    assert not same_output("\n1", "1")
    assert not same_output("0 1 2", "0\n1\n2")
    assert not same_output("2.00001", "2.0")
    assert not same_output("1234567.00", "1234567.89") and not same_output("0", "0.000001")
    assert not same_output("1000001", "1000000")
    assert not same_output("1.0", "1")  # an integer asked for: its digits
    assert not same_output("YES", "Yes")
    assert not same_output("1 2", "1 2 3")
    assert same_output("nan inf", "nan inf")  # as text
    assert not same_output("1e400", "1.5e308")  # no infinite value is near a finite one


def test_the_score_is_the_fraction_of_cases_passed(reward):
    # right for x >= 0 only: passes 2 of 3 asserts
    program = "def f(x):\n    return abs(x) + 1\n"
    tests = [["assert f(1) == 2", "assert f(5) == 6", "assert f(-3) == -2"]] * 2
    assert reward(["p"] * 2, [fenced(program), fenced(ADD_ONE)], tests=tests) == pytest.approx(
        [2 / 3, 1.0]
    )


def test_stdin_stdout_cases(reward):
    program = "n = int(input())\nprint(n * 2, ' ')\nprint()\n"
    tests = [
        [
            {"input": "3\n", "output": "6"},
            {"input": "4", "output": "8\n"},
            {"input": "1", "output": "3"},
        ]
    ]
    assert reward(["p"], [fenced(program)], tests=tests) == pytest.approx([2 / 3])


def test_an_expected_output_over_the_sandboxs_output_limit_can_pass(reward):
    n = 20000
    squares = "\n".join(str(i * i) for i in range(n)) + "\n"
    assert len(squares) > 2 * sandbox.OUTPUT_LIMIT
    right = "n = int(input())\nprint('\\n'.join(str(i * i) for i in range(n)))\n"
    wrong = "n = int(input())\nprint('\\n'.join(str(i * i + (i == n - 1)) for i in range(n)))\n"
    endless = "while True:\n    print(0)\n"
    tests = [[{"input": f"{n}\n", "output": squares}]] * 3
    programs = [fenced(right), fenced(wrong), fenced(endless)]
    assert reward(["p"] * 3, programs, tests=tests) == [1.0, 0.0, 0.0]


def test_a_timeout_a_crash_and_too_much_memory_fail_their_case_alone():
    reward = CodeTestsReward(workers=3, timeout_s=0.5, memory_mb=256)
    program = (
        "n = int(input())\n"
        "if n == 0:\n    while True: pass\n"
        "if n == 1:\n    raise ValueError('boom')\n"
        "if n == 2:\n    block = bytearray(512 * 2**20)\n"  # over memory_mb
        "print(n)\n"
    )
    tests = [[{"input": str(n), "output": str(n)} for n in range(5)]]
    assert reward(["p"], [fenced(program)], tests=tests) == [pytest.approx(2 / 5)]


def test_no_program_no_tests_and_broken_programs(reward, monkeypatch):
    ran: list[str] = []
    pool_map = sandbox.SandboxPool.map

    def recording(pool, sources, *args, **kwargs):
        ran.extend(sources)
        return pool_map(pool, sources, *args, **kwargs)

    monkeypatch.setattr(sandbox.SandboxPool, "map", recording)
    completions = [
        "def f(x): return x + 1",  # no fenced block
        fenced(ADD_ONE),  # a row without tests
        fenced("def f(x):\n    return (x +\n"),  # does not compile
        fenced(ADD_ONE),
        fenced(ADD_ONE),  # the same runs as the row before
    ]
    one = ["assert f(1) == 2"]
    tests = [one, [], one, one, one]
    assert reward(["p"] * 5, completions, tests=tests) == [0.0, None, 0.0, 1.0, 1.0]
    # one run, under the harness: nothing else needed running
    assert len(ran) == 1 and ran[0].endswith(f"\nrun({ADD_ONE!r}, '')\n")
    with pytest.raises(UserError, match="reward 'code_tests' needs a 'tests' column"):
        reward(["p"], [fenced(ADD_ONE)], answer=["2"])


# Programs that get `add` wrong and try to pass its tests anyway: each must score 0.
FORGERIES = {
    "os._exit(0)": "import os\nos._exit(0)\n",
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "atexit that exits 0": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "exception hook that exits 0": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "always-equal object": (
        "class Same:\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Same()\n"
    ),
    "int subclass that equals anything": (
        "class Same(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Same(0)\n"
    ),
    "str subclass that equals anything": (
        "class Same(str):\n    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = str.__hash__\n"
        "def add(a, b):\n    return Same('')\n"
    ),
    "int subclass with the hash of any number": (
        "class Same(int):\n    def __eq__(self, other):\n        return True\n"
        "    def __hash__(self):\n        return hash(3) if self else hash(4)\n"
        "def add(a, b):\n    return [Same(0), Same(1)][a > 1]\n"
    ),
    "truthy object for `assert add(...)`": (
        "class Yes:\n    def __bool__(self):\n        return True\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    "patched builtins": (
        "import builtins\nbuiltins.set = lambda *a: 0\nbuiltins.sorted = lambda *a: 0\n"
    ),
    "os._exit(0) inside the function": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "printed verdicts": (
        "import os, sys\nprint('pass')\nprint('1 pass', file=sys.stderr)\n"
        "for fd in range(3, 64):\n"
        "    try:\n        os.write(fd, b'pass\\n')\n    except OSError:\n        pass\n"
    ),
    # the secret and the tests are in the judging process's stdin and memory: /proc refuses
    "reads the judge's stdin and memory": (
        "import os\nfor pid in range(1, 8):\n"
        "    for path in (f'/proc/{pid}/fd/0', f'/proc/{pid}/mem', f'/proc/{pid}/fd/1'):\n"
        "        try:\n            with open(path, 'rb') as f:\n"
        "                os.write(1, f.read(100))\n"
        "        except OSError:\n            pass\n"
    ),
    # the tests, searched for in the memory of every other process in sight (the needle is
    # joined at run time: the judge holds the program's text): `add` answers right where they
    # are found, so a leak would pay the wrong program
    "searches other processes' memory for the tests": (
        "import os\n"
        "def leaked(needle=('candidate(2, ' + '3) == 5').encode()):\n"
        "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "        try:\n"
        "            maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
        "            mem = open(f'/proc/{pid}/mem', 'rb')\n"
        "        except OSError:\n"
        "            continue\n"
        "        for line in maps if int(pid) != os.getpid() else ():\n"
        "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "            try:\n"
        "                mem.seek(lo)\n"
        "                if hi - lo < 1 << 26 and needle in mem.read(hi - lo):\n"
        "                    return True\n"
        "            except (OSError, ValueError, OverflowError, MemoryError):\n"
        "                pass\n"
        "    return False\n"
        "add = (lambda own: lambda a, b: a + b if leaked() else own(a, b))(add)\n"
    ),
}
WRONG_ADD = "def add(a, b):\n    return 0\n"
ADD_TESTS = [
    "assert add(1, 2) == 3",
    "assert set([add(2, 2)]) == {4}",
    "assert sorted([add(0, 5), 1]) == [1, 5]",
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(1, 1)\ncheck(add)\n",
]


@pytest.mark.parametrize("trick", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_program_cannot_forge_assert_verdicts(reward, trick):
    program = trick if "def add" in trick else WRONG_ADD + trick
    right = "def add(a, b):\n    return a + b\n"
    scores = reward(["p"] * 2, [fenced(program), fenced(right + trick)], tests=[ADD_TESTS] * 2)
    assert scores[0] == 0.0
    # beside a right `add`, a trick costs nothing unless it replaces `add`, ends the program's
    # process before the tests call it, or garbles its answers (bytes written to every
    # descriptor); a `sys.exit` ends only the program's top-level code
    breaks = [FORGERIES[k] for k in ("os._exit(0)", "printed verdicts")]
    assert scores[1] == (0.0 if "def add" in trick or trick in breaks else 1.0)


def test_io_cases_are_judged_on_stdout_alone(reward):
    wrong = "input()\nprint(0)\nimport os\nos._exit(0)\n"
    right = "print(int(input()) * 2)\n"
    tests = [[{"input": "3", "output": "6"}, {"input": "5", "output": "10"}]] * 2
    assert reward(["p"] * 2, [fenced(wrong), fenced(right)], tests=tests) == [0.0, 1.0]


def test_tests_see_the_programs_data_and_objects_by_value(reward):
    program = (
        "class Counter:\n    def __init__(self, start):\n        self.n = start\n"
        "    def up(self):\n        self.n += 1\n        return self.n\n"
        "def squares(n):\n    return (i * i for i in range(n))\n"
        "def total(counters):\n    return sum(c.n for c in counters)\n"
        "def scaled(x):\n    return x * FACTOR\n"
        "def fails(x):\n    raise ValueError(x)\n"
        "LIMIT = 7\n"
    )
    tests = [
        "c = Counter(3)\nassert c.up() == 4 and c.up() == 5 and c.n == 5",
        "assert total([Counter(1), Counter(5)]) == 6",  # its objects passed back to it
        "c = Counter(0)\nc.n = 9\nassert c.up() == 10",  # an attribute set by the tests
        "assert list(squares(4)) == [0, 1, 4, 9] and LIMIT == 7",
        "assert scaled(2) == 6",  # FACTOR from the row's setup code, on both sides
        "assert FACTOR == 3",
        # the program raised the error the tests expect
        "try:\n    fails(1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
    ]
    setup = ["FACTOR = 3"]
    assert reward(["p"], [fenced(program)], tests=[tests], test_setup=setup) == [1.0]
    # without the setup code, a value the tests bind does not reach the program
    tests = ["FACTOR = 3\nassert scaled(2) == 6"]
    assert reward(["p"], [fenced(program)], tests=[tests]) == [0.0]


def test_setup_and_entry_point_columns_are_checked(reward):
    with pytest.raises(UserError, match=r"column 'test_setup' must be text, got int"):
        reward(["p"], [fenced(ADD_ONE)], tests=[["assert f(1) == 2"]], test_setup=[3])
    with pytest.raises(UserError, match=r"column 'entry_point' must be a Python name"):
        reward(["p"], [fenced(ADD_ONE)], tests=[["assert f(1) == 2"]], entry_point=["f(1)"])


def test_an_entry_point_may_shadow_a_builtin(reward):
    program = "def sum(a, b):\n    return a - b\n"
    tests = [["assert sum(5, 3) == 2", "assert len([sum(1, 1)]) == 1"]]
    assert reward(["p"], [fenced(program)], tests=tests, entry_point=["sum"]) == [1.0]
    # not named as the entry point, `sum` is the builtin, which takes no such arguments
    assert reward(["p"], [fenced(program)], tests=tests) == [0.0]


def test_an_oversized_program_scores_0_without_being_compiled(reward, monkeypatch):
    # a comparison chain the compiler takes seconds and gigabytes over at 4 MB
    chain = "x = " + " < ".join(["1"] * (1 << 20)) + "\n"
    assert len(chain) > 4 << 20 > MAX_PROGRAM_CHARS
    compiled: list[int] = []
    real_compile = compile
    monkeypatch.setattr(
        "builtins.compile",
        lambda src, *a, **k: compiled.append(len(src)) or real_compile(src, *a, **k),
    )
    assert not compiles(chain)
    assert reward(["p"], [fenced(chain)], tests=[["assert x"]]) == [0.0]
    assert compiled == []
    small = "x = 1 < 2\n"
    assert compiles(small) and compiled == [len(small)]


def test_undecodable_source_is_an_error_result(reward):
    program = "def one():\n    return 1{}\n"
    tests = [["assert one() == 1"]]
    assert reward(["p"], [fenced(program.format(""))], tests=tests) == [1.0]  # the control
    assert reward(["p"], [fenced(program.format("  # \ud800"))], tests=tests) == [0.0]
    env = PythonToolEnv(timeout_s=2.0, memory_mb=256)
    env.reset({"prompt": "2 + 2?", "answer": "4"})
    observation, score, done = env.step(fenced("print(1)  # \ud800\n"))
    assert (score, done) == (0.0, False)
    assert "[error: undecodable source]" in observation


def test_python_tool_rewards_only_the_final_answer():
    env = PythonToolEnv(timeout_s=2.0, memory_mb=256)
    env.reset({"prompt": "2 + 2?", "answer": "4"})
    # a tool call whose output claims the answer, then exits early: no reward, not done
    observation, score, done = env.step(
        fenced("print('\\\\boxed{4}', flush=True)\nimport os\nos._exit(0)\n")
    )
    assert (score, done) == (0.0, False) and "boxed{4}" in observation
    assert env.step("The answer is \\boxed{5}.") == (None, 0.0, True)


def test_a_run_configures_the_reward_and_probes_the_sandbox_at_start(monkeypatch, tmp_path):
    probes: list[bool] = []
    isolation = sandbox.isolation
    monkeypatch.setattr(probing, "isolation", lambda: probes.append(True) or isolation())
    for name in ("workers", "timeout_s", "memory_mb", "_pool"):  # restored after the test
        monkeypatch.setattr(code_tests_reward, name, getattr(code_tests_reward, name))
    settings = [
        "reward.sandbox_workers=3",
        "reward.sandbox_timeout_s=2",
        "reward.sandbox_memory_mb=300",
    ]
    config = load_config(None, ["data.task=code", *settings])
    with build_rewards(config, get_task("code")) as runner:
        assert (code_tests_reward.workers, code_tests_reward.timeout_s) == (3, 2.0)
        assert code_tests_reward.memory_mb == 300
        assert probes  # before any reward was computed
        assert runner.verifier == "correct"  # the task's name for it
    code_tests_reward._pool.close()
    # a data file scored by `code_tests`: evaluation and the verifier use it too
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "p", "answer": "", "tests": "assert x == 1"}) + "\n")
    config = load_config(None, [f"data.path={data}", "reward.functions=[code_tests]"])
    assert correctness_fn(config, None) is code_tests_reward is resolve_reward("code_tests")[1]
    with build_rewards(config, None) as runner:
        assert runner.verifier == "code_tests"
        result = runner.score(["p"], [fenced("x = 1\n")], {"tests": ["assert x == 1"]})
        assert result.total.tolist() == [1.0]
    code_tests_reward._pool.close()
    # a run without a code reward leaves the sandbox alone
    probes.clear()
    build_rewards(load_config(None, ["data.task=sums"]), get_task("sums")).close()
    assert not probes


def test_sandbox_workers_are_bounded_by_the_sandbox():
    assert load_config(None, ["reward.sandbox_workers=64"]).reward.sandbox_workers == 64
    too_many = f"reward.sandbox_workers={sandbox.MAX_PARALLEL + 1}"
    with pytest.raises(UserError, match=r"reward.sandbox_workers must be in \[1, 64\]"):
        load_config(None, [too_many])


# --- converters: MBPP and HumanEval rows that the reward scores ------------------------------

MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements of two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
            "assert set(similar_elements((11, 12, 14, 13), (17, 15, 14, 13))) == set((13, 14))",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 3,
        "prompt": "Write a function to scale a number by the module's factor.",
        "code": "def scale(x):\n    return x * FACTOR",
        "test_list": [
            "assert scale(2) == 6",
            "assert scale(0) == 0",
            "assert math.isclose(scale(1), 3)",
        ],
        "test_setup_code": "FACTOR = 3",
        "test_imports": ["import math"],
    },
]
HUMANEVAL = {
    "task_id": "HumanEval/0",
    "prompt": 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """Sum of xs."""\n',
    "canonical_solution": "    return sum(xs)\n",
    "test": "def check(candidate):\n    assert candidate([1, 2]) == 3\n    assert candidate([]) == 0\n",
    "entry_point": "total",
}


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_mbpp_rows_score_the_reference_1_and_a_wrong_program_its_fraction(tmp_path, reward):
    rows = mbpp_rows(_write(tmp_path / "mbpp.jsonl", MBPP))
    assert [r["task_id"] for r in rows] == [2, 3]
    assert MBPP[0]["test_list"][0] in rows[0]["prompt"] and "```python" in rows[0]["prompt"]
    assert rows[1]["tests"] == MBPP[1]["test_list"]
    assert rows[1]["test_setup"] == "import math\nFACTOR = 3" and rows[0]["test_setup"] is None
    assert [r["entry_point"] for r in rows] == ["similar_elements", "scale"]
    columns = {k: [r[k] for r in rows] for k in ("tests", "test_setup", "entry_point")}
    references = [fenced(r["answer"]) for r in rows]
    assert reward([""] * 2, references, **columns) == [1.0, 1.0]
    wrong = fenced("def scale(x):\n    return x * 2\n")  # passes `scale(0) == 0` only
    columns = {k: [rows[1][k]] for k in columns}
    assert reward([""], [wrong], **columns) == pytest.approx([1 / 3])

    dest = tmp_path / "out.jsonl"
    assert main(["mbpp", str(tmp_path / "mbpp.jsonl"), str(dest)]) == 0
    assert [json.loads(line) for line in dest.read_text().splitlines()] == rows
    bad = _write(tmp_path / "bad.jsonl", [{**MBPP[0], "test_list": "assert f(2) == 4"}])
    with pytest.raises(UserError, match=r"bad.jsonl line 1: field 'test_list' must be a list"):
        mbpp_rows(bad)


def test_humaneval_rows_run_check_on_the_entry_point(tmp_path, reward):
    (row,) = humaneval_rows(_write(tmp_path / "he.jsonl", [HUMANEVAL]))
    assert row["tests"].endswith("check(total)\n")
    assert (row["test_setup"], row["entry_point"]) == ("from typing import List\n\n\n", "total")
    assert "def total(xs: List[int]) -> int:" in row["prompt"]
    wrong = "from typing import List\n\ndef total(xs: List[int]) -> int:\n    return len(xs)\n"
    scores = reward([""] * 2, [fenced(row["answer"]), fenced(wrong)], tests=[row["tests"]] * 2)
    assert scores == [1.0, 0.0]  # one case: check() as a whole
    bad = _write(tmp_path / "bad.jsonl", [{k: v for k, v in HUMANEVAL.items() if k != "test"}])
    with pytest.raises(UserError, match=r"bad.jsonl line 1: missing or non-text field 'test'"):
        humaneval_rows(bad)


@pytest.mark.parametrize(("kind", "convert"), [("mbpp", mbpp_rows), ("humaneval", humaneval_rows)])
def test_real_records_reference_solutions_score_1(reward, kind, convert):
    rows = convert(str(FIXTURES / f"{kind}.jsonl"))
    assert len(rows) == 7 and all(r["entry_point"] for r in rows)
    columns = {k: [r[k] for r in rows] for k in ("tests", "test_setup", "entry_point")}
    references = [fenced(r["answer"]) for r in rows]
    assert reward([""] * len(rows), references, **columns) == [1.0] * len(rows)
    # the tests call the program: a program that defines only the helpers fails every row
    assert reward([""] * len(rows), [fenced("x = 1\n")] * len(rows), **columns) == [0.0] * 7


# --- right programs that must pass, and test data that must not pay a wrong one ---------------

RIGHT_F = "def f(x):\n    return x + 1\n"
WRONG_F = "def f(x):\n    return 0\n"
NATURALS = "def nat():\n    n = 0\n    while True:\n        yield n\n        n += 1\n"
# (program, tests): a right program and the tests it must pass, whatever it prints, returns
# from the standard library or does at its top level outside what the tests call
RIGHT_PROGRAMS = {
    "prints 100 KB while the tests call it": (
        "def f(x):\n    print('.' * 1000)\n    return x + 1\n",
        ["for i in range(100):\n    assert f(i) == i + 1\n"],
    ),
    "tests that print their own success": (RIGHT_F, ["assert f(1) == 2\nprint('All passed!')\n"]),
    # the tests' stderr is discarded as their stdout is, not counted against the run's output
    "tests that print 100 KB to stderr, and warn": (
        RIGHT_F,
        [
            "import sys, warnings\nprint('x' * 100000, file=sys.stderr)\n"
            "for i in range(2000):\n    warnings.warn_explicit('w' * 40, UserWarning, 'x.py', i)\n"
            "assert f(1) == 2\n"
        ],
    ),
    "a unittest run that reports at length on stderr": (
        RIGHT_F,
        [
            "import unittest\nclass T(unittest.TestCase):\n"
            + "".join(
                f"    def test_{i}(self):\n        '{'described at length ' * 100}'\n"
                f"        self.assertEqual(f({i}), {i + 1})\n"
                for i in range(50)
            )
            + "unittest.main(verbosity=2)\n"
        ],
    ),
    "a Counter compared with a dict": (
        "import collections\ndef freq(xs):\n    return collections.Counter(xs)\n",
        [
            "assert freq([1, 1, 2]) == {1: 2, 2: 1}",
            "assert freq('aab').most_common(1) == [('a', 2)]",
        ],
    ),
    "an OrderedDict and a defaultdict": (
        "from collections import OrderedDict, defaultdict\n"
        "def index(xs):\n    d = defaultdict(list)\n    for i, x in enumerate(xs):\n"
        "        d[x].append(i)\n    return d\n"
        "def ordered(xs):\n    return OrderedDict((x, 1) for x in xs)\n",
        [
            "assert index('aba') == {'a': [0, 2], 'b': [1]}",
            "assert index('a')['z'] == []",
            "assert list(ordered('ba')) == ['b', 'a'] and ordered('ba') == {'a': 1, 'b': 1}",
        ],
    ),
    "a deque, a Fraction, a Decimal and a range": (
        "from collections import deque\nfrom fractions import Fraction\nfrom decimal import Decimal\n"
        "def last(xs, n):\n    return deque(xs, maxlen=n)\n"
        "def half():\n    return Fraction(1, 2)\n"
        "def cost():\n    return Decimal('1.10')\n"
        "def upto(n):\n    return range(n)\n",
        [
            "assert list(last([1, 2, 3], 2)) == [2, 3] and last([1, 2, 3], 2).maxlen == 2",
            "assert half() == 0.5 and half().denominator == 2",
            "assert cost() + cost() == Decimal('2.20')",
            "assert len(upto(3)) == 3 and list(upto(3)) == [0, 1, 2]",
        ],
    ),
    "a namedtuple compared with a tuple": (
        "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\n"
        "def origin():\n    return Point(0, 0)\n"
        "def points():\n    return [Point(1, 2), Point(3, 4)]\n",
        ["assert origin() == (0, 0)", "assert points() == [(1, 2), (3, 4)]"],
    ),
    "a namedtuple's fields read both ways": (
        "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\n"
        "def mid(a, b):\n    return Point((a.x + b.x) / 2, (a.y + b.y) / 2)\n",
        [
            "from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
            "p = mid(P(0, 0), P(2, 4))\nassert p.x == 1 and p.y == 2 and p == (1, 2)"
        ],
    ),
    "dates, times and durations both ways": (
        "import datetime\ndef next_day(d):\n    return d + datetime.timedelta(days=1)\n"
        "def parse(s):\n    return datetime.datetime.fromisoformat(s)\n"
        "def gap(a, b):\n    return b - a\n"
        "def noon():\n    return datetime.time(12)\n",
        [
            "import datetime as dt\nassert next_day(dt.date(2024, 2, 28)) == dt.date(2024, 2, 29)",
            "import datetime as dt\nassert parse('2024-02-29T10:30') == dt.datetime(2024, 2, 29, 10, 30)",
            "import datetime as dt\nassert next_day(dt.datetime(2024, 1, 1, 5)).day == 2\n"
            "assert gap(dt.date(2024, 1, 1), dt.date(2024, 1, 3)) == dt.timedelta(days=2)\n"
            "assert noon() == dt.time(12)",
        ],
    ),
    "its functions' names and docstrings, and attributes named as the judge's": (
        "import functools\n"
        "def logged(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a)\n"
        "    return inner\n"
        "@logged\ndef square(x):\n    'The square of x.'\n    return x * x\n"
        "def bare(x):\n    return x\n"
        "class Box:\n    def __init__(self):\n        self._link, self._ref = 'a', 'b'\n",
        [
            "assert square.__name__ == 'square' and square.__qualname__ == 'square'",
            "assert square.__doc__ == 'The square of x.' and bare.__doc__ is None",
            "b = Box()\nassert (b._link, b._ref) == ('a', 'b')",
        ],
    ),
    "isinstance and issubclass with the program's classes": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n"
        "class Queue(Stack):\n    pass\n"
        "def make():\n    return Queue()\n",
        [
            "s = Stack()\nassert isinstance(s, Stack) and not isinstance(s, Queue)",
            "assert isinstance(make(), (int, Stack)) and issubclass(Queue, Stack)",
            "assert not isinstance(3, Stack) and not issubclass(Stack, Queue)",
        ],
    ),
    "lists of deques, OrderedDicts and Counters, many times over, both ways": (
        "from collections import deque, OrderedDict\n"
        "def prefixes(n):\n    return [deque(range(i)) for i in range(n)]\n"
        "def tagged(n):\n    return [OrderedDict([(i, i)]) for i in range(n)]\n"
        "def sizes(ds):\n    return [sum(d.values()) for d in ds]\n",
        [
            "from collections import deque\nfor n in range(1, 40):\n"
            "    assert prefixes(n) == [deque(range(i)) for i in range(n)], n",
            "from collections import OrderedDict\nfor n in range(1, 40):\n"
            "    assert tagged(n) == [OrderedDict([(i, i)]) for i in range(n)], n",
            "from collections import Counter\nfor n in range(1, 40):\n"
            "    assert sizes([Counter('x' * i) for i in range(n)]) == list(range(n)), n",
        ],
    ),
    "an instance probed for a name it lacks": (
        "import functools\nclass Scale:\n    def __call__(self, x):\n        return 2 * x\n"
        "scale = Scale()\n",
        [
            "assert not hasattr(scale, '__name__') and getattr(scale, '__qualname__', 'n') == 'n'",
            "import functools\nwrapped = functools.wraps(scale)(lambda x: scale(x))\n"
            "assert wrapped(2) == 4",
        ],
    ),
    "a builtin type or function as an argument or a result (MBPP's remove_datatype)": (
        "def remove_datatype(xs, data_type):\n    return [e for e in xs if not isinstance(e, data_type)]\n"
        "def kind(x):\n    return type(x)\n"
        "def apply(f, xs):\n    return [f(x) for x in xs]\n",
        [
            "assert remove_datatype((4, 5, 4, 7.7, 1.2), int) == [7.7, 1.2]",
            "assert kind(3) is int and kind('a') is str",
            "assert apply(len, ['ab', 'c']) == [2, 1] and apply(abs, [-1]) == [1]",
        ],
    ),
    "an infinite generator read in part": (
        NATURALS,
        [
            "import itertools\nassert list(itertools.islice(nat(), 3)) == [0, 1, 2]",
            "g = nat()\nassert next(g) == 0 and next(g) == 1",
            "for n in nat():\n    if n == 4:\n        break\nelse:\n    assert False",
        ],
    ),
    "a finite generator read whole": (
        "def squares(n):\n    for i in range(n):\n        yield i * i\n",
        ["assert list(squares(3)) == [0, 1, 4] and sum(squares(2001)) == 2668667000"],
    ),
    "exits at its top level after defining f": (
        RIGHT_F + "import sys\nsys.exit(0)\n",
        ["assert f(1) == 2"],
    ),
    "a demo block that reads stdin": (
        RIGHT_F + "if __name__ == '__main__':\n    print(f(int(input())))\n",
        ["assert f(1) == 2"],
    ),
    "a view of a dict's keys or items": (
        "def keys(d):\n    return d.keys()\n"
        "def items(d):\n    return d.items()\n"
        "def values(d):\n    return d.values()\n",
        [
            "assert keys({1: 2, 3: 4}) == {1, 3} and keys({'a': 1}) == {'a': 5}.keys()",
            "assert items({1: 2}) == {(1, 2)} and 1 in keys({1: 2}) and len(keys({})) == 0",
            "assert sorted(values({1: 2, 3: 4})) == [2, 4]",
        ],
    ),
    "an IntEnum or a str Enum member, alone or in a list": (
        "import enum\n"
        "class Color(enum.IntEnum):\n    RED = 1\n    GREEN = 2\n"
        "class Unit(str, enum.Enum):\n    METER = 'm'\n"
        "def pick(x):\n    return Color.GREEN if x else Color.RED\n"
        "def both():\n    return [Color.RED, Color.GREEN]\n"
        "def unit():\n    return Unit.METER\n",
        [
            "assert pick(1) == 2 and 2 == pick(1) and pick(0) != 2 and pick(0) < pick(1)",
            "assert pick(1) == Color.GREEN and pick(1) is Color.GREEN and pick(1).name == 'GREEN'",
            "assert both() == [1, 2] and {pick(1): 'g'}[2] == 'g' and isinstance(pick(1), Color)",
            "assert unit() == 'm' and unit() == Unit.METER",
        ],
    ),
    "subclasses of list, tuple, dict, set and frozenset compared with their contents": (
        "class Row(list):\n    def total(self):\n        return sum(self)\n"
        "class Pair(tuple):\n    pass\n"
        "class Table(dict):\n    pass\n"
        "class Bag(set):\n    pass\n"
        "class Frozen(frozenset):\n    pass\n"
        "def row(n):\n    return Row(range(n))\n"
        "def rows(n):\n    return [Row(range(i)) for i in range(n)]\n"
        "def pair(a, b):\n    return Pair((a, b))\n"
        "def table(n):\n    return Table({i: str(i) for i in range(n)})\n"
        "def bag(xs):\n    return Bag(xs)\n"
        "def frozen(xs):\n    return Frozen(xs)\n",
        [
            "r = row(3)\nassert r == [0, 1, 2] and [0, 1, 2] == r and r != [0] and r.total() == 3",
            "r = row(2)\nr.append(5)\n"
            "assert r == [0, 1, 5] and r < [0, 2] and rows(3) == [[], [0], [0, 1]]",
            "assert pair(1, 2) == (1, 2) and {pair(1, 2): 'p'}[(1, 2)] == 'p'\n"
            "assert (1, 2) in {pair(1, 2)} and pair(1, 2) in {(1, 2)}",
            "assert table(2) == {0: '0', 1: '1'} and bag([1, 1, 2]) == {1, 2}",
            "assert frozen([3]) == frozenset([3]) and frozen([3]) == {3}",
            "assert 2 in row(3) and 5 not in row(3) and 0 in table(1) and not row(0)",
        ],
    ),
    "instances of a built-in type's subclass: isinstance, and its methods": (
        "import collections, enum\n"
        "class Row(list):\n    pass\n"
        "class Sorted(list):\n    def append(self, x):\n        super().append(x)\n"
        "        self.sort()\n"
        "class Table(dict):\n    pass\n"
        "class Color(enum.IntEnum):\n    RED = 1\n"
        "class Unit(str, enum.Enum):\n    METER = 'm'\n"
        "class Token(collections.namedtuple('Token', 'text index')):\n"
        "    def width(self):\n        return len(self.text)\n"
        "def row(n):\n    return Row(range(n))\n"
        "def ordered(*xs):\n    return Sorted(xs)\n"
        "def table(n):\n    return Table({i: str(i) for i in range(n)})\n"
        "def red():\n    return Color.RED\n"
        "def unit():\n    return Unit.METER\n"
        "def word():\n    return Token('aa', 3)\n"
        "class Half(float):\n    pass\n"
        "def half(x):\n    return Half(x / 2)\n",
        [
            "assert isinstance(row(2), list) and row(2) == [0, 1]",
            "assert not isinstance(row(2), (dict, tuple)) and type(row(2)) is not list",
            "from collections.abc import Sequence\nassert isinstance(row(1), Sequence)",
            "assert isinstance(red(), int) and not isinstance(red(), str) and red() == 1",
            "assert row(3).count(1) == 1 and row(3).index(2) == 2 and row(2).copy() == [0, 1]",
            "r = ordered(5, 1)\nr.append(3)\nassert r == [1, 3, 5] and r.index(5) == 2",
            "assert table(2).get(1) == '1' and table(2).keys() == {0, 1}",
            "assert unit().upper() == 'M' and red().bit_length() == 1",
            "assert word().index == 3 and word().count('aa') == 1 and word().width() == 2",
            "assert abs(half(3) - 1.5) < 1e-9 and abs(1.5 - half(3)) < 1e-9 and 2 * half(1) == 1",
            "assert round(half(3), 0) == 2 and f'{half(3):.2f}' == '1.50' and round(half(3)) == 2",
            "assert red() + 1 == 2 and -red() == -1\n"
            "assert row(1) + [5] == [0, 5] and [5] + row(1) == [5, 0]",
        ],
    ),
    "named tuples with methods of their own": (
        "from collections import namedtuple\nfrom typing import NamedTuple\n"
        "class Pair(namedtuple('Pair', 'x y')):\n"
        "    def total(self):\n        return self.x + self.y\n"
        "class Span(NamedTuple):\n    lo: int\n    hi: int = 0\n"
        "    @property\n    def width(self):\n        return self.hi - self.lo\n"
        "def pair(x):\n    return Pair(x, x + 1)\n"
        "def span(x):\n    return Span(x, 2 * x)\n",
        [
            "p = pair(1)\nassert p == (1, 2) and p == Pair(1, 2) and p.total() == 3 and p.x == 1",
            "assert span(2) == (2, 4) and span(2).width == 2 and [span(1)] == [(1, 2)]",
        ],
    ),
    "dataclass instances compared with those the tests make": (
        "from dataclasses import dataclass, field\n"
        "@dataclass\nclass Point:\n    x: int\n    y: int = 0\n"
        "@dataclass(frozen=True)\nclass Line:\n    a: Point\n    b: Point\n"
        "    label: str = field(default='', compare=False)\n"
        "def mid(p, q):\n    return Point((p.x + q.x) // 2, (p.y + q.y) // 2)\n"
        "def line(p, q):\n    return Line(p, q, 'drawn')\n"
        "def points(n):\n    return [Point(i, i) for i in range(n)]\n",
        [
            "assert mid(Point(0, 0), Point(2, 4)) == Point(1, 2)\n"
            "assert Point(1) == mid(Point(2), Point(0))",
            "assert not mid(Point(0, 0), Point(2, 4)) == Point(x=1, y=3)",
            "assert points(2) == [Point(0, 0), Point(1, y=1)]",
            "p, q = Point(0, 0), Point(1, 1)\nassert line(p, q) == Line(p, q)",
        ],
    ),
    "objects of the program's hashed, in sets and as keys": (
        "class Node:\n    pass\ndef nodes(n):\n    return [Node() for _ in range(n)]\n",
        [
            "a, b = nodes(2)\nassert hash(a) == hash(a) and len({a, b, a}) == 2",
            "a, b = nodes(2)\nseen = {a: 1}\nassert seen[a] == 1 and seen.get(b) is None",
        ],
    ),
}


@pytest.mark.parametrize(("program", "tests"), RIGHT_PROGRAMS.values(), ids=RIGHT_PROGRAMS.keys())
def test_a_right_program_passes_whatever_else_it_does(reward, program, tests):
    assert reward(["p"], [fenced(program)], tests=[tests]) == [1.0]


def test_a_stdin_stdout_program_may_write_to_stderr(reward):
    program = "import sys\nx = int(input())\nsys.stderr.write('debug ' * 20000)\nprint(x * 2)\n"
    assert reward(["p"], [fenced(program)], tests=[[{"input": "3", "output": "6"}]]) == [1.0]


def test_the_reference_counter_of_mbpp_task_88_scores_1(tmp_path, reward):
    record = {
        "task_id": 88,
        "text": "Write a function to get the frequency of the elements in a list.",
        "code": "import collections\ndef freq_count(list1):\n  freq_count= collections.Counter(list1)\n  return freq_count",
        "test_list": [
            "assert freq_count([10,10,10,10,20,20,20,20,40,40,50,50,30])==({10: 4, 20: 4, 40: 2, 50: 2, 30: 1}) ",
            "assert freq_count([1,2,3,4,3,2,4,1,3,1,4])==({1:3, 2:2,3:3,4:3}) ",
        ],
        "test_setup_code": "",
    }
    (row,) = mbpp_rows(_write(tmp_path / "mbpp.jsonl", [record]))
    columns = {k: [row[k]] for k in ("tests", "test_setup", "entry_point")}
    assert reward([""], [fenced(row["answer"])], **columns) == [1.0]
    wrong = "import collections\ndef freq_count(xs):\n  return collections.Counter(xs[1:])\n"
    assert reward([""], [fenced(wrong)], **columns) == [0.0]


# (tests, entry point): test data under which a wrong program must score 0 and a right one 1,
# or, where the tests never call the program, every program 0
GUARDED_CHECK = "def check(c):\n    assert c(1) == 2\nif __name__ == '__main__':\n    check(f)\n"
UNITTEST_MAIN = (
    "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
    "        self.assertEqual(f(1), 2)\nif __name__ == '__main__':\n    unittest.main()\n"
)
NEVER_CALLED = {
    "check() never called": ("def check(candidate):\n    assert candidate(1) == 2\n", "f"),
    "a helper that is no test": ("def helper_f():\n    assert f(1) == 2\n", None),
}


@pytest.mark.parametrize("tests", [GUARDED_CHECK, UNITTEST_MAIN], ids=["check", "unittest"])
def test_tests_run_as_the_main_script(reward, tests):
    scores = reward(["p"] * 2, [fenced(WRONG_F), fenced(RIGHT_F)], tests=[[tests]] * 2)
    assert scores == [0.0, 1.0]


@pytest.mark.parametrize(("tests", "entry"), NEVER_CALLED.values(), ids=NEVER_CALLED.keys())
def test_tests_that_never_call_the_program_pay_nothing(reward, tests, entry):
    programs = [fenced(WRONG_F), fenced("pass\n"), fenced(RIGHT_F)]
    scores = reward(
        ["p"] * 3, programs, tests=[[tests, "assert f(1) == 2"]] * 3, entry_point=[entry] * 3
    )
    assert scores == [0.0, 0.0, 0.5]


def test_a_plain_value_of_the_program_read_by_the_tests_is_a_use(reward):
    assert reward(["p"], [fenced("LIMIT = 7\n")], tests=[["assert LIMIT == 7"]]) == [1.0]
    assert reward(["p"], [fenced("LIMIT = 6\n")], tests=[["assert LIMIT == 7"]]) == [0.0]


def test_blank_test_items_are_not_cases():
    assert parse_tests(["  ", "", "assert f(1) == 2"]) == [Case(code="assert f(1) == 2")]
    assert parse_tests(["\n"]) == []
    assert CodeTestsReward(workers=1)(["p"], [fenced(WRONG_F)], tests=[["  "]]) == [None]


def test_an_entry_point_bound_to_a_module_fails_and_binding_a_name_is_no_use(reward):
    tests = [
        "METADATA = {}\n\ndef check(candidate):\n    assert candidate([3, 9, 2]) == 9\n\n"
        "check(max)\n"
    ]
    right = "def max(xs):\n    best = xs[0]\n    for x in xs:\n        best = x if x > best else best\n    return best\n"
    programs = [right, "import os as max\ncheck = 0\n", "import os as max\nMETADATA = 1\n"]
    scores = reward(
        ["p"] * 3, [fenced(p) for p in programs], tests=tests * 3, entry_point=["max"] * 3
    )
    assert scores == [1.0, 0.0, 0.0]
    # a value of the program's that the tests bind before they read it is not a use of it
    assert reward(["p"], [fenced("x = 0\n")], tests=[["x = 1\nassert x == 1\n"]]) == [0.0]


def test_a_program_object_iterated_twice_starts_again(reward):
    program = (
        "class Again:\n    def __iter__(self):\n        self.i = 0\n        return self\n"
        "    def __next__(self):\n        self.i += 1\n        if self.i > 3:\n"
        "            raise StopIteration\n        return self.i\n"
        "def make():\n    return Again()\n"
    )
    tests = [["r = make()\nassert list(r) == [1, 2, 3] and list(r) == [1, 2, 3]"]]
    assert reward(["p"], [fenced(program)], tests=tests) == [1.0]


def test_a_generators_error_is_kept_when_the_tests_iterate_it_again(reward):
    right = "def gen():\n    yield 1\n    yield 2\n"
    wrong = right + "    raise ValueError('boom')\n"
    tests = [["g = gen()\nassert next(g) == 1 and next(g) == 2\nassert list(g) == []"]]
    assert reward(["p"] * 2, [fenced(right), fenced(wrong)], tests=tests * 2) == [1.0, 0.0]


def test_a_generators_items_are_made_when_the_tests_ask_for_them(reward):
    program = (
        "log = []\ndef gen():\n    for i in range(10):\n        log.append(i)\n        yield i\n"
        "def seen():\n    return list(log)\n"
    )
    tests = [["g = gen()\na, b = next(g), next(g)\nassert seen() == [0, 1]"]]
    assert reward(["p"], [fenced(program)], tests=tests) == [1.0]


USES = {  # tests that read the program's value before they bind the name, or elsewhere
    "a class attribute of the same name": "assert ANSWER == 42\nclass C:\n    ANSWER = 1\n",
    "read, then rebound": "assert ANSWER == 42\nANSWER = 0\n",
    "a loop variable after": "assert ANSWER == 42\nfor ANSWER in range(2):\n    pass\n",
    "inside a function": "def check():\n    assert ANSWER == 42\ncheck()\n",
}


@pytest.mark.parametrize("tests", USES.values(), ids=USES.keys())
def test_a_value_the_tests_read_before_binding_it_is_a_use(reward, tests):
    assert reward(["p"], [fenced("ANSWER = 42\n")], tests=[[tests]]) == [1.0]


def test_an_attribute_error_of_the_programs_is_its_failure(reward):
    tests = [
        "a = Account(10)\nassert a.balance == 10\ntry:\n    a.withdraw(100)\n"
        "except Exception:\n    pass\nelse:\n    assert False"
    ]
    right = (
        "class Account:\n    def __init__(self, b):\n        self.balance = b\n"
        "    def withdraw(self, n):\n        if n > self.balance:\n"
        "            raise ValueError('too much')\n        self.balance -= n\n"
    )
    forge = (
        "class Account:\n    def __init__(self, b):\n        self.balance = b\n"
        "    @property\n    def withdraw(self):\n        raise AttributeError('withdraw')\n"
    )
    # the right program's ValueError is the tests' to catch; the forge's AttributeError, which
    # `getattr` and `hasattr` take for a missing attribute, fails its case
    assert reward(["p"] * 2, [fenced(right), fenced(forge)], tests=[tests] * 2) == [1.0, 0.0]


def test_a_unittest_failure_fails_the_case_however_unittest_is_run(reward):
    tests = [
        "import unittest\nclass T(unittest.TestCase):\n    def test(self):\n"
        "        self.assertEqual(f(1), 2)\nunittest.main(exit=False)\n"
    ]
    scores = reward(["p"] * 2, [fenced(WRONG_F), fenced(RIGHT_F)], tests=[tests] * 2)
    assert scores == [0.0, 1.0]


def test_an_entry_point_the_program_does_not_define_fails(reward):
    tests = [["assert sorted([3, 1, 2]) == [1, 2, 3]"]]
    assert reward(["p"], [fenced("pass\n")], tests=tests, entry_point=["sorted"]) == [0.0]
