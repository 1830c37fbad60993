"""What every sampler backend provides: `SamplingParams` in, a `RolloutBatch` out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from oncurve.errors import UserError
from oncurve.types import RolloutBatch


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled.

    Attributes:
        max_new_tokens: longest completion; a row that reaches it ends with reason "length".
        min_new_tokens: EOS cannot be sampled before this many tokens (as in transformers); the
            logprobs stay those of the unmodified distribution, as the trainer computes them.
        temperature: divides the logits; 0 means greedy decoding, whose logprobs are then taken
            under temperature 1 (the trainer must use temperature 1 for them to match).
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p.
        top_k: keep the k most likely tokens; 0 keeps all.
        min_p: drop tokens whose probability is below min_p times the top probability.
        stop: strings that end a completion (reason "stop"); the text is cut after the string,
            the token that completed it is the last one of the row.
        seed: same seed, same completions; None draws a fresh seed. The global torch RNG is
            never used, so sampling does not disturb the trainer's random state.
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = (
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.min_new_tokens >= 0, "min_new_tokens must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0 (0 is greedy)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 keeps all tokens)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must hold non-empty strings"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {message}")
        # A list given for `stop` (e.g. from YAML) would make the frozen dataclass unhashable.
        object.__setattr__(self, "stop", tuple(self.stop))


def check_room(
    longest_prompt: int,
    max_new_tokens: int,
    model_config: Any,
    name: str = "rollout.max_new_tokens",
) -> None:
    """A one-line error, naming the setting `name`, when the longest prompt (in tokens) plus
    `max_new_tokens` exceeds the model's `max_position_embeddings` (when it has one). The
    sampler checks each call; the trainer and the CLI check all prompts up front, so a run
    fails at start, not at whichever step first draws the longest prompt."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is not None and longest_prompt + max_new_tokens > limit:
        raise UserError(
            f"{name}={max_new_tokens} does not fit: the longest prompt has {longest_prompt} "
            f"tokens and the model's max_position_embeddings is {limit}, which leaves room for "
            f"{max(limit - longest_prompt, 0)} new tokens"
        )


class Sampler(Protocol):
    """A backend that samples G completions for each of B prompts."""

    def generate(self, prompts: list[str], group_size: int, params: SamplingParams) -> RolloutBatch:
        """Tokenize `prompts` and sample; the G completions of a prompt are contiguous rows."""
        ...

    def generate_ids(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> RolloutBatch:
        """Sample from already tokenized prompts."""
        ...
