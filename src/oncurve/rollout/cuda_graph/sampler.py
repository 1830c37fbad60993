"""`GraphSampler`: the `cuda_graph` backend's `Sampler`, and its decode: prefill once per
prompt, then steps (replayed graphs where a bucket has one) until every row ended, the live rows
moved to smaller buckets as they fit them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import transformers

from oncurve.algo.logprobs import float_logits
from oncurve.model.kv_cache import cache_argument, real_token_positions
from oncurve.rollout.base import SamplerSettings, SamplingParams
from oncurve.rollout.cuda_graph.edges import StepEdges
from oncurve.rollout.cuda_graph.graphs import GraphCapture
from oncurve.rollout.cuda_graph.step import (
    Regions,
    StaticStep,
    Together,
    lay_out_projections,
    supports,
)
from oncurve.rollout.cuda_graph.workspace import Workspace, WorkspaceCache, bucket_for, buckets
from oncurve.rollout.torch_sampler import TorchSampler, end_at_stops
from oncurve.types import RolloutBatch


@contextlib.contextmanager
def _writes_once() -> Iterator[None]:
    """Deterministic algorithms off for the duration, then as they were. Every index the decode
    step writes is written once (a cache column, a row's token, logprob, end), so the usual
    kernels give the same result; in deterministic mode CUDA's `index_put_` and `index_copy_`
    sort their indices first, several kernels each where one does, and inductor compiles each
    such write as a call of that op, cut out of the fused kernel around it (two a layer)."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


class GraphSampler(WorkspaceCache, GraphCapture, StaticStep, StepEdges, TorchSampler):
    """A `Sampler` whose decode steps are CUDA graphs (see the package's docstring); on a device
    without CUDA graphs the same steps run eagerly, and so do they, with one warning, for the
    rest of the sampler's life once a capture fails for any reason.

    Args:
        model: a model `supports` accepts (else `generate` refuses it), on its device; its
            projections are laid out (`lay_out_projections`).
        tokenizer: as `TorchSampler`'s.
        use_graphs: capture and replay graphs; default: when the model is on CUDA.
        compile_step: compile the decode step (package docstring); default: when the model is
            on CUDA.
        dynamic_compile: compile it once for every bucket, with symbolic sizes (package
            docstring), instead of once per bucket.

    Attributes:
        use_graphs: whether graphs are captured; False after a capture failed.
        graph_error: the first line of the error that made it False, else None.
        compile_step: whether the step is compiled; False after a compilation failed.
        compile_error: the first line of the error that made it False, else None.
        min_width: prompt columns every workspace has at least (the trainer sets it to its
            longest prompt, so that no training step meets a wider one and recaptures).
        capture_seconds: spent capturing graphs, over all calls (compiling not included).
        compile_seconds: spent compiling the step (the first step of each bucket of each
            workspace, with compiling on).
    """

    def __init__(
        self,
        model: transformers.PreTrainedModel,
        tokenizer,
        use_graphs: bool | None = None,
        compile_step: bool | None = None,
        dynamic_compile: bool = False,
    ):
        super().__init__(model, tokenizer)
        if supports(model):
            lay_out_projections(model)
        device = model.get_output_embeddings().weight.device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.compile_step = device.type == "cuda" if compile_step is None else compile_step
        self.dynamic_compile = dynamic_compile
        self._dynamic_regions: Regions | None = None
        self.graph_error: str | None = None
        self.compile_error: str | None = None
        self.min_width = 0
        self.capture_seconds = 0.0
        self.compile_seconds = 0.0
        self._workspaces: list[Workspace] = []  # least recently used first
        # by `Workspace.shape`: they outlive their workspace, so one made again (an
        # evaluation's, `scratch`) captures again but does not compile again
        self._compiled: dict[tuple[int, int, int, int], Regions] = {}
        self._warmup_stream: torch.cuda.Stream | None = None  # made at the first capture
        # each layer's `_together` groups while a call runs (its weights cannot move then)
        self._call_projections: list[tuple[Together | None, Together | None]] | None = None

    @torch.inference_mode()
    def generate_ids(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> RolloutBatch:
        """Sample `group_size` completions of each tokenized prompt; the result follows the
        `Sampler` contract (a prompt's G rows contiguous, completions right-padded)."""
        ids, mask = self._pad_prompts(prompt_ids, group_size, params)
        new, rows = params.max_new_tokens, ids.shape[0] * group_size
        width = self._width(ids.shape[1], new)
        if not supports(self.model, width + new):
            raise ValueError(
                f"the cuda_graph sampler does not support this {self.model.config.model_type} "
                f"model at {width + new} tokens; use rollout.backend=hf"
            )
        was_training = self.model.training
        self.model.eval()
        self._call_projections = self._projections()
        try:
            ws = self._workspace(rows, width, new)
            with _writes_once():
                graphs = self._prepare_graphs(ws, params)
            extra = ws.width - ids.shape[1]
            logits = self._prefill(
                ws,
                F.pad(ids, (extra, 0), value=self.pad_id),
                F.pad(mask, (extra, 0), value=0),
                group_size,
                params,
            )
            with _writes_once():
                self._decode(ws, rows, logits, params, graphs)
        finally:
            self.model.train(was_training)
            self._call_projections = None
        ends = ws.ends[:rows]
        longest = int(ends.max())
        return self._rollout(
            ids,
            mask,
            group_size,
            ws.completion[:rows, :longest],
            ws.logprobs[:rows, :longest],
            ends,
            ws.reasons[:rows],
            params,
        )

    # the static step's kernels compute logprobs apart from the trainer's forward; workspaces
    # are kept from call to call, so that their graphs are replayed
    exact_logprobs = False
    holds_cache = True
    compiles_steps = True

    def prepare(self, settings: SamplerSettings) -> None:
        """Capture graphs and compile the step as `settings` say; make every workspace as wide
        as the run's longest prompt."""
        self.use_graphs = settings.cuda_graphs
        self.compile_step = settings.compile
        self.min_width = settings.longest_prompt

    def metrics(self) -> dict[str, float]:
        """This process's totals, what a run pays up front: seconds compiling and capturing."""
        return {
            "time/sampler_compile_total": self.compile_seconds,
            "time/sampler_capture_total": self.capture_seconds,
        }

    def turned_off(self) -> dict[str, bool]:
        """`cuda_graphs` and `compile`, once a capture or a compilation failed."""
        failed = {"cuda_graphs": self.graph_error, "compile": self.compile_error}
        return {name: False for name, error in failed.items() if error is not None}

    def _prefill(
        self,
        ws: Workspace,
        ids: torch.Tensor,
        mask: torch.Tensor,
        group_size: int,
        params: SamplingParams,
    ) -> torch.Tensor:
        """Forward the B prompts `[B, W]` once, copy each one's keys and values into its G rows
        of the static cache and set the decode state. Returns `[N, V]` float32 logits."""
        rows = ids.shape[0] * group_size
        self._reset(ws, rows, params.seed, params.first_row)
        trunk = self.model.base_model
        cache = transformers.DynamicCache(config=self.model.config)
        positions = real_token_positions(mask)
        out = trunk(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **cache_argument(trunk, cache),
        )
        for layer, keys, values in zip(cache.layers, ws.keys, ws.values, strict=True):
            keys[:rows, :, : ws.width] = layer.keys.repeat_interleave(group_size, 0)
            values[:rows, :, : ws.width] = layer.values.repeat_interleave(group_size, 0)
        ws.visible[:rows, : ws.width] = mask.bool().repeat_interleave(group_size, 0)
        ws.positions[:rows] = mask.sum(-1).repeat_interleave(group_size)
        # rows past the call's are dead but may share a bucket with live ones: they attend as
        # its first row does, so that they compute finite values
        ws.visible[rows:, : ws.width] = ws.visible[:1, : ws.width]
        ws.positions[rows:] = ws.positions[0]
        head = self.model.get_output_embeddings()
        logits = float_logits(out.last_hidden_state[:, -1], head.weight, head.bias)
        return logits.repeat_interleave(group_size, 0)

    def _decode(
        self,
        ws: Workspace,
        rows: int,
        logits: torch.Tensor,
        params: SamplingParams,
        graphs: dict[int, torch.cuda.CUDAGraph],
    ) -> None:
        """Draw the first token of the call's `rows` rows from the prefill's `logits`, then
        step (replaying `graphs` where one has the bucket) until every row ended.

        Which rows ended (and stop strings) is read on the host only every `check_every`
        steps (each read waits for the device); rows that end in between decode on harmlessly,
        their ends already recorded. The live rows then move to a smaller bucket when they fit
        one."""
        sizes = buckets(ws.rows)
        self._first_draw(ws, rows, logits, params)
        stop_table = (
            self._stop_table(params.stop, logits.shape[-1], logits.device) if params.stop else None
        )
        bucket = bucket_for(rows, sizes)
        checked = 0  # tokens of every row whose endings were read
        for drawn in range(1, params.max_new_tokens + 1):
            last = drawn == params.max_new_tokens
            if last or drawn - checked >= self.check_every:
                if stop_table is not None:
                    end_at_stops(
                        self.tokenizer, params.stop, stop_table, ws.completion,
                        ws.row_ids[:bucket], ws.alive[:bucket], ws.ends, ws.reasons, checked,
                        drawn,
                    )  # fmt: skip
                checked = drawn
                alive = int(ws.alive[:bucket].sum())
                if alive == 0 or last:
                    break
                smaller = bucket_for(alive, sizes)
                if smaller < bucket:
                    self._compact(ws, bucket, smaller)
                    bucket = smaller
            if bucket in graphs:
                graphs[bucket].replay()
            else:
                self._step(ws, bucket, params)

    def _compact(self, ws: Workspace, rows: int, smaller: int) -> None:
        """Gather the live decoder rows (then dead ones, to fill) into the first `smaller`."""
        alive = ws.alive[:rows]
        order = torch.cat([alive.nonzero().squeeze(1), (~alive).nonzero().squeeze(1)])[:smaller]
        for cache in (*ws.keys, *ws.values):
            cache[:smaller] = cache[order]
        for state in (ws.visible, ws.tokens, ws.positions, ws.row_ids, ws.alive):
            state[:smaller] = state[order]
