"""Checking the `cuda_graph` sampler: stand-ins for the CUDA graph API that count live graphs
per pool, samples compared with each other and with the training forward, and the one warning
of a sampler that fell back."""

from __future__ import annotations

import contextlib
import itertools
import weakref

import pytest
import torch

from oncurve.algo.truncation import KEEP_ALL, Truncation
from oncurve.model.forward import completion_logprobs


def assert_fell_back_once(
    capsys: pytest.CaptureFixture, says: str, error: str | None, batches: list, eager
) -> None:
    """A sampler that fell back (from graphs or from compiling) warned once, with the line
    saying `says` and quoting `error`, and every one of `batches` equals the `eager` samples."""
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and says in warnings[0]
    assert error and error in warnings[0]
    for batch in batches:
        assert_same_samples(batch, eager, atol=0)


def assert_same_samples(got, want, atol: float) -> None:
    """The same tokens and finish reasons, logprobs within `atol`."""
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert got.finish_reasons == want.finish_reasons
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=atol, rtol=0)


class FakePools:
    """Stand-ins for the CUDA graph API that count live graphs per pool. PyTorch's allocator
    cannot erase a private pool that still holds a block (cuBLAS's workspace for the capture
    stream outlives the graphs), and asserts `use_count > 0` when a capture reuses a pool
    whose graphs were all freed; `graph` raises the same way."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.ids = itertools.count(1)
        self.captures = 0

    def graph_pool_handle(self) -> tuple[int, int]:
        return (0, next(self.ids))

    def _freed(self, pool: int) -> None:
        self.live[pool] -= 1

    @contextlib.contextmanager
    def graph(self, graph, pool=None, **_):
        key = pool[1] if pool is not None else next(self.ids)
        if self.live.get(key) == 0:
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED (fake allocator)")
        self.live[key] = self.live.get(key, 0) + 1
        self.captures += 1
        weakref.finalize(graph, self._freed, key)
        del graph  # the generator's frame must not keep the graph alive
        yield

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        class Graph:
            def replay(self) -> None:
                pass

        class Stream:
            def wait_stream(self, other) -> None:
                pass

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", self.graph_pool_handle)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "set_stream", lambda s: None)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)


def trained_logprobs(
    model: torch.nn.Module, batch, temperature: float, truncation: Truncation = KEEP_ALL
) -> torch.Tensor:
    with torch.no_grad():
        logprobs, _ = completion_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.completion_ids.shape[1],
            temperature, truncation=truncation,
        )  # fmt: skip
    return logprobs * batch.completion_mask
