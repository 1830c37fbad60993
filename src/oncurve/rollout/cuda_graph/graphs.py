"""The CUDA graphs of a `cuda_graph` sampler (`GraphCapture`): captured per bucket of a
workspace and per set of sampling settings, kept while the weights stay where they are, and
given up for the eager step, with one warning, once a capture fails.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch

from oncurve.errors import error_line
from oncurve.rollout.base import SamplingParams
from oncurve.rollout.cuda_graph.workspace import Workspace, buckets

SETTINGS_PER_WORKSPACE = 3  # graphs kept per workspace: training, greedy and sampled evaluation


def _settings(params: SamplingParams) -> tuple:
    """What a captured or compiled step depends on of `params`: all but the seed, the first
    row and the stop strings (read outside the step)."""
    return dataclasses.astuple(dataclasses.replace(params, seed=None, stop=(), first_row=0))


class GraphCapture:
    """`GraphSampler`'s graphs: those of a call's settings on its workspace, captured after an
    eager warm-up when there are none yet."""

    def _prepare_graphs(
        self, ws: Workspace, params: SamplingParams
    ) -> dict[int, torch.cuda.CUDAGraph]:
        """The graphs, by bucket, of these sampling settings on `ws`: those captured before
        while the weights stay at the same addresses, else new ones; none (decode eagerly)
        without graphs, for fewer than 2 decode steps, or when the capture fails."""
        if not self.use_graphs or params.max_new_tokens < 3:
            return {}
        settings = _settings(params)
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        if ws.weights != weights:
            ws.graphs.clear()
            ws.weights = weights
        if settings in ws.graphs:
            ws.graphs[settings] = ws.graphs.pop(settings)  # most recently used last
            return ws.graphs[settings]
        if len(ws.graphs) >= SETTINGS_PER_WORKSPACE:
            ws.graphs.pop(next(iter(ws.graphs)))
        try:
            ws.graphs[settings] = self._capture(ws, params)
        except torch.OutOfMemoryError:
            raise  # a capture that does not fit is the caller's to redo smaller (`oncurve.run.oom`)
        except Exception as error:  # noqa: BLE001 - any failure to capture: decode eagerly
            self._stop_capturing(error)
            return {}
        return ws.graphs[settings]

    def _capture(self, ws: Workspace, params: SamplingParams) -> dict[int, torch.cuda.CUDAGraph]:
        """Capture the step of every bucket of `ws`, after an eager warm-up (lazy
        initialisations, library workspaces, compiling) on a side stream."""
        start, compiling = time.perf_counter(), self.compile_seconds
        self._eos_mask(self.model.get_output_embeddings().weight.shape[0], ws.tokens.device)
        stream = torch.cuda.current_stream()
        if self._warmup_stream is None:
            # one for the sampler's life: cuBLAS keeps a workspace for each stream it ran on
            # until its workspaces are cleared, so a stream per capture (an evaluation's
            # workspace captures at every evaluation) could leave one behind each time
            self._warmup_stream = torch.cuda.Stream()
        side = self._warmup_stream
        side.wait_stream(stream)
        try:
            with torch.cuda.stream(side):
                # smallest first: compiling with symbolic sizes at the workspace's own row count
                # would tie the step to it (sizes equal by chance are assumed equal), and the next
                # bucket would compile again
                for rows in reversed(buckets(ws.rows)):
                    # a state that keeps every index in range; the prefill resets it
                    self._reset(ws, ws.rows, seed=0)
                    for _ in range(2):
                        self._step(ws, rows, params)
            stream.wait_stream(side)
            # A pool of its own for each round of captures: the first capture of the process
            # allocates cuBLAS's workspace in its pool, and that workspace outlives the graphs,
            # so a pool whose graphs were all freed can never be erased, and PyTorch's
            # allocator asserts (use_count > 0) when a later capture reuses it.
            pool = torch.cuda.graph_pool_handle()
            graphs = {}
            for rows in buckets(ws.rows):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._step(ws, rows, params)
                graphs[rows] = graph
            torch.cuda.synchronize()
        except BaseException:
            torch.cuda.set_stream(stream)  # a failed capture can leave the side stream current
            raise
        compiled = self.compile_seconds - compiling
        seconds = time.perf_counter() - start - compiled
        self.capture_seconds += seconds
        print(
            f"cuda_graph sampler: captured {len(graphs)} decode graphs "
            f"({', '.join(map(str, graphs))} rows) in {seconds:.1f} s"
            + (f", after compiling the step for {compiled:.1f} s" if compiled else ""),
            file=sys.stderr,
        )
        return graphs

    def _stop_capturing(self, error: BaseException) -> None:
        """Decode eagerly from now on (the same samples, more kernel launches), saying why."""
        self.graph_error = error_line(error)
        self.use_graphs = False
        for ws in self._workspaces:
            ws.graphs.clear()
        print(
            f"warning: cuda_graph sampler: capturing the decode step failed ({self.graph_error});"
            " decoding eagerly, with the same samples, for the rest of the run",
            file=sys.stderr,
        )
