"""Group sampling: the Sampler protocol, its backends and the factory that picks one by name."""

from oncurve.rollout.base import Sampler, SamplerSettings, SamplingParams
from oncurve.rollout.registry import BACKENDS, Backend, auto_backend, backend_named, build_sampler
from oncurve.rollout.torch_sampler import TorchSampler

__all__ = [
    "BACKENDS",
    "Backend",
    "Sampler",
    "SamplerSettings",
    "SamplingParams",
    "TorchSampler",
    "auto_backend",
    "backend_named",
    "build_sampler",
]
