"""What the commands share: a run's config, the prompt format and the sampler of `oncurve eval`
and `oncurve sample`, and writing to stdout (`print_out`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from oncurve.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from oncurve.config import Config
    from oncurve.rollout import Sampler
    from oncurve.rollout.base import SamplingParams


def print_out(text: str, end: str = "\n") -> None:
    """`text` and `end` to stdout, flushed. A reader gone (`| head`, a closed pipe) leaves the
    rest unread, and the command goes on in silence to exit 0: the reader has what it wanted."""
    from oncurve.loop.progress import silence

    try:
        print(text, end=end, flush=True)
    except BrokenPipeError:
        silence(sys.stdout)


def run_config(args: argparse.Namespace) -> tuple[Config | None, str]:
    """The resolved config of the run the command follows, and the file it was read from:
    `--run RUN_DIR`'s config.yaml (filling in `--model` with the run's final model when it is
    not given, a local one `--revision` does not apply to); else, when `--model` is a
    checkpoint (`RUN/checkpoints/step-N`, or `RUN/checkpoints/latest`), the config its
    state.json was saved with; else, when it is a run's `final/` (`RUN/final` beside
    `RUN/config.yaml`), the run's config; else (None, ""). A run's final/ whose save was cut
    short, named either way, is a one-line error (`_check_final_whole`)."""
    from oncurve.config import load_run_config
    from oncurve.run.checkpoint import STATE_FILE, latest_checkpoint
    from oncurve.run.checkpoint_model import checkpoint_config, find_checkpoint

    if args.run_dir is None:
        if args.model is None:
            raise UserError("--model or --run is required")
        checkpoint = find_checkpoint(args.model)
        if checkpoint is not None:
            return checkpoint_config(checkpoint), str(checkpoint / STATE_FILE)
        # a run's final model formats prompts and samples as its run did
        model = Path(args.model)
        if model.name == "final" and (model.parent / "config.yaml").is_file():
            config = load_run_config(model.parent / "config.yaml")
            _check_final_whole(model, f"--model {args.model}", model.parent)
            return config, str(model.parent / "config.yaml")
        return None, ""
    path = Path(args.run_dir) / "config.yaml"
    if not path.is_file():
        raise UserError(f"--run {args.run_dir}: no config.yaml (not a run directory)")
    config = load_run_config(path)
    if args.model is None:
        if args.revision is not None:
            raise UserError(
                f"--revision applies to a Hugging Face Hub id only; --run {args.run_dir} loads "
                "its local final/"
            )
        final = Path(args.run_dir) / "final"
        if not final.exists():
            latest = latest_checkpoint(Path(args.run_dir))
            hint = f": name a checkpoint with --model {latest}" if latest else ""
            raise UserError(
                f"--run {args.run_dir}: no final/ model yet (the run has not finished){hint}"
            )
        _check_final_whole(final, f"--run {args.run_dir}", args.run_dir)
        args.model = str(final)
    return config, str(path)


def _check_final_whole(final: Path, given: str, run_dir: str | Path) -> None:
    """A one-line error, starting with `given` (the flag and its value), when the final/ model
    of the run in `run_dir` lacks a file or ends early (its save was cut short), saying how to
    write it again."""
    from oncurve.model.saving import missing_from_final

    missing = missing_from_final(final)
    if missing:
        raise UserError(
            f"{given}: final/ is incomplete ({missing}; its save was cut short): write it "
            f"again with oncurve train run.resume=auto run.dir={run_dir}"
        )


# the sampling settings besides max_new_tokens that a run or a model directory can carry
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How `oncurve eval` and `oncurve sample` sample, and where `max_new_tokens` came from
    (None: its flag)."""

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    new_tokens_from: str | None = None

    def params(self, max_new_tokens: int, seed: int | None) -> SamplingParams:
        """The sampler's settings: these, with `max_new_tokens` (as fitted) and `seed`."""
        from oncurve.rollout.base import SamplingParams

        return SamplingParams(
            max_new_tokens,
            min_new_tokens=min(self.min_new_tokens, max_new_tokens),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            stop=self.stop,
            seed=seed,
        )


def sampling(args: argparse.Namespace, config: Config | None, config_file: str) -> Sampling:
    """Each setting from its flag; else from the run's `config` (read from `config_file`: its
    rollout settings, the only source of `min_new_tokens` and `stop`); else from the model
    directory's generation_config.json (a run's final/ states what it trained with); else a
    run's default for the model (64 new tokens for `default`, else 256; temperature 1)."""
    from oncurve.config import build_config
    from oncurve.model.saving import GENERATION_FILE, read_generation_config

    if config is not None:
        rollout = config.rollout
        stated = {key: getattr(rollout, key) for key in ("max_new_tokens", *_SAMPLING_KEYS)}
        stated |= {"min_new_tokens": rollout.min_new_tokens, "stop": tuple(rollout.stop)}
        source = f"the run's rollout.max_new_tokens ({config_file})"
    else:
        stated = read_generation_config(args.model)
        source = f"{Path(args.model) / GENERATION_FILE}"
        if "max_new_tokens" not in stated:
            default = build_config({"model": {"path": args.model}}).rollout.max_new_tokens
            stated["max_new_tokens"] = default
            source = f"the default for {args.model}"
    given = {key: getattr(args, key, None) for key in ("max_new_tokens", *_SAMPLING_KEYS)}
    chosen = {key: stated[key] for key in stated if given.get(key) is None}
    chosen.update({key: value for key, value in given.items() if value is not None})
    chosen.setdefault("temperature", 1.0)
    from_flag = given["max_new_tokens"] is not None
    return Sampling(**chosen, new_tokens_from=None if from_flag else source)


