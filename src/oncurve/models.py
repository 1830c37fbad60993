"""Loading a causal LM and its tokenizer from a local directory, and saving the trained one."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from oncurve.config import LoraConfig
from oncurve.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# glibc serves blocks over its mmap threshold (32 MB at most) by a fresh mapping whose every
# 4 KB page the kernel zeroes on first touch, and gives freed heap above twice that threshold
# back; at 16 MB per activation a microbatch's tensors stay in a heap that is reused.
CPU_ACTIVATION_BYTES = 16 * 2**20


def resolve_device(name: str, what: str = "run.device") -> torch.device:
    """The device `name` (the setting `what`) names; `auto` is the GPU when torch sees one."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"{what} must be cpu, cuda, cuda:N or auto, got {name!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"{what}={name}, but this torch ({torch.__version__}) sees no CUDA device; "
            f"use {what}=cpu or auto"
        )
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise UserError(
                f"{what}={name}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
        torch.cuda.set_device(device)
    return device


def cap_gpu_memory(device: torch.device, gib: float) -> None:
    """Cap this process's allocations on `device` at `gib` GiB, as on a card of that size: the
    caching allocator raises out-of-memory beyond it."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total), device)


def resolve_dtype(name: str, device: torch.device) -> str:
    """`model.dtype`: `auto` is bfloat16 on a CUDA device that computes in it, else float32."""
    if name != "auto":
        return name
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def resolve_model_path(path: str) -> Path:
    """`default` names the bundled model; anything else must be an existing local directory."""
    if path == "default":
        return Path(str(resources.files("oncurve") / "assets" / "default"))
    resolved = Path(path).expanduser()
    if not resolved.is_dir():
        raise UserError(f"model.path {path} is not a directory (a local Hugging Face model)")
    if not (resolved / "config.json").is_file():
        raise UserError(f"model.path {path} has no config.json (not a Hugging Face model dir)")
    return resolved


def real_token_positions(mask: torch.Tensor) -> torch.Tensor:
    """`[N, L]` position ids that count real tokens only (0 on left padding) from a `[N, L]`
    attention mask: a left-padded prompt sees the positions an unpadded one does, in the
    sampler and in the training forward alike."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_argument(trunk: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`{name: cache}` for `trunk`'s forward: transformers 5.24 renamed `past_key_values` to
    `cache` (the old name warns on every call and goes in 5.40); earlier releases and remote
    code know only the old name."""
    return {_cache_parameter(type(trunk)): cache}


@functools.cache
def _cache_parameter(trunk_class: type) -> str:
    parameters = inspect.signature(trunk_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def microbatch_tokens(model: torch.nn.Module, configured: int | None) -> int:
    """Tokens per microbatch (0: no cap): `configured` when set, else on CPU as many as keep a
    layer's widest activation, `[tokens, max(hidden, intermediate)]`, within
    `CPU_ACTIVATION_BYTES`, and no cap on an accelerator.

    The cap follows the width rather than being a fixed token count: a wide model's activations
    past glibc's mmap threshold pay for freshly zeroed pages on every microbatch, while a fixed
    cap small enough for a wide model cuts a narrow one into so many microbatches that their
    per-microbatch overhead dominates the update.
    """
    if configured is not None:
        return configured
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu":
        return 0
    config = model.config
    hidden = config.hidden_size
    widest = max(hidden, getattr(config, "intermediate_size", None) or 4 * hidden)
    return max(1, CPU_ACTIVATION_BYTES // (widest * weight.element_size()))


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model directory, with a pad token and left padding for prompts."""
    path = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load a tokenizer from {path}: {str(err).splitlines()[0]}"
        ) from None
    # With no tokenizer files transformers 5 builds the model type's tokenizer class with an
    # empty vocabulary, which encodes every prompt to nothing.
    if not tokenizer("a 1", add_special_tokens=False)["input_ids"]:
        raise UserError(f"tokenizer in {path} encodes text to no tokens: no tokenizer files there?")
    vocab = _model_vocab_size(path)
    if tokenizer.eos_token_id is None or tokenizer.eos_token_id >= vocab:
        raise UserError(f"tokenizer in {path} has no EOS token; completions could never end")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id >= vocab:
        print(f"note: tokenizer in {path} has no pad token; using EOS for padding", file=sys.stderr)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _model_vocab_size(path: Path) -> float:
    """The model's embedding rows from its config.json (inf when it does not say).

    Transformers picks the tokenizer class from the model type and fills in that class's default
    EOS and pad tokens (Qwen2: `<|endoftext|>`) when the tokenizer files name none, adding them
    at an id the model cannot embed; such a token counts as missing.
    """
    try:
        vocab = json.loads((path / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return math.inf
    return vocab if isinstance(vocab, int) else math.inf


def load_model(
    path: str | Path,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """A causal LM in eval mode (dropout off: RL's ratio must compare like with like)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load a model from {path}: {str(err).splitlines()[0]}") from None
    return model.to(device).eval()


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with no gradients, for the reference policy."""
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    return reference


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


def save_final(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """A directory that `AutoModelForCausalLM.from_pretrained` loads as is (safetensors)."""
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def add_lora(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters (peft); only the adapters train.

    Returns the peft wrapper. Its `get_base_model()` is the same HF causal LM with adapter
    layers injected, which the sampler and the training forward use as any other model; the
    wrapper's `disable_adapter()` turns it back into the frozen base, the reference policy,
    without a second copy of the weights.
    """
    try:
        import peft
    except ImportError:
        raise UserError("model.lora.r > 0 needs peft: pip install 'oncurve[lora]'") from None
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as err:
        raise UserError(f"model.lora.target_modules: {str(err).splitlines()[0]}") from None


def save_lora_final(
    peft_model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path, adapter: bool
) -> None:
    """`out` gets the merged model (base + adapter), loadable without peft; `out/adapter` the
    adapter alone when asked."""
    if adapter:
        peft_model.save_pretrained(out / "adapter")
    merged = copy.deepcopy(peft_model).merge_and_unload()
    save_final(merged, tokenizer, out)
