"""The policy's weights beside training: a frozen copy (pi_ref), weights offloaded to host
memory between passes, gradient checkpointing, LoRA adapters."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator

import torch

from oncurve.config import LoraConfig
from oncurve.errors import UserError, error_line


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with no gradients, for the reference policy."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


def offload_weights(module: torch.nn.Module) -> None:
    """Move a frozen module's parameters to host memory, pinned when CUDA is available (so
    that `weights_on` copies them back without waiting); buffers stay where they are. Where
    pinning fails (a container's locked-memory limit), one warning, and the rest stay in
    pageable memory, copied more slowly."""
    pin = torch.cuda.is_available()
    for param in module.parameters():
        host = param.data.to("cpu")
        if pin:
            try:
                host = host.pin_memory()
            except RuntimeError as error:
                pin = False
                print(
                    f"warning: pinning the reference's weights in host memory failed "
                    f"({error_line(error)}); they are copied to the GPU from pageable memory",
                    file=sys.stderr,
                )
        param.data = host


@contextlib.contextmanager
def weights_on(module: torch.nn.Module, device: torch.device) -> Iterator[torch.nn.Module]:
    """`module` with its host-resident parameters (`offload_weights`) copied to `device` for
    the duration; after it they are the host tensors again and the device copies are freed.
    Nothing is copied back: the module is frozen. Tied parameters are one parameter, copied
    once."""
    params = list(module.parameters())
    host = [param.data for param in params]
    try:
        for param, values in zip(params, host, strict=True):
            param.data = values.to(device, non_blocking=True, copy=True)
        yield module
    finally:
        for param, values in zip(params, host, strict=True):
            param.data = values


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in backward. HF only checkpoints in train mode, so the model goes
    to train mode with every dropout probability set to zero."""
    # transformers 5 renamed the method and deprecates the old name; older releases only have it.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop"):
        if hasattr(model.config, name):
            setattr(model.config, name, 0.0)


def add_lora(
    model: torch.nn.Module,
    lora: LoraConfig,
    hub_id: str | None = None,
    revision: str | None = None,
) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters (peft); only the adapters train. The adapter's config
    names its base as Hugging Face Hub model `hub_id` at commit `revision` when given (peft's
    `AutoPeftModelForCausalLM` loads the base from there), else as the directory the model
    was loaded from.

    Returns the peft wrapper. Its `get_base_model()` is the same HF causal LM with adapter
    layers injected, which the sampler and the training forward use as any other model; the
    wrapper's `disable_adapter()` turns it back into the frozen base, the reference policy,
    without a second copy of the weights.
    """
    try:
        import peft
    except ImportError:
        raise UserError("model.lora.r > 0 needs peft: pip install 'oncurve[lora]'") from None
    _check_targets(model, lora.target_modules)
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = peft.get_peft_model(model, config, revision=revision)
    except ValueError as err:
        # peft's message may hold a module's multi-line repr: all of it, on one line
        raise UserError(f"model.lora.target_modules: {' '.join(str(err).split())}") from None
    if hub_id is not None:
        # peft takes the folder the weights were read from: a Hub model's is this machine's
        # cache, which a saved adapter's config would then point at
        peft_model.peft_config["default"].base_model_name_or_path = hub_id
    return peft_model


# The layer types peft's LoRA adapts (`torch.nn.MultiheadAttention` too, which no causal LM of
# transformers uses); anything else, a block of layers (`mlp`) above all, peft refuses.
_ADAPTABLE = (
    torch.nn.Linear,
    torch.nn.Embedding,
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.MultiheadAttention,
)


def _adaptable(module: torch.nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    return isinstance(module, (*_ADAPTABLE, Conv1D))


def _linear_names(model: torch.nn.Module) -> str:
    """The names of `model`'s linear layers (GPT-2's Conv1D too) but the output head: what
    target_modules takes."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, Conv1D)) and module is not head
    }
    return ", ".join(sorted(names))


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """UserError naming `model.lora.target_modules` when a name matches no module (a default
    list on a model whose layers are named otherwise would adapt some and skip the rest), or a
    module LoRA cannot adapt (a block such as `mlp`, a norm), or names the output head (the
    training forward reads its weight: an adapter there never trains) or an input embedding
    tied to it (merged into final/, it would change the head)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    matched = set()
    for name, module in model.named_modules():
        hits = [t for t in targets if name == t or name.endswith(f".{t}")]
        if not hits:
            continue
        matched.update(hits)
        if module is head:
            raise UserError(
                f"model.lora.target_modules: {hits[0]!r} is the output head, which an adapter "
                "cannot train here (the forward reads the head's weight itself); leave it out"
            )
        if tied and module is embed:
            raise UserError(
                f"model.lora.target_modules: {hits[0]!r} is an embedding tied to the output "
                "head: merged into final/, its adapter would change the head too; leave it out"
            )
        if not _adaptable(module):
            raise UserError(
                f"model.lora.target_modules: {hits[0]!r} is a {type(module).__name__}, which "
                f"LoRA cannot adapt; name linear layers (this model's: {_linear_names(model)})"
            )
    unmatched = [t for t in targets if t not in matched]
    if unmatched and matched:
        raise UserError(
            f"model.lora.target_modules: {', '.join(unmatched)} match no module of this model "
            f"(its linear layers: {_linear_names(model)}); name the ones to adapt"
        )
