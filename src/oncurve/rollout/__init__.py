"""Group sampling: the Sampler protocol, its backends and the factory that picks one by name."""

from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.rollout.registry import BACKENDS, auto_backend, build_sampler
from oncurve.rollout.torch_sampler import TorchSampler

__all__ = [
    "BACKENDS",
    "Sampler",
    "SamplingParams",
    "TorchSampler",
    "auto_backend",
    "build_sampler",
]
