"""Shared fixtures: tiny models built from a config, saved like a user's local model dir; the
`gpu` marker, whose tests are skipped where torch sees no CUDA device."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import torch
import transformers
from rank_pool import RankPool
from torch.utils._python_dispatch import TorchDispatchMode

from oncurve.tokenizer import char_tokenizer
from oncurve.types import RolloutBatch, TrainBatch

BatchT = TypeVar("BatchT", TrainBatch, RolloutBatch)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are collected everywhere and run only where CUDA is available, so
    that `make test` never needs a GPU (`make gpu-check` runs them on one)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason=f"needs a CUDA device; this torch ({torch.__version__}) sees none"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def batch_to(batch: BatchT, device: str | torch.device) -> BatchT:
    """A copy of `batch` (a TrainBatch or RolloutBatch) with every tensor on `device`."""
    tensors = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return dataclasses.replace(
        batch, **{k: v.to(device) for k, v in tensors.items() if isinstance(v, torch.Tensor)}
    )


def rows_per_call(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """The rows (`args[1].shape[0]`, the input ids') of each call of `owner.name` from now on,
    the calls otherwise unchanged."""
    rows: list[int] = []
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        rows.append(args[1].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return rows


class OpCounter(TorchDispatchMode):
    """While active, counts the dispatched ops that are in `ops` (`count`)."""

    def __init__(self, ops: set) -> None:
        super().__init__()
        self.ops, self.count = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += func in self.ops
        return func(*args, **(kwargs or {}))


def tiny_qwen2(vocab_size: int, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ~50k-parameter Qwen2-style model and the char tokenizer, saved to a directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = char_tokenizer()
    model = tiny_qwen2(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 JSONL rows `{"prompt": "i+i=", "answer": "2i"}` (shared: tests must not modify it)."""
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def two_ranks() -> Iterator[RankPool]:
    """Two spawned processes that run the session's 2-rank gloo jobs (`rank_pool`), started at
    the first job."""
    pool = RankPool(2)
    yield pool
    pool.close()
