"""Shared fixtures: tiny models built from a config, saved like a user's local model dir (one
with a chat template); the `gpu` marker, whose tests are skipped where torch sees no CUDA
device, and the `browser` marker, whose tests are skipped where no Chromium is installed."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from helpers.browser import BINARIES, INSTALL, find_browser
from helpers.models import tiny_qwen2
from helpers.rank_pool import RankPool

from oncurve.model.char_tokenizer import char_tokenizer

# `pytest -n N` starts N workers on the machine's cores: each worker, and every process it
# starts, takes its share of them as torch threads. A core's worth each would oversubscribe the
# cores, and OpenMP's waiting threads spin on a core another worker needs.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _THREADS_PER_WORKER = max(
        1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    )
    os.environ["OMP_NUM_THREADS"] = str(_THREADS_PER_WORKER)
    torch.set_num_threads(_THREADS_PER_WORKER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are collected everywhere and run only where CUDA is available, so
    that `make test` never needs a GPU (`make gpu-check` runs them on one); tests marked
    `browser` run only where a Chromium binary is on PATH."""
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(
            reason=f"needs a CUDA device; this torch ({torch.__version__}) sees none"
        )
    if find_browser() is None:
        skips["browser"] = pytest.mark.skip(
            reason=f"needs Chromium ({', '.join(BINARIES)} on PATH): {INSTALL}"
        )
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:  # the marker, not a folder's name
                item.add_marker(skip)


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


CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture
def chat_model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny test model with a chat template in its tokenizer."""
    path = tmp_path / "chat-model"
    shutil.copytree(tiny_model_dir, path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path
