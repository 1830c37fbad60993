"""Errors the command line reports as one line with exit code 2 (the user's input is wrong)."""


class UserError(ValueError):
    """Bad input from the user: a config value, a path, a data file, a reward import path."""


class TrainingError(RuntimeError):
    """The run cannot go on (repeated non-finite updates, no informative group to train on);
    the command line prints its one line and exits 1."""
