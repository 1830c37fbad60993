"""The `oncurve` command (the parser and `main` in command.py; each command in its module)."""

from oncurve.cli.command import main

__all__ = ["main"]
