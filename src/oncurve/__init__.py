"""oncurve: GRPO on verifiable rewards for Hugging Face causal LMs.

The public API, importable from here: `train(config)` runs a job and returns a `TrainResult`
(`train(config, model=..., reward_funcs=[...], train_dataset=..., eval_dataset=...)` takes
the model, reward functions and datasets as TRL's `GRPOTrainer` takes them; `config` may be a
YAML file's path);
`load_config(path, overrides)` builds its `Config` (YAML plus dotted overrides, validated);
`TorchSampler` and `SamplingParams` sample groups of completions from any causal LM. Each is
imported on first use, so that `import oncurve` (and the CLI's `--help`) does not pay for
importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncurve.config import Config, load_config
    from oncurve.loop.trainer import TrainResult, train
    from oncurve.rollout import SamplingParams, TorchSampler

__version__ = "0.1.0"

_HOMES = {
    "Config": "oncurve.config",
    "load_config": "oncurve.config",
    "SamplingParams": "oncurve.rollout",
    "TorchSampler": "oncurve.rollout",
    "TrainResult": "oncurve.loop.trainer",
    "train": "oncurve.loop.trainer",
}

__all__ = ["Config", "SamplingParams", "TorchSampler", "TrainResult", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'oncurve' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
