"""Run configuration: nested dataclasses, YAML loading, dotted overrides and validation.

Sections follow the data flow: model, data, rollout, reward, algo, optim, eval, log, run, dist.
Precedence, lowest first: field defaults (a real pretrained model's), the bundled model's own
settings when `model.path` is `default` (`BUNDLED_MODEL_DEFAULTS`), the algorithm preset named
by `algo.preset` (which may set keys of any section), the defaults of the chosen
`algo.estimator`, the YAML file, then command-line overrides (`algo.beta=0.0`). Every field
documents itself through its `help` metadata; `describe()` prints them all. Errors are one line
naming the field; a key that was renamed or moved (`RENAMED`) names its new place.

One module per job: `sections` (the dataclasses and each field's own checks), `presets`,
`loading` (YAML, overrides, coercion), `validation` (checks across fields), `helptext`.
"""

from oncurve.config.helptext import describe
from oncurve.config.loading import (
    RENAMED,
    build_config,
    config_yaml,
    load_config,
    load_run_config,
    save_config,
    to_dict,
    with_model_path,
)
from oncurve.config.presets import BUNDLED_MODEL_DEFAULTS, ESTIMATOR_DEFAULTS, PRESETS
from oncurve.config.sections import (
    AlgoConfig,
    Config,
    DataConfig,
    DistConfig,
    EvalConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardConfig,
    RewardFnConfig,
    RolloutConfig,
    RunConfig,
    TrackioConfig,
    WandbConfig,
)
from oncurve.config.validation import check_cross_fields, check_preset_applied, check_ranks

__all__ = [
    "BUNDLED_MODEL_DEFAULTS",
    "ESTIMATOR_DEFAULTS",
    "PRESETS",
    "RENAMED",
    "AlgoConfig",
    "Config",
    "DataConfig",
    "DistConfig",
    "EvalConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardConfig",
    "RewardFnConfig",
    "RolloutConfig",
    "RunConfig",
    "TrackioConfig",
    "WandbConfig",
    "build_config",
    "check_cross_fields",
    "check_preset_applied",
    "check_ranks",
    "describe",
    "load_config",
    "load_run_config",
    "config_yaml",
    "save_config",
    "to_dict",
    "with_model_path",
]
