"""verifiers environments as the hub's are written (a module with `load_environment`), on
local data: `single` asks a sum in one turn, `multi` asks again after the first answer; the
rubric pays an answer holding the sum, and a group-wise part pays the group's longest answer."""

from __future__ import annotations

# (no spaces: the tiny test model's character tokenizer has none)
QUESTIONS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in
             [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (4, 5)]]  # fmt: skip
FOLLOW_UP = "Again:"


def load_environment(kind: str = "single", eval_rows: int = 0):
    """The `kind` ("single", "multi", "down": "multi" whose second turn fails on its
    infrastructure, "long": "multi" whose message before the second turn is longer than the
    model's context, or "tools": a ToolEnv) environment; its eval dataset the first
    `eval_rows` questions (none when 0)."""
    import verifiers as vf
    from datasets import Dataset

    def last_answer(completion) -> str:  # an empty answer ends the rollout with no message
        return completion[-1].content if completion else ""

    def has_answer(completion, answer, **_) -> float:
        return float(answer in last_answer(completion))

    def longest_in_group(completions) -> list[float]:
        lengths = [len(last_answer(c)) for c in completions]
        return [float(n == max(lengths)) for n in lengths]

    rubric = vf.Rubric(funcs=[has_answer, longest_in_group], weights=[1.0, 0.5])
    data = Dataset.from_list(QUESTIONS)
    held_out = Dataset.from_list(QUESTIONS[:eval_rows]) if eval_rows else None
    if kind == "single":
        return vf.SingleTurnEnv(
            dataset=data, eval_dataset=held_out, rubric=rubric, system_prompt="Answer briefly."
        )
    if kind == "tools":

        def add(a: int, b: int) -> int:
            """Adds two integers.

            Args:
                a: the first
                b: the second
            """
            return a + b

        return vf.ToolEnv(dataset=data, tools=[add], rubric=rubric, max_turns=3)

    class AskAgain(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **_):
            if kind == "down":
                raise vf.InfraError("the tool server is down")
            if kind == "long":  # a search result, say, of 5000 tokens
                return [vf.UserMessage(content=" word" * 5000)]
            return [vf.UserMessage(content=FOLLOW_UP)]

    return AskAgain(dataset=data, eval_dataset=held_out, rubric=rubric, max_turns=2)
