"""Errors the command line reports as one line with exit code 2 (the user's input is wrong)."""


class UserError(ValueError):
    """Bad input from the user: a config value, a path, a data file, a reward import path."""


class TrainingError(RuntimeError):
    """The run cannot go on (repeated non-finite updates, no informative group to train on);
    the command line prints its one line and exits 1."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (disk full, unwritable directory).

    The previous checkpoint and the `latest` pointer are left as they were.
    """


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message; its type's name when it has none."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def error_line(error: BaseException) -> str:
    """`Type: first line` of `error`, for a one-line warning; for torch's compiler wrapper
    (`BackendCompilerFailed`, whose first line only names the backend), its inner error's."""
    inner = getattr(error, "inner_exception", None)
    if isinstance(inner, BaseException):
        error = inner
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
