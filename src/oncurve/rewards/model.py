"""A learned reward model as a reward: `reward.functions: [{name: "model:PATH_OR_ID"}]`.

`PATH_OR_ID` is a local Hugging Face directory or a Hub model id holding a sequence-classification
model (`AutoModelForSequenceClassification`) with ONE output (`config.num_labels == 1`) and its
tokenizer. Each (prompt, completion) pair is scored by that logit, as a float:

- formatting: with a chat template in the reward tokenizer, the conversation
  `[{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]` rendered
  by that template (no generation prompt) and tokenized without adding special tokens (the
  template places them); without one, `prompt + completion` tokenized as the tokenizer does by
  default (e.g. with its BOS);
- truncation: to `max_length` tokens, the smaller of the tokenizer's `model_max_length` and the
  model's `max_position_embeddings` (when either is set), cutting from the LEFT: the start of the
  prompt goes first, and the end of the completion, where the head reads its score, stays;
- batching: `batch_rows` rows per forward (rows sorted by length, so that a batch pads little),
  right-padded with the reward tokenizer's pad token (its EOS when it has none, which then also
  becomes the model config's `pad_token_id`: Hugging Face's head reads the last token that is not
  padding); a row of no tokens at all scores None;
- the forward runs on the trainer's device (`run.device`), in `model.dtype`, in eval mode under
  `torch.no_grad()`; `trust_remote_code` follows `model.trust_remote_code`.

The reward runs in the trainer's process even when `reward.timeout` forks a worker for the other
rewards (`runs_in_process`, honoured by `RewardRunner`): a CUDA model cannot run in a forked
child, nor a multithreaded CPU forward safely. `reward.timeout` therefore does not apply to it.
Its weights count in the memory plan's model state (`memory_bytes`); the activations of its
forward, taken after sampling, do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from oncurve.errors import UserError

PREFIX = "model:"  # a `reward.functions` name with it is a reward model
BATCH_ROWS = 32
# tokenizers without a length limit report a huge `model_max_length` (int(1e30))
_NO_LIMIT = 10**9


def metric_name(source: str) -> str:
    """`model:<last part of the path or id>`, the reward's name (its metric is `reward/<name>`)."""
    last = Path(source.rstrip("/\\")).name or source
    return PREFIX + last


class RewardModel:
    """A sequence-classification model called with the reward protocol (module docstring)."""

    runs_in_process = True  # RewardRunner calls it in the trainer's process, never in its worker

    def __init__(
        self,
        source: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        trust_remote_code: bool = False,
        batch_rows: int = BATCH_ROWS,
    ) -> None:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        self.name = metric_name(source)
        self.device = torch.device(device)
        self.batch_rows = batch_rows
        self.model, self.tokenizer = _load(source, self.name, dtype, trust_remote_code)
        self.model.to(self.device).eval().requires_grad_(False)
        self.chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.max_length = _max_length(self.tokenizer, self.model.config)

    def format(self, prompt: str, completion: str) -> str:
        """The text the model reads for one (prompt, completion) pair."""
        if not self.chat_template:
            return prompt + completion
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": completion},
        ]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False
        )

    def encode(self, prompt: str, completion: str) -> list[int]:
        """Token ids of one pair, truncated from the left to `max_length`."""
        return self.tokenizer(
            self.format(prompt, completion),
            add_special_tokens=not self.chat_template,
            truncation=self.max_length is not None,
            max_length=self.max_length,
        )["input_ids"]

    def __call__(
        self, prompts: list[str], completions: list[str], **columns: Any
    ) -> list[float | None]:
        encoded = [self.encode(p, c) for p, c in zip(prompts, completions, strict=True)]
        scores: list[float | None] = [None] * len(encoded)
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
        pad = self.tokenizer.pad_token_id
        with torch.no_grad():
            for start in range(0, len(order), self.batch_rows):
                rows = order[start : start + self.batch_rows]
                width = max(len(encoded[i]) for i in rows)
                ids = torch.full((len(rows), width), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, i in enumerate(rows):
                    ids[r, : len(encoded[i])] = torch.tensor(encoded[i])
                    mask[r, : len(encoded[i])] = 1
                logits = self.model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
                ).logits
                for i, value in zip(rows, logits[:, 0].float().tolist(), strict=True):
                    scores[i] = value
        return scores

    def memory_bytes(self) -> int:
        """Bytes of the model's parameters (what it adds to the device's model state)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def _load(
    source: str, name: str, dtype: torch.dtype, trust_remote_code: bool
) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) of `source`, checked to have one output and a pad token."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    where = f"reward {PREFIX + source!r}"
    local = Path(source).expanduser()
    if local.is_dir():
        location = str(local)
    elif source.startswith(("/", ".", "~")) or local.exists():
        raise UserError(f"{where}: {source} is not a directory (a local Hugging Face model)")
    else:
        location = source  # a Hub model id
    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        what = (
            f"cannot load a model from {location}"
            if local.is_dir()
            else "neither a local directory nor a Hub model id that loads"
        )
        raise UserError(f"{where}: {what} ({_first_line(err)})") from None
    if config.num_labels != 1:
        raise UserError(
            f"{where}: the model's head has num_labels={config.num_labels}; a reward model "
            "scores with one logit (num_labels=1)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
        model = AutoModelForSequenceClassification.from_pretrained(
            location, config=config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as err:
        raise UserError(
            f"{where}: cannot load a model from {location} ({_first_line(err)})"
        ) from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"{where}: its tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    # the head reads the last token that is not the config's pad token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    return model, tokenizer


def _max_length(tokenizer: Any, config: Any) -> int | None:
    limits = [
        tokenizer.model_max_length,
        getattr(config.get_text_config(), "max_position_embeddings", None),
    ]
    limits = [n for n in limits if isinstance(n, int) and 0 < n < _NO_LIMIT]
    return min(limits) if limits else None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
