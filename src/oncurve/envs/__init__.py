"""Built-in environments for multi-turn rollouts (`rollout.env`); the protocol is
`oncurve.rollout.episodes.Environment`, and docs/environments.md shows how to write one."""

from __future__ import annotations

from oncurve.envs.python_tool import PythonToolEnv

ENVIRONMENTS = {"python_tool": PythonToolEnv}

__all__ = ["ENVIRONMENTS", "PythonToolEnv"]
