"""Data parallelism: one SGD step of the tiny model on the fixed batch (`batches.fixed_batch`), on
one process or on 2 ranks each holding half its groups (gloo on the CPU, NCCL on 2 GPUs), and
the same 2-rank `oncurve train` job under FSDP2 and under DDP."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from helpers.batches import GROUPS, VOCAB, G, batch_to, fixed_batch, loss_fns
from helpers.models import tiny_qwen2
from helpers.rank_pool import free_port
from helpers.runs import run_clis, tiny_job
from oncurve import distributed
from oncurve.model import packed_attention
from oncurve.model.forward import PolicyLogprobs
from oncurve.update.microbatches import ForwardSettings
from oncurve.update.step import optimizer_step


def one_step(
    aggregation: str,
    rows: slice | None,
    fsdp: bool = False,
    device: str = "cpu",
    pack: bool = False,
    microbatch: tuple[int, int] = (2, 0),
) -> dict[str, torch.Tensor]:
    """The weights (on the CPU) after one SGD step of the tiny model on `rows` of the fixed
    batch (all of it when None), the model and the batch on `device`; with `pack`, its rows
    packed (`oncurve.model.packing`), each group's prompt run once; `microbatch` its rows and tokens
    at most."""
    model = tiny_qwen2(VOCAB, seed=0)
    batch = fixed_batch(model)  # made on the CPU: the same batch on every device
    if pack:
        packed_attention.use_packed_attention(model)
        batch.prompt_index = torch.arange(GROUPS).repeat_interleave(G)
    local = batch_to(batch if rows is None else batch.rows(rows), device)
    policy = distributed.wrap(PolicyLogprobs(model.to(device)), device, fsdp=fsdp)
    # SGD, not Adam: Adam's first step is ~lr * sign(grad), which turns 1e-12 noise in a
    # near-zero gradient into a 2*lr difference; SGD shows the gradient itself.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    forward = ForwardSettings(16, microbatch_rows=microbatch[0], microbatch_tokens=microbatch[1])
    forward = dataclasses.replace(forward, pack_rows=pack)
    optimizer_step(policy, optimizer, local, loss_fns(aggregation), forward, grad_clip=0.0)
    # FSDP2 holds each parameter as a DTensor shard; full_tensor() gathers it.
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
        for k, v in model.state_dict().items()
    }


def _rank_step(
    rank: int,
    world_size: int,
    aggregation: str,
    fsdp: bool,
    device: str,
    pack: bool,
    microbatch: tuple[int, int],
) -> dict[str, torch.Tensor] | None:
    """In a process group: this rank's one step on its half of the groups; rank 0's weights
    after it (None on the other ranks)."""
    rows = distributed.shard(GROUPS, rank, world_size)
    part = slice(rows.start * G, rows.stop * G)
    weights = one_step(aggregation, part, fsdp, device, pack, microbatch)
    return weights if rank == 0 else None


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    aggregation: str,
    out: str,
    fsdp: bool,
    device: str,
    pack: bool,
    microbatch: tuple[int, int],
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        weights = _rank_step(rank, world_size, aggregation, fsdp, device, pack, microbatch)
        if weights is not None:
            save_file({k: v.contiguous() for k, v in weights.items()}, out)
        del weights
    except BaseException:
        dist.destroy_process_group()
        raise
    # both ranks done before either tears gloo down (a rank that leaves first can abort its
    # peer), and no interpreter teardown after it, where gloo's leftovers aborted a rank now
    # and then (SIGABRT, "terminate called without an active exception")
    distributed.leave()
    sys.stderr.flush()
    os._exit(0)


def two_rank_step(
    aggregation: str,
    tmp_path: Path,
    fsdp: bool,
    device: str = "cpu",
    pack: bool = False,
    microbatch: tuple[int, int] = (2, 0),
) -> dict[str, torch.Tensor]:
    """Rank 0's weights after one step of 2 ranks (gloo on the CPU, NCCL on 2 GPUs), each on
    half the groups of the fixed batch (rows packed with `pack`, microbatches of at most
    `microbatch` rows and tokens); a failure when the ranks are not done in 120 s (a rank
    waiting in a collective the other never joins). Two new processes: on the CPU the tests
    run test_distributed's `gloo_step` on the session's two ranks instead."""
    out = tmp_path / "rank0.safetensors"
    args = (2, free_port(), aggregation, str(out), fsdp, device, pack, microbatch)
    ranks = mp.spawn(_rank_main, args=args, nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=max(0.0, deadline - time.monotonic())):  # a rank at a time
        if time.monotonic() >= deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail("the ranks were not done in 120 s: one waits in a collective")
    return load_file(out)


def _sharded_and_replicated(
    model_dir: Path, data_file: Path, tmp_path: Path, *overrides: str
) -> tuple[Path, Path, list[str], subprocess.CompletedProcess]:
    """`sharded_and_replicated_runs`, and the DDP run's finished process."""
    common = [*tiny_job(model_dir, data_file), "run.save_every=1", "run.keep_last=5"]
    common += ["dist.nproc=2", *overrides]
    sharded, replicated = tmp_path / "fsdp", tmp_path / "ddp"
    runs = ((sharded, "true"), (replicated, "false"))
    procs = run_clis([[*common, f"run.dir={d}", f"dist.fsdp={fsdp}"] for d, fsdp in runs])
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = procs[1]  # the DDP run's
    final = load_file(sharded / "final" / "model.safetensors")
    initial = load_file(model_dir / "model.safetensors")
    for name, value in load_file(replicated / "final" / "model.safetensors").items():
        assert float((final[name] - initial[name]).abs().max()) > 1e-5, name  # it trained
        torch.testing.assert_close(final[name], value, atol=1e-6, rtol=0, msg=name)
    norms = {}
    for run_dir in (sharded, replicated):
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        norms[run_dir] = [json.loads(row)["grad_norm"] for row in rows]
    assert norms[sharded] == pytest.approx(norms[replicated], rel=1e-5)
    assert min(norms[sharded]) > 0
    return sharded, replicated, common, proc


def sharded_and_replicated_runs(
    model_dir: Path, data_file: Path, tmp_path: Path, *overrides: str
) -> tuple[Path, Path, list[str]]:
    """The same 2-rank `oncurve train` job with dist.fsdp=true and false: (FSDP2 run dir, DDP
    run dir, the shared arguments), after checking that both trained their weights alike."""
    return _sharded_and_replicated(model_dir, data_file, tmp_path, *overrides)[:3]
