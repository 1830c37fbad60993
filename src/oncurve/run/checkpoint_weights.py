"""A checkpoint's weight files (safetensors): a module's state with each tensor stored once,
and loaded back in place; for LoRA, only the trainable tensors. Errors name the file."""

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from oncurve.errors import UserError


def _identity(tensor: torch.Tensor) -> tuple:
    """What two names of one tensor (tied weights) share, and two different tensors do not."""
    return (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())


def save_weights(module: nn.Module, file: str) -> None:
    """`module`'s state, each tensor once: a tensor under several names (tied weights) under
    the first. Tensors that are views into a larger storage (`cuda_graph.lay_out_projections`
    lays a layer's projections out in one) are stored as they are, which safetensors'
    `save_model` refuses."""
    names: dict[tuple, str] = {}
    state = module.state_dict()
    for name, tensor in state.items():
        names.setdefault(_identity(tensor), name)
    save_file({name: state[name] for name in names.values()}, file)


def load_weights(file: Path, module: nn.Module) -> None:
    """Copy the tensors `save_weights` stored into `module`'s, in place; a tied tensor may
    have been stored under any of its names (safetensors' `save_model` wrote earlier ones)."""
    if not file.is_file():
        raise UserError(f"checkpoint file {file} is missing")
    param = next(module.parameters(), None)
    device = str(param.device) if param is not None else "cpu"
    try:
        saved = load_file(file, device=device)
    except SafetensorError as err:
        raise UserError(f"checkpoint file {file} cannot be read: {err}") from None
    state = module.state_dict()
    aliases: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        aliases.setdefault(_identity(tensor), []).append(name)
    found, missing = {}, []
    for names in aliases.values():
        stored = [name for name in names if name in saved]
        if stored:
            found[stored[0]] = saved[stored[0]]
        else:
            missing += names
    unexpected = sorted(saved.keys() - state.keys())
    if missing or unexpected:
        differences = [
            _few(names, what)
            for names, what in ((missing, "missing"), (unexpected, "unexpected"))
            if names
        ]
        raise UserError(
            f"checkpoint file {file} does not match the model: {', '.join(differences)}"
        )
    try:
        module.load_state_dict(found, strict=False)
    except RuntimeError as err:
        reason = " ".join(str(err).split())
        raise UserError(f"checkpoint file {file} does not match the model: {reason}") from None


def _few(names: list[str], what: str) -> str:
    """`names` counted, the first three named: another model's checkpoint differs in hundreds."""
    more = ", ..." if len(names) > 3 else ""
    return f"{len(names)} {what} ({', '.join(names[:3])}{more})"


def trainable_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s parameters that require grad (a LoRA adapter's), by name, detached and
    contiguous as safetensors stores them."""
    return {
        name: p.detach().contiguous() for name, p in module.named_parameters() if p.requires_grad
    }


def load_trainable(file: Path, module: nn.Module) -> None:
    """Copy the tensors of a file of `trainable_tensors` into `module`, in place; UserError
    naming the file when it is missing, unreadable, or holds other names or shapes."""
    if not file.is_file():
        raise UserError(f"checkpoint file {file} is missing")
    expected = trainable_tensors(module)
    try:
        saved = load_file(file, device=str(next(iter(expected.values())).device))
    except SafetensorError as err:
        raise UserError(f"checkpoint file {file} cannot be read: {err}") from None
    if saved.keys() != expected.keys() or any(saved[k].shape != expected[k].shape for k in saved):
        raise UserError(
            f"checkpoint file {file} does not match the model's trainable parameters "
            f"({len(saved)} tensors saved, {len(expected)} trainable)"
        )
    module.load_state_dict(saved, strict=False)
