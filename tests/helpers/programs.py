"""A program as a completion writes it, for the `code_tests` reward's tests."""


def fenced(code: str) -> str:
    """`code` in a ```python block."""
    return f"```python\n{code}```"
