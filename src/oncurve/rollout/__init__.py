"""Group sampling: the Sampler protocol and its torch backend."""

from oncurve.rollout.base import Sampler, SamplingParams
from oncurve.rollout.torch_sampler import TorchSampler

__all__ = ["Sampler", "SamplingParams", "TorchSampler"]
