"""Data parallelism on torch.distributed: init, sharding of prompt groups, reductions, wrapping.

`torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK; without them everything here is a no-op and
the single-process path runs unchanged. Each rank samples and scores whole groups, so
advantages need no communication; what is reduced is only what a loss normaliser or a
batch-level statistic needs (token and sequence counts, the batch reward std) and the gradients.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from oncurve.errors import UserError


def init_distributed(device: str, timeout_s: float = 300.0) -> tuple[int, int]:
    """(rank, world size); joins the process group when launched by torchrun. gloo on CPU,
    nccl on CUDA. The timeout bounds every collective, so a dead rank fails the job instead of
    hanging it."""
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) == 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def leave() -> None:
    """Wait for every rank, then leave the process group (when in one), as the end of a job
    launched by torchrun, and free what is left of its work while the interpreter is whole:
    gloo's work objects hold tensors, and freed during the interpreter's exit, they can abort
    the process (pytorch/pytorch#179291)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    gc.collect()


def collective_failure(error: BaseException) -> str | None:
    """One line for `error` when it is a collective of the job failing (another rank raised,
    died or stalled past `dist.timeout_s`; its own error is that rank's to say), else None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    text = " ".join(str(error).split())
    if not isinstance(error, dist.DistError) and not any(
        name in text for name in ("gloo", "NCCL", "c10d")
    ):
        return None
    return (
        f"rank {dist.get_rank()}: a collective failed: another rank of the job failed, ended or "
        f"took longer than dist.timeout_s (its own error says why) ({text[:200]})"
    )


def world() -> tuple[int, int]:
    """(rank, world size) of the current process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(total: int, rank: int, world_size: int, what: str = "data.prompts_per_step") -> slice:
    """The contiguous share of `total` whole groups that `rank` samples."""
    if total % world_size:
        raise UserError(f"{what} ({total}) must be divisible by the number of ranks ({world_size})")
    size = total // world_size
    return slice(rank * size, (rank + 1) * size)


def _collective_device() -> torch.device:
    """Where the tensors of a collective must live: NCCL reduces only CUDA tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(values: list[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    if world()[1] == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (identity on one process)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def all_min(values: list[float]) -> list[float]:
    """Element-wise minimum over ranks (identity on one process)."""
    return _all_reduce(values, dist.ReduceOp.MIN)


def all_max(values: list[float]) -> list[float]:
    """Element-wise maximum over ranks (identity on one process)."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def shards_weights(module: torch.nn.Module) -> bool:
    """Whether `module` is FSDP2-sharded (`wrap`): each of its forwards gathers its weights, a
    collective that every rank must join as many times."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch before 2.6, whose `wrap` has no fully_shard to shard with
        return False
    return isinstance(module, FSDPModule)


def across_ranks(
    metrics: dict[str, float],
    summed: frozenset[str] = frozenset(),
    maxed: frozenset[str] = frozenset(),
) -> dict[str, float]:
    """Each metric over ranks, for rank 0's log: the sum of those `summed` (counts, rates), the
    maximum of those `maxed` and of keys ending in /max, the minimum of keys ending in /min, for
    `<name>/std` beside `<name>/mean` the population std of the ranks' values together, the
    mean of the rest. The pooled std and the means weigh each rank alike: each holds an equal
    share of the batch, less any rows left unscored (NaN) there."""
    _, world_size = world()
    if world_size == 1:
        return metrics
    keys = sorted(metrics)
    pooled = [k for k in keys if k.endswith("/std") and k[: -len("std")] + "mean" in metrics]
    second_moments = [metrics[k] ** 2 + metrics[k[: -len("std")] + "mean"] ** 2 for k in pooled]
    tensor = torch.tensor(
        [metrics[k] for k in keys] + second_moments,
        dtype=torch.float64,
        device=_collective_device(),
    )
    low, high, total = tensor.clone(), tensor.clone(), tensor.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(total)
    out = {}
    for i, key in enumerate(keys):
        if key.endswith("/min"):
            out[key] = float(low[i])
        elif key.endswith("/max") or key in maxed:
            out[key] = float(high[i])
        elif key in summed:
            out[key] = float(total[i])
        else:
            out[key] = float(total[i]) / world_size
    for j, key in enumerate(pooled):
        mean = out[key[: -len("std")] + "mean"]
        variance = float(total[len(keys) + j]) / world_size - mean**2
        out[key] = math.sqrt(max(variance, 0.0))
    return out


def global_moments(values: torch.Tensor) -> tuple[float, float]:
    """(mean, population variance) of `values` (any shape) taken together over every rank."""
    picked = values.double().flatten()
    count, total, squares = all_sum(
        [float(picked.numel()), float(picked.sum()), float(picked.square().sum())]
    )
    mean = total / max(count, 1.0)
    return mean, max(squares / max(count, 1.0) - mean**2, 0.0)


def batch_std(rewards: torch.Tensor) -> torch.Tensor:
    """Population std of the finite rewards of the global batch (all ranks)."""
    _, variance = global_moments(rewards[torch.isfinite(rewards)])
    return torch.tensor(variance**0.5, device=rewards.device)


def wrap(module: torch.nn.Module, device: str, fsdp: bool = False) -> torch.nn.Module:
    """DDP (or FSDP2's fully_shard) around the training forward; unchanged on one process."""
    if world()[1] == 1:
        return module
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch before 2.6 keeps FSDP2 private
            raise UserError(
                f"dist.fsdp=true needs torch 2.6 or later (FSDP2's fully_shard); this is torch "
                f"{torch.__version__}"
            ) from None
        # fully_shard's default mesh takes the machine's accelerator, even for CPU weights
        # under gloo; the mesh must be where the weights are.
        mesh = init_device_mesh("cuda" if device == "cuda" else "cpu", (world()[1],))
        for layer in _decoder_layers(module):
            fully_shard(layer, mesh=mesh)
        return fully_shard(module, mesh=mesh)
    ids = [torch.cuda.current_device()] if device == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)


@contextmanager
def gathered(sharded: torch.nn.Module, full: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Yield a module with whole weights: `sharded` itself when `full` is it; else `full`,
    filled with `sharded`'s gathered weights for the duration (a collective: every rank enters)
    and emptied after (see `release`)."""
    if full is sharded:
        yield sharded
        return
    for param in full.parameters():
        storage = param.untyped_storage()
        if storage.size() == 0:
            storage.resize_(param.numel() * param.element_size())
    gather_weights(sharded, full)
    try:
        yield full
    finally:
        release(full)


def release(module: torch.nn.Module) -> None:
    """Free the memory of `module`'s parameters, keeping the parameter objects (so tied weights
    stay tied): their storage is resized to nothing until `gathered` fills it again."""
    for param in module.parameters():
        param.untyped_storage().resize_(0)


def gather_weights(sharded: torch.nn.Module, full: torch.nn.Module) -> None:
    """Copy the parameters of `sharded` (FSDP2 DTensor shards, or whole tensors) into the
    same-named parameters of the unsharded `full`. A collective: every rank calls it."""
    targets = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in sharded.named_parameters():
            targets[name].copy_(_whole(param))


def scatter_weights(full: torch.nn.Module, sharded: torch.nn.Module) -> None:
    """The inverse of `gather_weights`: each rank keeps its shard of `full`'s parameters (the
    same on every rank) in the same-named parameters of `sharded`."""
    sources = dict(full.named_parameters())
    with torch.no_grad():
        for name, param in sharded.named_parameters():
            param.copy_(_shard_like(sources[name], param))


def whole_state(state: object) -> object:
    """`state` (a state dict, nested dicts and lists) with every DTensor replaced by its whole
    tensor, so that one rank can write what all ranks hold. A collective when there are
    DTensors: every rank calls it."""
    if isinstance(state, dict):
        return {key: whole_state(value) for key, value in state.items()}
    if isinstance(state, list):
        return [whole_state(value) for value in state]
    return _whole(state) if isinstance(state, torch.Tensor) else state


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After `optimizer.load_state_dict` of a `whole_state`: turn each whole state tensor of
    a sharded (DTensor) parameter back into that parameter's shard."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape:
                    state[key] = _shard_like(value, param)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 2.4 keeps DTensor private, and has no FSDP2 here to make one
        return False
    return isinstance(tensor, DTensor)


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def _shard_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if not _is_dtensor(like) or _is_dtensor(whole):
        return whole
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements)


def _decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    layers = []
    for child in module.modules():
        if isinstance(child, torch.nn.ModuleList):
            layers.extend(child)
    return layers
