"""A scripted "model" for multi-turn rollouts: a decoder that plays known tokens per row, the
sampler around it, and episode settings in a chat template, for tests that check transcripts
token for token."""

from __future__ import annotations

import contextlib
import json
import re
import time

import pytest
import torch
import transformers

from helpers.models import tiny_qwen2
from helpers.paths import REPO
from oncurve.rollout import TorchSampler
from oncurve.rollout.episodes import EpisodeSettings, ObservationFormat

QWEN3_TOKENIZER = REPO.parent / "shared" / "assets" / "qwen3-tokenizer"


def load_qwen3_tokenizer() -> transformers.PreTrainedTokenizerBase:
    """The Qwen3 tokenizer of ../shared/assets (the test is skipped where it is missing)."""
    if not QWEN3_TOKENIZER.is_dir():
        pytest.skip(f"the Qwen3 tokenizer is not at {QWEN3_TOKENIZER}")
    return transformers.AutoTokenizer.from_pretrained(QWEN3_TOKENIZER)


class ScriptedDecoder:
    """A `Decoder` that plays a fixed token sequence per row: every call's logits put all
    mass on the row's next scripted token, whatever it was fed. It records what it was fed
    and how often the prompt was prefilled, so a test can check the cache's contents."""

    def __init__(self, scripts: list[list[int]], vocab: int, eos: int) -> None:
        self.scripts, self.vocab, self.eos = scripts, vocab, eos
        self.rows = list(range(len(scripts)))
        self.fed: list[list[int]] = [[] for _ in scripts]
        self.prefills = 0

    def prefill(self, prompt_ids, prompt_mask, group_size):
        self.prefills += 1
        return self._logits()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        for i, row in enumerate(self.rows):
            self.fed[row].append(int(tokens[i]))
        return self._logits()

    def keep(self, index: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in index.tolist()]

    def decoding(self):
        return contextlib.nullcontext()

    def _logits(self) -> torch.Tensor:
        logits = torch.full((len(self.rows), self.vocab), -1e4)
        for i, row in enumerate(self.rows):
            script, at = self.scripts[row], len(self.fed[row])
            logits[i, script[at] if at < len(script) else self.eos] = 0.0
        return logits


class ToolUser(ScriptedDecoder):
    """A `Decoder` for an `a+b=` question and an `add` tool: a prompt without a tool response
    gets a Hermes call of `add(a, b)`, one with a response "The answer is <response>."."""

    def __init__(self, tokenizer, vocab: int) -> None:
        super().__init__([], vocab, tokenizer.eos_token_id)
        self.tokenizer = tokenizer

    def prefill(self, prompt_ids, prompt_mask, group_size):
        self.scripts = []
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
            text = self.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
            result = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", text, re.DOTALL)
            if result:
                said = f"The answer is {result[-1]}."
            else:
                a, b = re.findall(r"(\d+)\+(\d+)=", text)[-1]
                call = {"name": "add", "arguments": {"a": int(a), "b": int(b)}}
                said = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
            script = self.tokenizer(said, add_special_tokens=False)["input_ids"] + [self.eos]
            self.scripts += [script] * group_size
        self.rows = list(range(len(self.scripts)))
        self.fed = [[] for _ in self.scripts]
        return super().prefill(prompt_ids, prompt_mask, group_size)


class Replier(ScriptedDecoder):
    """A `Decoder` that answers each prompt with `reply(text)`, the prompt's text -> (the
    answer, whether it ends with EOS: without, the turn runs to `max_new_tokens`)."""

    def __init__(self, tokenizer, reply) -> None:
        super().__init__([], len(tokenizer), tokenizer.eos_token_id)
        self.tokenizer, self.reply = tokenizer, reply

    def prefill(self, prompt_ids, prompt_mask, group_size):
        self.scripts = []
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True):
            said, ends = self.reply(
                self.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
            )
            script = self.tokenizer(said, add_special_tokens=False)["input_ids"]
            self.scripts += [script + [self.eos] * ends] * group_size
        self.rows = list(range(len(self.scripts)))
        self.fed = [[] for _ in self.scripts]
        return super().prefill(prompt_ids, prompt_mask, group_size)


def replier_sampler(tokenizer, reply, sampler_class: type = TorchSampler) -> TorchSampler:
    """A `sampler_class` whose every call is a `Replier`'s with `reply`."""
    model = tiny_qwen2(len(tokenizer))
    model.config.max_position_embeddings = 4096
    model.config.eos_token_id = tokenizer.eos_token_id
    return sampler_class(
        model, tokenizer, decoder=lambda model, rows, width, new, reserve: Replier(tokenizer, reply)
    )


class SlowSampler(TorchSampler):
    """A sampler each of whose calls takes `seconds` longer (a large batch's long completions
    on a real model)."""

    seconds = 0.5

    def generate_ids(self, *args, **kwargs):
        time.sleep(self.seconds)
        return super().generate_ids(*args, **kwargs)


def tool_user_sampler(tokenizer) -> TorchSampler:
    """A sampler whose every call is a `ToolUser`'s."""
    model = tiny_qwen2(len(tokenizer))
    model.config.max_position_embeddings = 4096
    model.config.eos_token_id = tokenizer.eos_token_id
    return TorchSampler(
        model,
        tokenizer,
        decoder=lambda model, rows, width, new, reserve: ToolUser(tokenizer, len(tokenizer)),
    )


def scripted_sampler(tokenizer, scripts: list[list[int]]) -> tuple[TorchSampler, list]:
    model = tiny_qwen2(len(tokenizer))
    model.config.max_position_embeddings = 4096
    model.config.eos_token_id = tokenizer.eos_token_id
    decoders: list[ScriptedDecoder] = []

    def make(model, rows, width, new, reserve):
        decoders.append(ScriptedDecoder(scripts, model.config.vocab_size, tokenizer.eos_token_id))
        return decoders[-1]

    return TorchSampler(model, tokenizer, decoder=make), decoders


def chat_ids(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
    )


def settings(tokenizer, make_env, max_turns: int, role: str | None = None) -> EpisodeSettings:
    """Episodes of `make_env` whose prompts and observations (in `role`) go through the chat
    template."""
    return EpisodeSettings(
        make_env=make_env,
        max_turns=max_turns,
        encode_prompt=lambda text: chat_ids(tokenizer, [{"role": "user", "content": text}], True),
        observation=ObservationFormat(tokenizer, chat_template=True, max_tokens=64, role=role),
    )
