"""A learned reward model as a reward: `reward.functions: [{name: "model:PATH_OR_ID"}]`.

`PATH_OR_ID` is a local Hugging Face directory or a Hub model id holding a sequence-classification
model (`AutoModelForSequenceClassification`) with ONE output (`config.num_labels == 1`) and its
tokenizer. Each (prompt, completion) pair is scored by that logit, as a float:

- formatting: with a chat template in the reward tokenizer, the conversation the policy was given (a
  conversational row's messages, `prompt_messages`, with the system prompt the data section added;
  else `[{"role": "user", "content": prompt}]` after `system_prompt`, the data section's, when set)
  and then `{"role": "assistant", "content": completion}` (where the messages end in the
  assistant's, a prefill the policy continued, that one message with the completion after its
  content instead), rendered by that template (no generation prompt) with whatever it does to
  the answer (Qwen3's splits the reasoning off at `</think>` and writes it again in
  `<think>\n...\n</think>\n\n`; others trim it, or drop the turn); without one, `prompt`
  tokenized as the tokenizer does by default (e.g. with its BOS) and then the completion. The
  completion is tokenized as text: the policy decodes without special tokens, so a control token
  spelled in it was sampled as ordinary tokens, and it stays so (a completion cannot forge a turn
  the reward model reads); only the template's own control tokens, and those the prompt's
  messages (a prefill's too) hold, are control tokens;
- truncation: to `max_length` tokens, the smaller of the tokenizer's `model_max_length` and the
  model's `max_position_embeddings` (when either is set). A row over it loses the start of its
  completion (of the answer as the template renders it, past the text the template writes before
  any answer, a prefill's included): the prompt, and the end of the completion where the head
  reads its score, stay; a prefill the template rewrites with the completion (Qwen3's, when the
  completion holds `</think>`) is part of that answer and may be cut with its start. When the
  prompt alone leaves the completion no room, the start of the whole text goes. The share
  of rows cut is logged as `<name>/cut_frac`;
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

import functools
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from oncurve.errors import UserError, first_line
from oncurve.rewards.trl_contract import MESSAGES_COLUMN

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
    takes_context = True  # its log_metric, for the share of rows cut

    def __init__(
        self,
        source: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        trust_remote_code: bool = False,
        system_prompt: str | None = None,
        batch_rows: int = BATCH_ROWS,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        self.name = metric_name(source)
        self.device = torch.device(device)
        self.batch_rows = batch_rows
        self.system_prompt = system_prompt  # `data.system_prompt`: before a text prompt
        # `data.chat_template_kwargs`: TRL renders a reward model's conversations with them too
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.model, self.tokenizer = _load(source, self.name, dtype, trust_remote_code)
        self.model.to(self.device).eval().requires_grad_(False)
        self.chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        # the tokens `split_special_tokens` spells out as text
        special = {
            token_id: token.content
            for token_id, token in self.tokenizer.added_tokens_decoder.items()
            if token.special
        }
        self._special_ids = frozenset(special) | frozenset(self.tokenizer.all_special_ids)
        self._special_tokens = sorted(  # longest first: one may hold another
            set(special.values()) | set(self.tokenizer.all_special_tokens), key=len, reverse=True
        )
        self.max_length = _max_length(self.tokenizer, self.model.config)

    def encode(
        self, prompt: str, completion: str, messages: list[dict[str, str]] | None = None
    ) -> list[int]:
        """Token ids of one pair (the module docstring's formatting), at most `max_length`."""
        return _fit(*self._pieces(prompt, completion, messages), self.max_length)[0]

    def _pieces(
        self, prompt: str, completion: str, messages: list[dict[str, str]] | None
    ) -> tuple[list[int], list[int], list[int]]:
        """Token ids before the completion's part of the text, of that part, and after it."""
        tokenizer = self.tokenizer
        body = tokenizer(completion, add_special_tokens=False, split_special_tokens=True)
        if not self.chat_template:
            return tokenizer(prompt)["input_ids"], body["input_ids"], []
        if messages is None:
            system = (
                [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            )
            messages = [*system, {"role": "user", "content": prompt}]
        # the template's text around an answer it leaves as it is (a random mark stands for it)
        mark = f"oncurve-completion-{secrets.token_hex(8)}"
        # all of it is `before` when the template dropped the answer
        before, _, after = self._render(messages, mark).partition(mark)
        # the control tokens the completion spells are replaced by random stand-ins while the
        # template runs, so that every control token in its rendering is the template's own
        stand_ins = {f"oncurve-special-{secrets.token_hex(8)}": t for t in self._special_tokens}
        shielded = completion
        for stand_in, token in stand_ins.items():
            shielded = shielded.replace(token, stand_in)
        rendered = self._render(messages, shielded)
        if rendered == before + shielded + after:
            encode = functools.partial(tokenizer, add_special_tokens=False)
            return encode(before)["input_ids"], body["input_ids"], encode(after)["input_ids"]
        # the template changed the answer (split off its reasoning, trimmed it, dropped it): the
        # model reads the template's rendering, whose answer part is what differs from `before`
        # and `after`
        text, ids, spans = self._tokenize_rendering(rendered, stand_ins)
        head = len(os.path.commonprefix([text, before]))
        tail = len(os.path.commonprefix([text[head:][::-1], after[::-1]]))
        head_ids = sum(1 for _, end in spans if end <= head)
        tail_ids = sum(1 for start, _ in spans[head_ids:] if start >= len(text) - tail)
        return ids[:head_ids], ids[head_ids : len(ids) - tail_ids], ids[len(ids) - tail_ids :]

    def _render(self, messages: list[dict[str, str]], answer: str) -> str:
        """The chat template's text (no generation prompt) of `messages` answered by `answer`:
        in a new assistant message, or, where they end in the assistant's message (a prefill,
        which the policy continued), in that message after its content."""
        *context, last = messages
        if last["role"] == "assistant":
            conversation = [*context, {**last, "content": last["content"] + answer}]
        else:
            conversation = [*messages, {"role": "assistant", "content": answer}]
        return self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=False, **self.chat_template_kwargs
        )

    def _tokenize_rendering(
        self, rendered: str, stand_ins: dict[str, str]
    ) -> tuple[str, list[int], list[tuple[int, int]]]:
        """The text of `rendered` with each stand-in back as the control token it stands for,
        its token ids, and each token's character span in that text. The rendering's own control
        tokens are control tokens; those the stand-ins bring back are tokenized as text, together
        with the text around them (as the completion's body is)."""
        tokenizer = self.tokenizer
        # the tokenizer's own split finds the template's control tokens (with any whitespace
        # they strip); the text between them is tokenized again with the control tokens back
        encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
        if "offset_mapping" not in encoded:  # Python tokenizers give none
            raise UserError(
                f"reward {self.name!r}: its chat template rewrites the answer, and reading the "
                f"rewritten text needs character offsets, which its tokenizer "
                f"({type(tokenizer).__name__}) does not give; use a fast (tokenizers) tokenizer"
            )
        pieces: list[tuple[str, int | None]] = []  # (text, the id of a control token or None)
        done = 0
        for token_id, (start, end) in zip(
            encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            if token_id in self._special_ids:
                pieces += [(rendered[done:start], None), (rendered[start:end], token_id)]
                done = end
        pieces.append((rendered[done:], None))
        text, ids, spans = "", [], []
        for piece, token_id in pieces:
            if token_id is not None:
                ids.append(token_id)
                spans.append((len(text), len(text) + len(piece)))
                text += piece
                continue
            for stand_in, token in stand_ins.items():
                piece = piece.replace(stand_in, token)
            if piece:
                plain = tokenizer(
                    piece,
                    add_special_tokens=False,
                    split_special_tokens=True,
                    return_offsets_mapping=True,
                )
                ids += plain["input_ids"]
                spans += [(len(text) + a, len(text) + b) for a, b in plain["offset_mapping"]]
                text += piece
        return text, ids, spans

    def __call__(
        self,
        prompts: list[str],
        completions: list[str],
        *,
        log_metric: Callable[[str, float], None] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        conversations = columns.get(MESSAGES_COLUMN) or [None] * len(prompts)
        fitted = [
            _fit(*self._pieces(p, c, m), self.max_length)
            for p, c, m in zip(prompts, completions, conversations, strict=True)
        ]
        encoded = [ids for ids, _ in fitted]
        if log_metric is not None and fitted:
            log_metric(f"{self.name}/cut_frac", sum(cut for _, cut in fitted) / len(fitted))
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
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from oncurve.model.sources import require_safetensors

    where = f"reward {PREFIX + source!r}"
    local = Path(source).expanduser()
    if local.is_dir():
        location = str(local)
        try:
            require_safetensors(local)
        except UserError as err:
            raise UserError(f"{where}: {err}") from None
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
        raise UserError(f"{where}: {what} ({first_line(err)})") from None
    except (TypeError, AttributeError, StrictDataclassError) as err:
        # a config.json transformers cannot build: not an object, a field of the wrong type,
        # an unknown dtype
        raise UserError(f"{where}: {location}'s config.json: {first_line(err)}") from None
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise UserError(
            f"{where}: {location} is a {architectures[0]}, not a sequence-classification model "
            "(AutoModelForSequenceClassification) with a trained score head"
        )
    if config.num_labels != 1:
        raise UserError(
            f"{where}: the model's head has num_labels={config.num_labels}; a reward model "
            "scores with one logit (num_labels=1)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
        model, loading = AutoModelForSequenceClassification.from_pretrained(
            location,
            config=config,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            use_safetensors=True,  # never PyTorch `.bin` weights: pickles, which can run code
        )
    except (OSError, ValueError) as err:
        raise UserError(
            f"{where}: cannot load a model from {location} ({first_line(err)})"
        ) from None
    missing = sorted(loading.get("missing_keys") or ())
    if missing:  # transformers initialises them at random: the scores would be noise
        raise UserError(
            f"{where}: {location} has no weights for {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''} (not a trained sequence-classification "
            "model; its head would be random)"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"{where}: its tokenizer has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    # the head reads the last token that is not the config's pad token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    return model, tokenizer


def _fit(
    head: list[int], body: list[int], tail: list[int], max_length: int | None
) -> tuple[list[int], bool]:
    """`head + body + tail` in at most `max_length` tokens (the module docstring's truncation),
    and whether it was cut."""
    ids = head + body + tail
    if max_length is None or len(ids) <= max_length:
        return ids, False
    room = max_length - len(head) - len(tail)
    if room <= 0:
        return ids[-max_length:], True
    return head + body[len(body) - room :] + tail, True


def _max_length(tokenizer: Any, config: Any) -> int | None:
    limits = [
        tokenizer.model_max_length,
        getattr(config.get_text_config(), "max_position_embeddings", None),
    ]
    limits = [n for n in limits if isinstance(n, int) and 0 < n < _NO_LIMIT]
    return min(limits) if limits else None
