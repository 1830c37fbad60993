"""Built-in environments for multi-turn rollouts (`rollout.env`); the protocol is
`oncurve.rollout.episodes.Environment`, and docs/environments.md shows how to write one."""

from __future__ import annotations

from oncurve.envs.libraries import GemEnv, TextArenaGame
from oncurve.envs.openenv_client import OpenEnvSession
from oncurve.envs.python_tool import PythonToolEnv

ENVIRONMENTS = {"python_tool": PythonToolEnv}
# `rollout.env` prefixes -> the adapter class, built with what follows the prefix (an id, a URL)
LIBRARIES = {"textarena": TextArenaGame, "gem": GemEnv, "openenv": OpenEnvSession}

__all__ = ["ENVIRONMENTS", "LIBRARIES", "OpenEnvSession", "PythonToolEnv"]