def seed_of(args: argparse.Namespace, config: Config | None) -> int:
    """`--seed`, else the run's `run.seed` (its evaluations drew with it), else 0."""
    if args.seed is not None:
        return args.seed
    return config.run.seed if config is not None else 0


def fitted_new_tokens(chosen: Sampling, longest_prompt: int, model_config) -> int:
    """`chosen.max_new_tokens`, or when it came from a run or a model directory rather than
    `--max-new-tokens` and does not fit the model's positions after the longest prompt, the
    room there is, said in one line. A flag that does not fit is a one-line error."""
    from oncurve.rollout.base import check_room

    limit = getattr(model_config, "max_position_embeddings", None)
    room = chosen.max_new_tokens if limit is None else limit - longest_prompt
    if chosen.new_tokens_from is None or room <= 0 or chosen.max_new_tokens <= room:
        check_room(longest_prompt, chosen.max_new_tokens, model_config, "--max-new-tokens")
        return chosen.max_new_tokens
    print(
        f"oncurve: max_new_tokens {chosen.max_new_tokens} (from {chosen.new_tokens_from}) "
        f"does not fit after the longest prompt ({longest_prompt} tokens) in the model's "
        f"{limit} positions: using {room}",
        file=sys.stderr,
    )
    return room


def prompt_format(args: argparse.Namespace, config, tokenizer):
    """How prompts are formatted and answers read, as training does: the run's data settings
    under `--run`, else the defaults with the chat template when the tokenizer has one; the
    flags (`--chat-template`, `--system-prompt`, `--prompt-field`, ...) override either."""
    from oncurve.config import DataConfig

    data = config.data if config is not None else DataConfig()
    chat = args.chat_template
    if chat is None:
        chat = data.chat_template if config is not None else bool(tokenizer.chat_template)
    if chat and not tokenizer.chat_template:
        raise UserError("--chat-template: the tokenizer has no chat template")
    system = args.system_prompt if args.system_prompt is not None else data.system_prompt
    # `oncurve eval`'s data flags; `oncurve sample` has none
    given = {
        key: getattr(args, key)
        for key in ("prompt_field", "answer_field", "answer_format", "prompt_template", "config")
        if getattr(args, key, None) is not None
    }
    return dataclasses.replace(data, chat_template=chat, system_prompt=system, **given)


def load_sampler(
    args: argparse.Namespace, config: Config | None = None, config_file: str = ""
) -> tuple[Sampler, PreTrainedModel]:
    """The `--backend` sampler of the `--model` model, and the model. The code a model ships
    runs only with `--trust-remote-code`: a run's `model.trust_remote_code` (its `config`, read
    from `config_file`) was trust for its training, and is said in one note when the flag is
    absent. A checkpoint's policy is loaded on the base model its run started from
    (`load_checkpoint_model`)."""
    from oncurve.model.devices import resolve_device, resolve_dtype
    from oncurve.model.sources import load_model, load_tokenizer, resolve_model_path
    from oncurve.rollout import build_sampler
    from oncurve.run.checkpoint import STATE_FILE
    from oncurve.run.checkpoint_model import (
        checkpoint_config,
        find_checkpoint,
        load_checkpoint_model,
    )

    device = resolve_device(args.device, what="--device")
    dtype = resolve_dtype(args.dtype, device)
    trust = args.trust_remote_code
    checkpoint = find_checkpoint(args.model)
    if checkpoint is not None:
        if args.revision is not None:
            raise UserError(f"--revision applies to a Hub id; --model {args.model} is a checkpoint")
        # without --run, `config` is the checkpoint's own (`run_config`)
        saved = config if args.run_dir is None else checkpoint_config(checkpoint)
        _note_untrusted_run_code(saved, str(checkpoint / STATE_FILE), trust)
        model, tokenizer = load_checkpoint_model(
            checkpoint, saved, dtype, device, trust_remote_code=trust
        )
    else:
        path = resolve_model_path(args.model, args.revision, what="--model")
        if config is not None and _the_runs_model(args, config):
            _note_untrusted_run_code(config, config_file, trust)
        tokenizer = load_tokenizer(path, trust)
        model = load_model(path, dtype, device, trust_remote_code=trust)
    return build_sampler(args.backend, model, tokenizer, name="--backend"), model


def _note_untrusted_run_code(config: Config, config_file: str, trusted: bool) -> None:
    """The note that the run (`config`, read from `config_file`) trusted its model's code and
    this command, without `--trust-remote-code`, does not."""
    if config.model.trust_remote_code and not trusted:
        print(
            f"note: {config_file} sets model.trust_remote_code: true, which oncurve eval and "
            "sample do not follow: --trust-remote-code runs the code the run's model ships "
            "(for code you trust)",
            file=sys.stderr,
        )


def _the_runs_model(args: argparse.Namespace, config: Config) -> bool:
    """Whether `--model` (not a checkpoint) is the model of the run whose `config` the command
    follows: the run's final/ (`--model RUN/final`, or `--run RUN`'s) or the model it started
    from; a run's `model.trust_remote_code` was trust in its own model's code, no other's."""
    if args.run_dir is None or args.model == config.model.path:
        return True
    return Path(args.model).resolve() == (Path(args.run_dir) / "final").resolve()
