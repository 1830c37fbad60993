"""The `code_tests` reward: run the program a completion writes against the row's test cases.

The program is the last fenced ```python block of the completion (```py and ```python3 count
too), else its last fenced block of any language. A completion without one, or whose program
does not compile, or whose program is longer than `MAX_PROGRAM_CHARS` (which is never
compiled here), scores 0.0 without running anything. The `tests` column holds the test cases
in either common form:

- stdin/stdout: a list of {"input": str, "output": str}; the program reads the input on stdin
  and passes when it exits cleanly and its stdout gives the output as judges' usual checkers
  read it (`same_output`: line by line, each line's tokens however spaced, a number with a
  fraction printed to other digits; its stderr is discarded). The sandbox stops it once its
  stdout passes four times the expected output's UTF-8 bytes (at least the sandbox's
  `OUTPUT_LIMIT`, 64 KiB; at most `FILE_SIZE_LIMIT`, 16 MiB, so an expected output over 4 MiB
  can be too long to pass);
- assert-style: a string of Python test code (HumanEval's `test` followed by
  `check(<entry_point>)`; KodCode's pytest file, which imports the program as `solution`), or a
  list of them (MBPP's `test_list`). Each case runs under a
  harness (`_harness.py`): the program in one process, the tests in another, as the main script,
  that calls the program's functions through a pipe, with arguments and results by value as
  exact built-in types (and a few standard-library types, named tuples and dates among them,
  rebuilt from their contents; builtin types and functions by name), and evaluates every
  comparison and assert on its side. A case passes when that side, having used the program,
  prints a secret made for the run, which the program never sees; so no early exit, exit hook,
  always-equal object, patched builtin or printed verdict passes it, and no test that never
  calls the program pays. An object of the program's that is not plain data comes back as a
  reference: the tests may call it, read and set its attributes, iterate it, pass it back and
  take its `len`, `str`, `repr`, `format`, items, `hash`, `abs`, `round`, `int` and `float`, but
  it equals only itself (one object, however often it comes back), has no truth value, and an
  operator that would judge for the tests (`==` with a value of the tests', `!=`, `<`, `in`, a
  set's or a dict's too, arithmetic) fails the case; except that an instance of a subclass of
  `int`, `float`, `complex`, `str` or `bytes` (an IntEnum's member) compares (`==`, `!=`,
  `<`, ...), hashes, is true or false, answers `in`, takes arithmetic and answers its built-in
  type's reading methods (`startswith`, `count`, `get`) as its built-in value, and a `list`, `tuple`, `dict`, `set` or
  `frozenset` of the program's objects, or of a subclass of one (a named tuple only where its
  class has methods of its own: else it arrives as one), as the contents it holds then (its
  objects compared by these rules), whatever its own methods say, either an instance of that
  built-in type to `isinstance`; and an instance of a
  dataclass (with the `==` that `dataclasses` writes) equals another of its class when their
  compared fields are equal and one of the two was made by the tests, with arguments that
  compared fields of its hold (no `__post_init__` made them other). A dict's `keys()` and
  `items()` views arrive as views, which compare as sets. The lists, dicts and sets a call is
  given (deques, Counters, OrderedDicts and defaultdicts too) are the tests' own: what the
  program does to them in place the tests see, and one it returns is their object.

  A verdict depends only on what the program does when the tests call it. The tests see the
  real builtins and standard modules whatever names the program defines; the optional
  `test_setup` column (MBPP's setup code, HumanEval's prompt without the function to write)
  runs after the program in its process and again on the tests' side, so the helpers the tests
  call are the dataset's; the optional `entry_point` column names the function the tests call,
  which is the program's even where it shadows a builtin. Names the tests bind never reach the
  program. An exception the program raises reaches the tests as the same builtin class, for
  them to expect or not, except StopIteration, AttributeError and any that is not an Exception,
  which Python's protocols could take for a signal: those fail the case. A pytest file's tests
  run as pytest runs them (`_pytest_style.py`, a stand-in for the part of pytest such files use:
  the sandbox has the standard library only).

Each case is its own sandboxed run (`oncurve.sandbox`, each limited by `reward.sandbox_timeout_s`
and `reward.sandbox_memory_mb`), so a timeout or a crash fails that case alone. The score is the
fraction of the row's cases passed; a row without tests (None, "" or []) scores None. A call's
runs go through a pool of `reward.sandbox_workers` threads, each waiting on one child process;
identical runs (same program, same case) within a call run once.

The reward runs in the trainer's process (`runs_in_process`): each program already runs in a
child process that the sandbox stops at its timeout, so `reward.timeout`'s forked worker would
only add a fork. The settings reach it through `configure(reward_config)`, which
`data.prompts.build_rewards` calls at the start of a run on every reward that has that hook; that is
also when the sandbox checks its isolation and says, once, if it is weaker than full.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oncurve import sandbox
from oncurve.errors import UserError

if TYPE_CHECKING:
    from oncurve.config import RewardConfig

PYTHON_TAGS = ("python", "py", "python3")
# A completion's worth of code: the trainer compiles no more than this of a model's text (a
# long comparison chain costs the compiler time and memory in proportion).
MAX_PROGRAM_CHARS = 64 * 1024
_HARNESS = Path(__file__).with_name("_harness.py").read_text()
_PYTEST_STYLE = Path(__file__).with_name("_pytest_style.py").read_text()
# A stdin/stdout case runs the program as the main module with its stderr discarded: only its
# stdout is judged, and its debugging output must not reach the sandbox's output limit.
_STDOUT_ONLY = (
    "import os, sys, types\n"
    "null = os.open(os.devnull, os.O_WRONLY)\n"
    "os.dup2(null, 2)\n"
    "os.close(null)\n"
    "main = types.ModuleType('__main__')\n"
    "main.__file__ = 'main.py'\n"
    "sys.modules['__main__'] = main\n"
    "exec(compile({program!r}, 'main.py', 'exec'), main.__dict__)\n"
)
# How many times its expected output a stdin/stdout case's program may print: a right program
# spaces its tokens its own way and prints a fraction to other digits (`0.49999999999999994`
# for `0.500000`); a runaway one still stops at a few times the answer's size.
_EXPECTED_ROOM = 4
# A fence's language tag is the rest of its opening line; its block ends at the next fence.
_FENCE_RE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)


def extract_program(completion: str, *, python_only: bool = False) -> str | None:
    """The code of the last ```python block of `completion`, else (unless `python_only`) of its
    last fenced block; None when there is none, or it is blank. With `python_only` (a tool
    call) a blank last block does not hide the code before it."""
    blocks = _FENCE_RE.findall(completion)
    python = [code for tag, code in blocks if tag.strip().lower() in PYTHON_TAGS]
    if python_only:
        python = [code for code in python if code.strip()]
    candidates = python or ([] if python_only else [code for _, code in blocks])
    if not candidates or not candidates[-1].strip():
        return None
    return candidates[-1]


@dataclass(frozen=True)
class Case:
    """One test case: assert-style `code` run after the program, or `stdin` fed to it with the
    `expected` stdout (None for an assert-style case)."""

    code: str = ""
    stdin: str = ""
    expected: str | None = None


def parse_tests(tests: Any) -> list[Case]:
    """The cases of one row's `tests` value (see the module docstring), blank items of a list
    dropped; [] for None, "" or []. UserError for anything else than the two forms."""
    if tests is None:
        return []
    if isinstance(tests, str):
        return [Case(code=tests)] if tests.strip() else []
    if not isinstance(tests, list | tuple):
        raise UserError(
            f"column 'tests' must be a string of test code or a list of test cases, got "
            f"{type(tests).__name__}"
        )
    cases = []
    for i, test in enumerate(tests):
        if isinstance(test, str):
            if test.strip():  # a blank item tests nothing (nor would it fail any program)
                cases.append(Case(code=test))
        elif (
            isinstance(test, dict)
            and isinstance(test.get("input"), str)
            and isinstance(test.get("output"), str)
        ):
            cases.append(Case(stdin=test["input"], expected=test["output"]))
        else:
            raise UserError(
                f"column 'tests' item {i} must be a string of test code or "
                f'{{"input": str, "output": str}}, got {str(test)[:60]!r}'
            )
    return cases


def same_output(printed: str, expected: str) -> bool:
    """Whether a program's stdout gives the expected one, as judges' usual checkers read it:
    line by line (trailing blank lines dropped), each line's whitespace-separated tokens, a
    token the same text, or where the expected one is a number with a fraction or an exponent
    (`0.333333333`, `1.5e3`), a finite number that differs from it as printings of one value
    do (by 1e-7, or 1e-9 of it: `0.3333333333333333`; not `1234567.00` for `1234567.89`, nor
    `0` for `0.000001`); an integer's digits exactly, letters in their case."""

    def lines(text: str) -> list[list[str]]:
        tokens = [line.split() for line in text.splitlines()]
        while tokens and not tokens[-1]:
            tokens.pop()
        return tokens

    got, want = lines(printed), lines(expected)
    return len(got) == len(want) and all(
        len(a) == len(b) and all(map(_same_token, a, b)) for a, b in zip(got, want, strict=True)
    )


def _same_token(got: str, want: str) -> bool:
    if got == want:
        return True
    if not (_FRACTIONAL_RE.fullmatch(want) and _NUMBER_RE.fullmatch(got)):
        return False
    a, b = float(got), float(want)
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-7)


# A printed number, and one with a fraction or an exponent (which a checker reads within a
# tolerance: its last digits are the printing's, not the answer's)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_FRACTIONAL_RE = re.compile(r"[-+]?(?:\d*\.\d+|\d+\.|\d+(?:\.\d*)?[eE][-+]?\d+)")


def compiles(program: str) -> bool:
    """Whether `program` parses as Python of at most `MAX_PROGRAM_CHARS` characters: it runs
    nothing and spares a child process for most broken programs. Only the tree is built, in
    this process: the compiler's constant folding would hold every partial result of
    `'a'*4096 + 'a'*4096 + ...` at once (gigabytes); errors only the compiler finds
    (`return` outside a function) are the sandboxed run's."""
    if len(program) > MAX_PROGRAM_CHARS:
        return False
    try:
        # the compiler warns about odd code (`"a"(1)`); a completion's oddities are no news
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(program, "<completion>", "exec", ast.PyCF_ONLY_AST)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def default_workers() -> int:
    """The CPUs this process may use (its affinity mask where the platform has one), at most
    the sandbox's `MAX_PARALLEL`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cpus or 1, sandbox.MAX_PARALLEL)


class CodeTestsReward:
    """The `code_tests` reward (module docstring): `reward(prompts, completions, tests=[...])`
    -> one fraction of cases passed (or None) per completion. Its pool of sandbox threads is
    built by `configure`, or at the first call."""

    runs_in_process = True  # RewardRunner calls it in the trainer's process (module docstring)
    # evaluation's accuracy is pass@1: a program passing some of its cases is not correct
    correct_at = 1.0

    def __init__(
        self, workers: int | None = None, timeout_s: float = 5.0, memory_mb: int = 512
    ) -> None:
        self.workers = workers or default_workers()
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self._pool: sandbox.SandboxPool | None = None

    def configure(self, reward: RewardConfig) -> None:
        """Take the sandbox settings of the config's `reward` section and build the pool now:
        building it probes the machine's isolation, and the sandbox warns (once) at the start of
        the run, not at the first reward, when that is weaker than full."""
        self.workers = reward.sandbox_workers or default_workers()
        self.timeout_s = reward.sandbox_timeout_s
        self.memory_mb = reward.sandbox_memory_mb
        if self._pool is not None:
            self._pool.close()
        self._pool = sandbox.SandboxPool(self.workers)

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        *,
        tests: list[Any] | None = None,
        test_setup: list[str | None] | None = None,
        entry_point: list[str | None] | None = None,
        **_: Any,
    ) -> list[float | None]:
        if tests is None:
            raise UserError("reward 'code_tests' needs a 'tests' column in the data")
        row_cases = [parse_tests(value) for value in tests]
        setups = _column(test_setup, "test_setup", len(tests))
        entries = _column(entry_point, "entry_point", len(tests))
        programs = [extract_program(completion) for completion in completions]
        # each distinct run's (program, tests, stdin, setup, entry point, stdout limit), and each
        # row's run per case (None: no run)
        runs: dict[tuple[str, str, str, str, str, int], int] = {}
        row_runs: list[list[int] | None] = []
        for program, cases, setup, entry in zip(programs, row_cases, setups, entries, strict=True):
            if not cases or program is None or not compiles(program):
                row_runs.append(None)
                continue
            keys = [(program, c.code, c.stdin, setup, entry, _stdout_bytes(c)) for c in cases]
            row_runs.append([runs.setdefault(key, len(runs)) for key in keys])
        if self._pool is None:
            self._pool = sandbox.SandboxPool(self.workers)
        jobs = [_job(*key[:5]) for key in runs]
        results = self._pool.map(
            [source for source, _, _ in jobs],
            [stdin for _, stdin, _ in jobs],
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            output_bytes=[key[5] for key in runs],
        )
        scores: list[float | None] = []
        for cases, indices in zip(row_cases, row_runs, strict=True):
            if not cases:
                scores.append(None)
            elif indices is None:
                scores.append(0.0)
            else:
                passed = sum(
                    _passed(case, results[i], jobs[i][2])
                    for case, i in zip(cases, indices, strict=True)
                )
                scores.append(passed / len(cases))
        return scores


def _column(values: list[Any] | None, name: str, rows: int) -> list[str]:
    """Column `name` of the rows as text ("" where absent); UserError for any other type, or
    for an entry point that is not a Python name."""
    if values is None:
        return [""] * rows
    texts = []
    for value in values:
        if value is not None and not isinstance(value, str):
            raise UserError(f"column {name!r} must be text, got {type(value).__name__}")
        if name == "entry_point" and value and not value.isidentifier():
            raise UserError(f"column 'entry_point' must be a Python name, got {value[:60]!r}")
        texts.append(value or "")
    return texts


def _stdout_bytes(case: Case) -> int:
    """The stdout a run of `case` may print before the sandbox stops it: `OUTPUT_LIMIT` for an
    assert-style case; for a stdin/stdout case, that or `_EXPECTED_ROOM` times its expected
    output's UTF-8 bytes, whichever is more, at most `FILE_SIZE_LIMIT`."""
    if case.expected is None:
        return sandbox.OUTPUT_LIMIT
    # a prefix as long as the cap is enough to know the cap is reached
    size = len(case.expected[: sandbox.FILE_SIZE_LIMIT].encode("utf-8", "surrogatepass"))
    return min(sandbox.FILE_SIZE_LIMIT, max(sandbox.OUTPUT_LIMIT, _EXPECTED_ROOM * size))


def _job(
    program: str, tests: str, stdin: str, setup: str, entry_point: str
) -> tuple[str, str, str]:
    """(source, stdin, verdict) of one run: a stdin/stdout case runs the program itself; an
    assert-style case runs it under the harness, with the setup code after it, the tests and a
    fresh secret on stdin, and passes only when the harness prints `verdict`."""
    if not tests:
        return _STDOUT_ONLY.format(program=program), stdin, ""
    secret = secrets.token_hex(16)
    source = f"{_HARNESS}\nrun({program!r}, {setup!r})\n"
    job = {
        "secret": secret,
        "tests": tests,
        "setup": setup,
        "entry_point": entry_point or None,
        "pytest": _PYTEST_STYLE,
    }
    return source, json.dumps(job), f"{secret} pass\n"


def _passed(case: Case, result: sandbox.SandboxResult, verdict: str) -> bool:
    if result.status != "ok" or result.returncode != 0:
        return False
    if case.expected is None:
        return result.stdout == verdict
    return same_output(result.stdout, case.expected)


# The one instance that `code_tests`, the `code` task and evaluation share, so that
# `configure` reaches all of them and the runner can tell it is the verifier.
code_tests_reward = CodeTestsReward()
