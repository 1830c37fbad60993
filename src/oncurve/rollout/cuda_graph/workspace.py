"""The static buffers a `cuda_graph` sampler decodes in (`Workspace`), the batch-size buckets
that get a graph each, and the workspaces a sampler keeps from call to call (`WorkspaceCache`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import weakref
from collections.abc import Iterator

import torch

from oncurve.rollout.base import FINISH_LENGTH, seeded_generator

WIDTH_STEP = 64  # prompt widths are padded to a multiple of this
SMALLEST_BUCKET = 8
COLUMN_ALIGNMENT = 16  # elements a row of the attention bias is aligned to
MAX_WORKSPACES = 2  # a run's training calls and an evaluation's chunks (`scratch`)


def buckets(rows: int) -> list[int]:
    """Batch sizes that get a graph, largest first: `rows`, then powers of two below it down to
    `SMALLEST_BUCKET`."""
    sizes = [rows]
    size = 2 ** math.floor(math.log2(max(rows - 1, 1)))
    while size >= SMALLEST_BUCKET and size < rows:
        sizes.append(size)
        size //= 2
    return sizes


def _cache_columns(width: int, new: int) -> int:
    """KV cache columns of a workspace for `width` prompt columns and `new` tokens: the
    `width + new - 1` a call can fill, rounded up to a multiple of `COLUMN_ALIGNMENT`, so that
    the attention bias needs no padded copy (the memory-efficient attention kernel pads one
    whose rows are not aligned, at every call of every layer)."""
    return math.ceil((width + new - 1) / COLUMN_ALIGNMENT) * COLUMN_ALIGNMENT


def bucket_for(alive: int, sizes: list[int]) -> int:
    """The smallest of `sizes` that holds `alive` rows."""
    return min(s for s in sizes if s >= alive)


@dataclasses.dataclass
class Workspace:
    """The static buffers calls of up to `rows` rows, `width` prompt columns and `new` tokens
    decode in; graphs read and write them in place.

    Shapes: N rows, L = `_cache_columns(W, new)` cache columns, V vocabulary.
    """

    rows: int
    width: int  # W, prompt columns
    new: int
    keys: list[torch.Tensor]  # per layer [N, kv_heads, L, head_dim]
    values: list[torch.Tensor]
    visible: torch.Tensor  # [N, L] bool: columns a row attends to
    tokens: torch.Tensor  # [N] the token each decoder row feeds next
    positions: torch.Tensor  # [N] its position (real tokens before it)
    row_ids: torch.Tensor  # [N] the output row of each decoder row
    alive: torch.Tensor  # [N] bool, per decoder row
    column: torch.Tensor  # [1] cache column the next step writes
    t: torch.Tensor  # [1] index of the token the next step samples
    uniforms: torch.Tensor  # [new, N] float32, by output row
    completion: torch.Tensor  # [N, new] by output row
    logprobs: torch.Tensor  # [N, new] float32
    ends: torch.Tensor  # [N] completion lengths
    reasons: torch.Tensor  # [N] finish reason codes
    # the graphs of each set of sampling settings, by bucket, oldest settings first
    graphs: dict[tuple, dict[int, torch.cuda.CUDAGraph]] = dataclasses.field(default_factory=dict)
    weights: tuple[int, ...] = ()  # data pointers of the weights the graphs read

    def shape(self, bucket: int) -> tuple[int, int, int, int]:
        """What a bucket's compiled regions are specialised to: their workspace's sizes and
        the bucket (a workspace of the same sizes, made again, runs the same code)."""
        return (self.rows, self.width, self.new, bucket)


class WorkspaceCache:
    """`GraphSampler`'s workspaces: up to `MAX_WORKSPACES` kept, each with its KV cache and
    graphs; how wide a call's is; freeing them; and resetting one for a call."""

    def release(self) -> None:
        """Free the workspaces and their graphs (the next call captures again)."""
        self._workspaces.clear()

    @contextlib.contextmanager
    def scratch(self) -> Iterator[None]:
        """The workspaces made inside are freed at its end, with their graphs; those it finds
        stay. An evaluation runs in one: its workspace (up to `eval.batch_rows` rows at full
        length) would otherwise hold its KV cache through every update until the next
        evaluation, or the end; so does a training step's sampling when the cache is not kept
        (`rollout.keep_cache`). Made again, a workspace captures again (a fraction of a second)
        but runs the code its sizes compiled before."""
        # weakly: a `release` inside (to retry smaller after running out of memory) must free
        kept = [weakref.ref(ws) for ws in self._workspaces]
        try:
            yield
        finally:
            found = [ws for ws in self._workspaces if any(ws is k() for k in kept)]
            made = [weakref.ref(ws) for ws in self._workspaces if all(ws is not f for f in found)]
            self._workspaces = found
            if any(ws() is not None for ws in made):
                # Dynamo's tracing of a workspace's first steps leaves reference cycles that
                # hold it: collected now, its memory is free for the update that follows (a
                # whole collection takes a while, so only then)
                gc.collect()

    def _width(self, prompt_width: int, new: int) -> int:
        """Prompt columns of a call: its longest prompt or `min_width`, whichever is wider,
        rounded up to `WIDTH_STEP` within the model's positions."""
        width = math.ceil(max(prompt_width, self.min_width) / WIDTH_STEP) * WIDTH_STEP
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None:
            width = max(prompt_width, min(width, limit - new))
        return width

    def _workspace(self, rows: int, width: int, new: int) -> Workspace:
        """The smallest kept workspace that holds this call, else a new one of its size.

        Up to `MAX_WORKSPACES` are kept, each with its KV cache allocated (graphs point into
        it): a run's training calls and its evaluation chunks each find theirs, instead of
        recapturing at every switch; a third shape replaces the least recently used."""
        fits = [
            ws for ws in self._workspaces if ws.new == new and ws.rows >= rows and ws.width >= width
        ]
        if fits:
            ws = min(fits, key=lambda w: (w.rows, w.width))
            self._workspaces.remove(ws)
            self._workspaces.append(ws)
            return ws
        if len(self._workspaces) >= MAX_WORKSPACES:
            self._workspaces.pop(0)
        trunk = self.model.base_model
        config = self.model.config
        head_dim = trunk.layers[0].self_attn.head_dim
        weight = self.model.get_output_embeddings().weight
        device, dtype = weight.device, weight.dtype
        columns = _cache_columns(width, new)
        shape = (rows, config.num_key_value_heads, columns, head_dim)
        layers = len(trunk.layers)

        def zeros(*size: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        ws = Workspace(
            rows=rows,
            width=width,
            new=new,
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
            visible=zeros(rows, columns, dtype=torch.bool),
            tokens=zeros(rows),
            positions=zeros(rows),
            row_ids=zeros(rows),
            alive=zeros(rows, dtype=torch.bool),
            column=zeros(1),
            t=zeros(1),
            uniforms=zeros(new, rows, dtype=torch.float32),
            completion=zeros(rows, new),
            logprobs=zeros(rows, new, dtype=torch.float32),
            ends=zeros(rows),
            reasons=zeros(rows),
        )
        self._workspaces.append(ws)
        return ws

    def _reset(self, ws: Workspace, rows: int, seed: int | None, first_row: int = 0) -> None:
        """Put every decode buffer in its state before the first draw, in place, for a call of
        `rows` rows (the workspace's others are dead from the start), rows `first_row`.. of
        the call with this `seed` (`SamplingParams.first_row`)."""
        device = ws.tokens.device
        ws.row_ids.copy_(torch.arange(ws.rows, device=device))
        ws.alive.fill_(False)
        ws.alive[:rows] = True
        ws.ends.fill_(ws.new)
        ws.reasons.fill_(FINISH_LENGTH)
        ws.column.fill_(ws.width)
        ws.t.fill_(0)
        ws.visible[:, ws.width :] = False
        # a row's draws are consecutive numbers of the stream, drawn for the call's rows only:
        # a row samples the same in any workspace and in any part of a call split to fit memory
        drawn = torch.rand(
            (first_row + rows, ws.new), generator=seeded_generator(seed, device), device=device
        )
        ws.uniforms.zero_()
        ws.uniforms[:, :rows] = drawn[first_row:].T
