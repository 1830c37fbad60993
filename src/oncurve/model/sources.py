"""Where a model comes from: a local directory, `default` (the bundled model), a Hugging Face
Hub id (downloaded into its cache, or read from it offline) or a GGUF file; the tokenizer and
the causal LM loaded from it."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from packaging import version
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from oncurve.data.files import HUB_ID
from oncurve.errors import UserError
from oncurve.model.devices import DTYPES
from oncurve.run.durable_files import follow_umask

# the oldest transformers whose GGUF tokenizers come out right (the `gguf` extra asks for it)
GGUF_TRANSFORMERS = "5.18"


# The top-level files of a Hub snapshot transformers loads a model from: config, safetensors
# weights, tokenizer, chat template, custom code; not the ONNX, GGUF, original or other-framework
# checkpoints many repositories hold besides (`*/*` leaves out every subfolder), nor PyTorch
# `.bin` weights, which are pickles: loading one unpickles a file from the network.
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
        hint = ""
        if (resolved / "config.yaml").is_file():
            hint = f"; a run directory: --run {path}, or its final/"
        elif (resolved / "adapter_config.json").is_file():
            hint = (
                "; it is a LoRA adapter (adapter_config.json): give a model with the adapter "
                "merged in (a LoRA run's final/ is one)"
            )
        raise UserError(f"{what} {path} has no config.json (not a Hugging Face model dir){hint}")
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
    missing; a one-line error for a repository without safetensors weights."""
    import huggingface_hub
    from huggingface_hub import errors

    network = _network_errors()
    try:
        folder = Path(
            huggingface_hub.snapshot_download(
                repo_id, revision=revision, allow_patterns=HUB_FILES, ignore_patterns=HUB_SKIP
            )
        )
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
    if not any(folder.glob("*.safetensors")):
        raise UserError(
            f"{what} {repo_id} on the Hugging Face Hub has no safetensors weights; oncurve does "
            "not load PyTorch .bin weights (pickles, which can run code when loaded): pick a "
            f"revision or copy that has them, or {_CONVERT}"
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


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model directory or GGUF file, with a pad token and left padding for
    prompts; a UserError when it has more tokens than the model's embedding has rows."""
    path = Path(path)
    tokenizer = _pretrained_tokenizer(path, trust_remote_code)
    # With no tokenizer files transformers 5 builds the model type's tokenizer class with an
    # empty vocabulary, which encodes every prompt to nothing.
    if not tokenizer("a 1", add_special_tokens=False)["input_ids"]:
        raise UserError(f"tokenizer in {path} encodes text to no tokens: no tokenizer files there?")
    vocab = _model_vocab_size(path)
    # the EOS and pad tokens transformers fills in past the embedding count as missing (below)
    filled_in = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    if len(tokenizer) > vocab and set(range(vocab, len(tokenizer))) - filled_in:
        raise UserError(
            f"tokenizer in {path} has {len(tokenizer)} tokens, more than the {vocab} rows of the "
            f"model's embedding (vocab_size in config.json): a token past id {vocab - 1} has none"
        )
    if tokenizer.eos_token_id is None or tokenizer.eos_token_id >= vocab:
        raise UserError(f"tokenizer in {path} has no EOS token; completions could never end")
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id >= vocab:
        print(f"note: tokenizer in {path} has no pad token; using EOS for padding", file=sys.stderr)
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if not trust_remote_code and path.is_dir() and _auto_map(path, "tokenizer_config.json"):
        _say_code_left_out(path, "tokenizer", "tokenizer_config.json", type(tokenizer).__name__)
    return tokenizer


def _say_code_left_out(path: Path, what: str, file: str, used: str) -> None:
    """The start-up note for custom code a model directory ships and transformers' own class
    stands in for (it runs only when trusted)."""
    print(
        f"note: {path} ships its own {what} code (auto_map in {file}), which does not run: this "
        f"is transformers' own {used} (to run that code, for code you trust: "
        f"{_REMOTE_CODE_SETTING})",
        file=sys.stderr,
    )


def _pretrained_tokenizer(path: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained` of a directory or, with its vocabulary, merges, special
    tokens and chat template, of a GGUF file."""
    where, gguf = _pretrained_source(path)
    errors = (OSError, ValueError, ImportError) + (_GGUF_ERRORS if gguf else ())
    try:
        if not gguf:
            _check_config(path, trust_remote_code)
        return AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code, **gguf)
    except UserError:
        raise
    except errors as err:
        raise UserError(
            f"cannot load a tokenizer from {path}: {_load_failure(err, bool(gguf))}"
        ) from None


# What a damaged weights file raises in `from_pretrained` (safetensors' header errors, a shape
# mismatch), beside a missing or unreadable one; and a GGUF file without a field it needs, or
# cut short (the gguf reader unpacks its header with `struct`).
_LOAD_ERRORS = (OSError, ValueError, ImportError, RuntimeError, SafetensorError)
_GGUF_ERRORS = (KeyError, TypeError, AttributeError, struct.error)

_CONVERT = (
    "convert it to safetensors on a machine where you trust the file: load it with its "
    "transformers class's from_pretrained(DIR) (AutoModelForCausalLM for a policy) and save it "
    "with save_pretrained(NEW_DIR, safe_serialization=True)"
)
_REMOTE_CODE_SETTING = "model.trust_remote_code=true (--trust-remote-code for oncurve sample/eval)"


def _load_failure(err: BaseException, gguf: bool) -> str:
    """Why `from_pretrained` failed, in one line: transformers' first line, or what it means."""
    message = str(err)
    if gguf and (isinstance(err, struct.error) or "cannot reshape array" in message):
        # the gguf reader's view of a file that ends before its header or tensors do
        return f"the GGUF file is truncated or damaged ({_first(err)})"
    if "trust_remote_code" in message:
        return (
            f"it ships its own Python code (auto_map), which runs only with "
            f"{_REMOTE_CODE_SETTING}; set that only for code you trust"
        )
    if "ignore_mismatched_sizes" in message:
        return "a weight's shape is not the one its config.json gives"
    return _first(err)


def _first(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _check_config(path: Path, trust_remote_code: bool) -> None:
    """A one-line UserError naming model directory `path`'s config.json when it is not a JSON
    object or transformers cannot build a config of it (a field of the wrong type, an unknown
    dtype), which transformers raises as a TypeError, AttributeError or its dataclass error.
    A missing or unparsable file, an unknown model type, custom code: what `from_pretrained`
    raises for those (OSError, ValueError), which its caller words."""
    file = path / "config.json"
    try:
        stated = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # `from_pretrained` says what is wrong with the file
    if not isinstance(stated, dict):
        raise UserError(f"{file}: not a JSON object")
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (TypeError, AttributeError, StrictDataclassError) as err:
        raise UserError(f"{file}: {' '.join(str(err).split())}") from None


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
    model directory with safetensors weights (never pickled `.bin` ones) or a GGUF file
    (dequantized: its weights train like any other's)."""
    path = Path(path)
    where, extra = _pretrained_source(path)
    gguf = bool(extra)
    if gguf:
        extra.update(_dequantized_gguf())
    else:
        if path.is_dir():
            require_safetensors(path)
        # never fall back on PyTorch `.bin` (pickle) or other-framework weights
        extra["use_safetensors"] = True
    errors = _LOAD_ERRORS + (_GGUF_ERRORS if gguf else ())
    try:
        if not gguf:
            _check_config(path, trust_remote_code)
        model, loading = AutoModelForCausalLM.from_pretrained(
            where,
            dtype=DTYPES[dtype],
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **extra,
        )
    except UserError:
        raise
    except errors as err:
        raise UserError(f"cannot load a model from {path}: {_load_failure(err, gguf)}") from None
    # transformers initialises what the files lack at random and only logs it: a model that is
    # not the one named
    missing = loading.get("missing_keys") or loading.get("mismatched_keys")
    if missing:
        names = sorted(str(key if isinstance(key, str) else key[0]) for key in missing)
        raise UserError(
            f"cannot load a model from {path}: its weight files are missing {len(names)} of its "
            f"tensors ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        )
    # and drops what they hold beyond it (after its own list of what to ignore): a tensor of
    # the network itself (a layer config.json leaves out) makes it another model; one outside
    # it is a head of another task (TRL's value head), which a policy has no use for
    body = f"{model.base_model_prefix}."
    unused = sorted(key for key in loading.get("unexpected_keys") or () if key.startswith(body))
    if unused:
        raise UserError(
            f"cannot load a model from {path}: its weight files hold {len(unused)} tensors its "
            f"config.json has no place for ({', '.join(unused[:3])}"
            f"{', ...' if len(unused) > 3 else ''}): it describes another model than they are"
        )
    if gguf:
        _drop_gguf_quantizer(model)
    elif not trust_remote_code and _auto_map(path):
        _say_code_left_out(path, "model", "config.json", type(model).__name__)
    return model.to(device).eval()


def require_safetensors(path: Path) -> None:
    """A one-line error unless model directory `path` holds safetensors weights: the others
    (`pytorch_model.bin`, `.pt`, `.ckpt`) are pickles, and oncurve unpickles no user's file."""
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    found = (
        f", only {', '.join(pickles[:3])} (PyTorch pickles, which can run code when loaded: "
        "oncurve loads none)"
        if pickles
        else " (no *.safetensors file)"
    )
    raise UserError(
        f"cannot load a model from {path}: it has no safetensors weights{found}; {_CONVERT}"
    )


def _auto_map(path: Path, file: str = "config.json") -> dict[str, Any]:
    """The `auto_map` of model directory `path`'s `file` (config.json, tokenizer_config.json):
    the custom classes it names."""
    try:
        config = json.loads((path / file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    return auto_map if isinstance(auto_map, dict) else {}


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
    `AutoModelForCausalLM.from_pretrained(out)` loads. `out` must not exist or be empty (a
    link to an empty directory is written through); the directory appears whole or not at
    all."""
    source = Path(file).expanduser()
    # the directory behind a link: the new one is renamed over it (a rename over the link
    # itself fails, a link not being a directory)
    given = Path(out).expanduser()
    target = given.resolve()
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
        follow_umask(partial)
        if target.exists():
            target.rmdir()
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return given
