"""Sampler backends by name (`rollout.backend`, the CLI's `--backend`).

A backend is a callable `(model, tokenizer) -> Sampler`. One whose model side is a `Decoder`
(`oncurve.rollout.base`) is `TorchSampler` with that decoder, so adding one is a module with
the decoder and one line below.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rollout import cpu_llama, cuda_graph
from oncurve.rollout.base import Sampler
from oncurve.rollout.hf_decoder import HFDecoder
from oncurve.rollout.torch_sampler import TorchSampler

BACKENDS: dict[str, Callable[[torch.nn.Module, Any], Sampler]] = {
    "hf": functools.partial(TorchSampler, decoder=HFDecoder),
    "cpu_llama": functools.partial(TorchSampler, decoder=cpu_llama.make_decoder),
    "cuda_graph": cuda_graph.GraphSampler,
}


def auto_backend(model: torch.nn.Module) -> str:
    """By the model's device: on the CPU `cpu_llama` where its decoder supports the model, on
    CUDA `cuda_graph` where its static step does; else `hf`."""
    device = model.get_output_embeddings().weight.device.type
    if device == "cpu" and cpu_llama.supports(model):
        return "cpu_llama"
    if device == "cuda" and cuda_graph.supports(model):
        return "cuda_graph"
    return "hf"


def build_sampler(
    backend: str, model: torch.nn.Module, tokenizer: Any, name: str = "rollout.backend"
) -> Sampler:
    """The `Sampler` of `backend` (a `BACKENDS` name, or "auto": see `auto_backend`) for
    `model` and `tokenizer`; an unknown name is a `UserError` that calls the setting `name`."""
    if backend == "auto":
        backend = auto_backend(model)
    if backend not in BACKENDS:
        choices = ", ".join(["auto", *BACKENDS])
        raise UserError(f"{name}={backend!r} is not a sampler backend; choose one of {choices}")
    return BACKENDS[backend](model, tokenizer)
