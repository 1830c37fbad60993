"""`python_tool`: the policy may run Python in the sandbox before it answers.

A turn with a ```python fenced block is a tool call (a block tagged otherwise, or not at all, is
not): the block runs in `oncurve.sandbox` and its output comes back as the next message: the
last 2,000 characters of stdout, and when it failed a `[status: reason]` line and the last
1,000 characters of stderr. A turn without one is the final answer, scored as the
`correct` reward scores it: 1.0 when its answer (`extract_answer`: the last `\\boxed{}`, else
the last number) strictly matches the row's "answer" without restating the row's prompt
(`answers_match`), else 0.0; NaN (unscored) for a row without a usable answer (`usable_gold`).
An episode that runs out of turns while still calling the tool scores 0.0.
"""

from __future__ import annotations

import math
from typing import Any

from oncurve.rewards.code import extract_program
from oncurve.rewards.extraction import extract_answer
from oncurve.rewards.matching import answers_match, usable_gold
from oncurve.sandbox import check_isolation, run_python

INSTRUCTIONS = (
    "\n\nYou can run Python: write a ```python code block and end your turn, and its output "
    "comes back. When you know the answer, reply without a code block and put the final "
    "answer in \\boxed{}."
)
# What comes back of a long output: enough for an answer, not a flood of tokens. Each stream
# has its own budget, so a long traceback cannot push out what the program printed.
_STDOUT_CHARS = 2000
_STDERR_CHARS = 1000


class PythonToolEnv:
    """One episode of the Python tool; see the module docstring.

    Args:
        timeout_s: wall-clock limit of one tool call.
        memory_mb: address-space limit of one tool call.
        instructions: appended to the row's prompt in the first message.
    """

    def __init__(
        self, timeout_s: float = 5.0, memory_mb: int = 512, instructions: str = INSTRUCTIONS
    ) -> None:
        self.timeout_s, self.memory_mb, self.instructions = timeout_s, memory_mb, instructions
        # probed once per process: the first episode (built at the start of a run to check
        # rollout.env_args) warns then when the machine's isolation is weaker than full
        check_isolation()
        self.answer: str | None = None
        self.prompt = ""
        self.calls = 0

    def reset(self, row: dict[str, Any]) -> str:
        self.answer = usable_gold(row.get("answer"))
        self.prompt = row["prompt"]
        return row["prompt"] + self.instructions

    def step(self, turn: str) -> tuple[str | None, float, bool]:
        program = extract_program(turn, python_only=True)  # a ```text block is no tool call
        if program is None:
            if self.answer is None:
                return None, math.nan, True
            try:
                right = answers_match(extract_answer(turn), self.answer, prompt=self.prompt)
            except TimeoutError:  # math-verify ran past its bound: no answer it could confirm
                right = False
            return None, 1.0 if right else 0.0, True
        self.calls += 1
        result = run_python(program, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        output = result.stdout[-_STDOUT_CHARS:]
        if result.status != "ok":
            output += f"\n[{result.status}: {result.reason}]\n{result.stderr[-_STDERR_CHARS:]}"
        return "Output:\n" + output.strip(), 0.0, False
