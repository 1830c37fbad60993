"""Loading a causal LM and its tokenizer, and saving the trained one.

A model comes from a local directory, from the Hugging Face Hub by id (`owner/name`, a snapshot
in the usual Hugging Face cache, pinned by a revision) or from a GGUF file, which transformers
dequantizes (extra `gguf`); `resolve_model_path` turns each into a local directory or `.gguf`
file that `load_model` and `load_tokenizer` read. `import_gguf` writes a GGUF file out as a
safetensors model directory once, so that later runs skip the dequantization.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import transformers
from packaging import version
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from oncurve.config import LoraConfig
from oncurve.data import HUB_ID
from oncurve.errors import UserError, error_line

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# the oldest transformers whose GGUF tokenizers come out right (the `gguf` extra asks for it)
GGUF_TRANSFORMERS = "5.18"
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
    # a GPU before Ampere (T4, V100) only emulates bfloat16, which torch counts as support
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return "bfloat16"
    return "float32"


# The top-level files of a Hub snapshot transformers loads a model from: config, safetensors
# weights, tokenizer, chat template, custom code; not the ONNX, GGUF, original or other-framework
# checkpoints many repositories hold besides (`*/*` leaves out every subfolder).
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]
HUB_SKIP = ["*/*"]


def resolve_model_path(path: str, revision: str | None = None, what: str = "model.path") -> Path:
    """The local directory or `.gguf` file that `path` (the setting `what`) names: `default` the
    bundled model; a local directory or `.gguf` file itself; else a Hub id (`owner/name`), whose
    snapshot at `revision` (null: main) is downloaded into the Hugging Face cache, or taken from
    there when it is cached (offline too). A local path always wins over a Hub id."""
    revision_name = "--revision" if what.startswith("--") else "model.revision"
    if path == "default":
        resolved = Path(str(resources.files("oncurve") / "assets" / "default"))
    else:
        resolved = Path(path).expanduser()
    if not is_hub_id(path):
        if revision is not None:
            raise UserError(
                f"{revision_name} applies to a Hugging Face Hub id only; {what} {path} is local"
            )
        return _local_model(path, resolved, what)
    return _hub_snapshot(path, revision, what, revision_name)


def is_hub_id(path: str) -> bool:
    """Whether `path` names a Hugging Face Hub model: `owner/name` with no local file or
    directory of that name (a local path always wins) and not a `.gguf` file."""
    local = Path(path).expanduser()
    return bool(HUB_ID.fullmatch(path)) and local.suffix != ".gguf" and not local.exists()


def _local_model(path: str, resolved: Path, what: str) -> Path:
    if resolved.suffix == ".gguf":
        if not resolved.is_file():
            raise UserError(f"{what} {path}: no such GGUF file")
        require_gguf(f"{what} {path} is a GGUF file, which")
        return resolved
    if not resolved.is_dir():
        raise UserError(
            f"{what} {path} is not a directory (a local Hugging Face model), a .gguf file or a "
            "Hugging Face Hub id (owner/name)"
        )
    if not (resolved / "config.json").is_file():
        raise UserError(f"{what} {path} has no config.json (not a Hugging Face model dir)")
    return resolved


def require_gguf(subject: str) -> None:
    """A one-line error unless the packages transformers reads GGUF files with are installed;
    `subject` starts the sentence ("model.path x.gguf is a GGUF file, which")."""
    try:
        import accelerate  # noqa: F401  (transformers asks for it when loading a GGUF file)
        import gguf  # noqa: F401
    except ImportError:
        raise UserError(f"{subject} needs the gguf package: pip install 'oncurve[gguf]'") from None
    # before 5.18 transformers reads a GGUF file's end-of-sequence token wrongly (its BOS)
    if version.parse(transformers.__version__) < version.parse(GGUF_TRANSFORMERS):
        raise UserError(
            f"{subject} needs transformers {GGUF_TRANSFORMERS} or later, which reads its special "
            f"tokens right (this is {transformers.__version__}): pip install 'oncurve[gguf]'"
        )


def _hub_snapshot(repo_id: str, revision: str | None, what: str, revision_name: str) -> Path:
    """The snapshot directory of Hub model `repo_id` in the Hugging Face cache, downloaded when
    missing; PyTorch `.bin` weights only for a repository without safetensors ones."""
    import huggingface_hub
    from huggingface_hub import errors

    def snapshot(patterns: list[str]) -> Path:
        return Path(
            huggingface_hub.snapshot_download(
                repo_id, revision=revision, allow_patterns=patterns, ignore_patterns=HUB_SKIP
            )
        )

    network = _network_errors()
    try:
        folder = snapshot(HUB_FILES)
        if not any(folder.glob("*.safetensors")) and (folder / "config.json").is_file():
            folder = snapshot([*HUB_FILES, "*.bin"])
    except errors.GatedRepoError:
        raise UserError(
            f"{what} {repo_id} is gated on the Hugging Face Hub: accept its terms at "
            f"https://huggingface.co/{repo_id} and log in (`hf auth login`)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise UserError(
            f"{what} {repo_id}: no such local directory, nor a model on the Hugging Face Hub "
            "(a private one needs `hf auth login`)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UserError(
            f"{revision_name} {revision}: no such branch, tag or commit in {repo_id}"
        ) from None
    except errors.HFValidationError:
        raise UserError(f"{what} {repo_id} is not a valid Hugging Face Hub id") from None
    except network:
        why = (
            "offline mode is on (HF_HUB_OFFLINE)"
            if huggingface_hub.constants.HF_HUB_OFFLINE
            else "the Hugging Face Hub cannot be reached"
        )
        pin = f" --revision {revision}" if revision else ""
        raise UserError(
            f"{what} {repo_id} is not in the local Hugging Face cache and {why}; download it "
            f"ahead on a machine with network (`hf download {repo_id}{pin}`) or set {what} to "
            "a local model directory"
        ) from None
    if not (folder / "config.json").is_file():
        raise UserError(
            f"{what} {repo_id} on the Hugging Face Hub has no config.json (not a transformers "
            "model; for a GGUF repository download the .gguf file and give its path)"
        )
    return folder


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a download raises when the Hub cannot be reached and nothing is cached: OSError
    (huggingface_hub's own errors, requests'), and httpx's errors where the hub client uses it."""
    found: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(module).HTTPError)
    return tuple(found)


