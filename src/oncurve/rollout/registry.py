"""Sampler backends by name (`rollout.backend`, the CLI's `--backend`).

A backend is a `Sampler` class and, for `TorchSampler`, the `Decoder` its decode loop runs
(`oncurve.rollout.base`), so adding one is a module with the decoder and one line below. What
a run needs to know of a backend before building it (`exact_logprobs`, `holds_cache`) is on
its class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from oncurve.errors import UserError
from oncurve.rollout import cpu_llama, cuda_graph
from oncurve.rollout.base import DecoderFactory, Sampler
from oncurve.rollout.hf_decoder import HFDecoder
from oncurve.rollout.torch_sampler import TorchSampler


@dataclass(frozen=True)
class Backend:
    """A sampler backend: its `Sampler` class, with the decoder a `TorchSampler` runs."""

    sampler: type[Sampler]
    decoder: DecoderFactory | None = None

    def build(self, model: torch.nn.Module, tokenizer: Any) -> Sampler:
        if self.decoder is None:
            return self.sampler(model, tokenizer)
        return self.sampler(model, tokenizer, decoder=self.decoder)


BACKENDS: dict[str, Backend] = {
    "hf": Backend(TorchSampler, HFDecoder),
    "cpu_llama": Backend(TorchSampler, cpu_llama.make_decoder),
    "cuda_graph": Backend(cuda_graph.GraphSampler),
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


def backend_named(backend: str, model: torch.nn.Module, name: str = "rollout.backend") -> Backend:
    """The `Backend` of `backend` (a `BACKENDS` name, or "auto": see `auto_backend`) for
    `model`; an unknown name is a `UserError` that calls the setting `name`."""
    if backend == "auto":
        backend = auto_backend(model)
    if backend not in BACKENDS:
        choices = ", ".join(["auto", *BACKENDS])
        raise UserError(f"{name}={backend!r} is not a sampler backend; choose one of {choices}")
    return BACKENDS[backend]


def build_sampler(
    backend: str, model: torch.nn.Module, tokenizer: Any, name: str = "rollout.backend"
) -> Sampler:
    """The `Sampler` of `backend` (see `backend_named`) for `model` and `tokenizer`."""
    return backend_named(backend, model, name).build(model, tokenizer)