def hub_commit(path: Path) -> str | None:
    """The commit of a Hub snapshot directory `path` (the cache keeps one folder per commit
    under `snapshots/`), or None for any other path."""
    if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name):
        return path.name
    return None


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
    """The tokenizer of a model directory or GGUF file, with a pad token and left padding for
    prompts."""
    path = Path(path)
    tokenizer = _pretrained_tokenizer(path, trust_remote_code)
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


def _pretrained_tokenizer(path: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained` of a directory or, with its vocabulary, merges, special
    tokens and chat template, of a GGUF file."""
    where, gguf = _pretrained_source(path)
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code, **gguf)
    except (OSError, ValueError, ImportError) as err:
        raise UserError(
            f"cannot load a tokenizer from {path}: {str(err).splitlines()[0]}"
        ) from None


def _pretrained_source(path: Path) -> tuple[Path, dict[str, Any]]:
    """`from_pretrained`'s directory and keyword arguments for a model directory or GGUF file."""
    if path.suffix == ".gguf" and path.is_file():
        return path.parent, {"gguf_file": path.name}
    return path, {}


def _model_vocab_size(path: Path) -> float:
    """The model's embedding rows from its config.json (inf when it does not say, and for a
    GGUF file, whose vocabulary is the tokenizer's own).

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
    """A causal LM in eval mode (dropout off: RL's ratio must compare like with like), from a
    model directory or a GGUF file (dequantized: its weights train like any other's)."""
    path = Path(path)
    where, extra = _pretrained_source(path)
    if extra:
        extra.update(_dequantized_gguf())
    try:
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code, **extra
        )
    except (OSError, ValueError, ImportError) as err:
        raise UserError(f"cannot load a model from {path}: {str(err).splitlines()[0]}") from None
    if extra:
        _drop_gguf_quantizer(model)
    return model.to(device).eval()


def _dequantized_gguf() -> dict[str, Any]:
    """`from_pretrained` arguments that unpack every GGUF weight into a dense tensor.
    Transformers 5.24 can keep a GGUF's blocks packed (inference only) for the architectures of
    its newer loader; earlier releases always dequantize and know no `GgufConfig`."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _drop_gguf_quantizer(model: torch.nn.Module) -> None:
    """Forget the GGUF quantizer a dequantized model may keep: its weights are dense, and the
    quantizer would mark it untrainable and refuse to save it."""
    packed = [name for name, p in model.named_parameters() if not p.is_floating_point()]
    if packed:
        raise UserError(f"GGUF weights stayed packed ({packed[0]}); cannot train them")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if "quantization_config" in vars(model.config):
        delattr(model.config, "quantization_config")
    if getattr(model, "is_quantized", False):
        model.is_quantized = False


def import_gguf(file: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write GGUF file `file` as a safetensors model directory `out` (config, weights in
    `dtype`, tokenizer with its chat template, generation config) that
    `AutoModelForCausalLM.from_pretrained(out)` loads. `out` must not exist or be empty; the
    directory appears whole or not at all."""
    source = Path(file).expanduser()
    target = Path(out).expanduser()
    if source.suffix != ".gguf":
        raise UserError(f"{file} is not a .gguf file")
    if not source.is_file():
        raise UserError(f"{file}: no such GGUF file")
    require_gguf(f"importing {file}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out {out} exists and is not empty; give a new directory")
    tokenizer = _pretrained_tokenizer(source, trust_remote_code=False)
    model = load_model(source, dtype)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    )
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o777 & ~umask)  # mkdtemp's is 0700; the directory is an ordinary one
    try:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        if target.exists():
            target.rmdir()
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


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


def save_final(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """A directory that `AutoModelForCausalLM.from_pretrained` loads as is (safetensors),
    written whole or not at all (`_written_whole`)."""
    with _written_whole(out) as partial:
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)


def missing_from_final(final: Path) -> str | None:
    """What keeps `final` from being a whole saved model (its config, its tokenizer, every
    weights file it names, each readable as safetensors), None when nothing does: a final model
    written before it was written whole can lack files or end early."""
    if not (final / "config.json").is_file():
        return "no config.json"
    if not (final / "tokenizer_config.json").is_file():
        return "no tokenizer_config.json"
    index = final / "model.safetensors.index.json"
    try:
        names = (
            sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if index.is_file()
            else ["model.safetensors"]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"an unreadable {index.name}"
    for name in names:
        try:
            with safe_open(final / name, framework="pt"):
                pass
        except (OSError, SafetensorError, ValueError):
            return f"no readable {name}"
    return None


@contextlib.contextmanager
def _written_whole(out: Path) -> Iterator[Path]:
    """A hidden directory beside `out` to write into, renamed to `out` when the block ends: a
    full disk or a file-size limit never leaves a partial model at `out`, only a one-line
    CheckpointError that says the run's checkpoints are kept."""
    from oncurve.checkpoint import CheckpointError

    out = Path(out)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    trash = out.parent / f".{out.name}.trash-{os.getpid()}"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        yield partial
        if out.exists():
            os.replace(out, trash)
        os.replace(partial, out)
    except (OSError, RuntimeError, SafetensorError) as err:
        shutil.rmtree(partial, ignore_errors=True)
        if trash.exists() and not out.exists():
            os.replace(trash, out)
        reason = " ".join(str(err).split())[:300]
        raise CheckpointError(
            f"cannot write the final model {out}: {reason}; the run's checkpoints are kept "
            f"(resume with run.resume=auto run.dir={out.parent} to write it again)"
        ) from None
    shutil.rmtree(trash, ignore_errors=True)


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
    # merged on a CPU copy: a second copy of the model on the GPU is memory the run never had
    device = next(peft_model.parameters()).device
    merged = copy.deepcopy(peft_model.to("cpu")).merge_and_unload()
    peft_model.to(device)
    with _written_whole(out) as partial:
        if adapter:
            peft_model.save_pretrained(partial / "adapter")
        merged.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
