"""What a sampler backend provides: `SamplingParams` in, a `RolloutBatch` out.

A backend is either a whole `Sampler` (e.g. one that hands the prompts to an inference server),
or, far more often, a `Decoder` run by `TorchSampler`'s shared decode loop, which does the
sampling, stop strings, finish reasons and dropping of finished rows; see `oncurve.rollout` for
the registry that names them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from oncurve.algo.truncation import Truncation
from oncurve.errors import UserError
from oncurve.types import RolloutBatch

# More characters than any tokenizer's token holds: a text longer than this times the tokens it
# may take is cut or refused without tokenizing it (50 MB would take minutes and gigabytes).
MAX_CHARS_PER_TOKEN = 64

# Why a row ended (`RolloutBatch.finish_reasons`); decode loops record the codes, in `[N]` long
# tensors, and the rollout names them by `FINISH_REASONS[code]`.
FINISH_REASONS = ("eos", "stop", "length")
FINISH_EOS, FINISH_STOP, FINISH_LENGTH = range(3)


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled.

    Attributes:
        max_new_tokens: longest completion; a row that reaches it ends with reason "length".
        min_new_tokens: EOS cannot be sampled before this many tokens (as in transformers); the
            logprobs stay those of the distribution without it, as the trainer computes them.
        temperature: divides the logits; 0 means greedy decoding, whose logprobs are then taken
            under temperature 1 (the trainer must use temperature 1 for them to match).
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p.
        top_k: keep the k most likely tokens; 0 keeps all.
        min_p: drop tokens whose probability is below min_p times the top probability.
            The three truncate the distribution drawn from (`truncation`); the logprobs are
            those of the truncated, renormalised distribution, as the trainer computes them.
        stop: strings that end a completion (reason "stop"); the text is cut after the string,
            the token that completed it is the last one of the row.
        seed: same seed, same completions; None draws a fresh seed. The global torch RNG is
            never used, so sampling does not disturb the trainer's random state.
        first_row: the call samples rows `first_row`.. of a call with this seed that was split
            to fit memory. The `cuda_graph` sampler, whose draws are per output row, then draws
            exactly what the whole call would have drawn for them; the decode loop of `hf` and
            `cpu_llama`, whose draws follow the batch, draws from `decode_seed`.
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    first_row: int = 0

    def __post_init__(self) -> None:
        checks = (
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.min_new_tokens >= 0, "min_new_tokens must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0 (0 is greedy)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 keeps all tokens)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must hold non-empty strings"),
            (self.first_row >= 0, "first_row must be >= 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(f"SamplingParams: {message}")
        # A list given for `stop` (e.g. from YAML) would make the frozen dataclass unhashable.
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def truncation(self) -> Truncation:
        """The top-k, top-p and min-p that truncate the distribution drawn from."""
        return Truncation(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    @property
    def decode_seed(self) -> int | None:
        """The seed of a decode loop whose draws follow the batch: `seed`, moved by
        `first_row` so that the parts of a split call draw apart (None: a fresh one)."""
        return None if self.seed is None else self.seed + self.first_row


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A generator on `device` seeded with `seed`, or with a fresh seed when None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def spelled_out(tokenizer: Any, name: str) -> list[int]:
    """Token ids that decode to an added token's `name` (`<tool_call>`), none of them an added
    token: the name cut in two where neither part holds one. For text that names a token
    that `split_special_tokens` leaves a token (one that is not special)."""
    added = frozenset(getattr(tokenizer, "added_tokens_decoder", {}))
    for cut in range(1, len(name)):
        ids = [
            *tokenizer(name[:cut], add_special_tokens=False)["input_ids"],
            *tokenizer(name[cut:], add_special_tokens=False)["input_ids"],
        ]
        if added.isdisjoint(ids) and tokenizer.decode(ids) == name:
            return ids
    raise UserError(f"the tokenizer cannot spell its added token {name!r} as text")


def check_stops(stops: list[str] | tuple[str, ...], tokenizer: Any, setting: str) -> None:
    """UserError for a stop string that is one of the tokenizer's special tokens: stop strings
    are matched in the text decoded without special tokens (as vLLM matches them), where it
    would never appear, so it would never end a completion."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {})
    special = set(tokenizer.all_special_tokens) | {t.content for t in decoder.values() if t.special}
    for stop in stops:
        if stop in special:
            raise UserError(
                f"{setting}: {stop!r} is a special token of the tokenizer; stop strings are "
                "matched in the text without special tokens, where it never shows, so it would "
                "end no completion (completions end at the tokenizer's EOS)"
            )


def check_room(
    longest_prompt: int,
    max_new_tokens: int,
    model_config: Any,
    name: str = "rollout.max_new_tokens",
) -> None:
    """A one-line error, naming the setting `name`, when the longest prompt (in tokens) plus
    `max_new_tokens` exceeds the model's `max_position_embeddings` (when it has one). The
    sampler checks each call; the trainer and the CLI check all prompts up front, so a run
    fails at start, not at whichever step first draws the longest prompt. The message says
    "context length", as inference servers do: a harness's client (verifiers') reads the
    endpoint's answer to a prompt too long as the episode outgrowing its context, not as the
    endpoint failing."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if limit is not None and longest_prompt + max_new_tokens > limit:
        raise UserError(
            f"{name}={max_new_tokens} does not fit: the longest prompt has {longest_prompt} "
            f"tokens and the model's context length (max_position_embeddings) is {limit}, which "
            f"leaves room for {max(limit - longest_prompt, 0)} new tokens"
        )


@dataclass(frozen=True)
class SamplerSettings:
    """What a run asks of its sampler beyond each call's `SamplingParams` (`Sampler.prepare`).

    Attributes:
        longest_prompt: tokens in the run's longest prompt: a backend whose workspaces have
            fixed shapes makes them at least this wide, so that no call meets a wider prompt.
        cuda_graphs: replay the decode steps as CUDA graphs, where the backend can.
        compile: compile the decode step, where the backend can.
    """

    longest_prompt: int = 0
    cuda_graphs: bool = False
    compile: bool = False


class Sampler(Protocol):
    """Samples G completions for each of B prompts; N = B*G rows, a prompt's G rows contiguous.

    Whatever the backend, the returned `RolloutBatch` (on the model's device) holds:
    `prompt_ids`/`prompt_mask` `[N, P]` left-padded with the pad id; `completion_ids`/
    `completion_mask` `[N, T]` right-padded with the pad id, T the longest completion, the EOS
    or stop token that ended a row included; `logprobs` `[N, T]` float32, each token's log
    probability under softmax(logits / temperature) over the full vocabulary (the trainer's
    forward recomputes exactly this; 0 on padding); N `texts` and N `finish_reasons`. The same
    `params.seed` must give the same batch, and the global torch RNG must not be drawn from.

    Besides sampling, what a training loop needs from a backend:

    Attributes:
        tokenizer: the tokenizer `generate` encodes with and the texts are decoded with.
        exact_logprobs: the backend's logprobs are computed as the trainer's forward computes
            them (to float32 rounding: in bfloat16 a decode step's differ from the whole
            sequence's in their last bits); False where another kernel path computes them (a
            run then corrects the update
            with an importance-sampling correction unless `algo.is_correction` or `algo.is_cap`
            says otherwise).
        holds_cache: the backend keeps its KV workspaces between calls (the memory plan counts
            them when `rollout.keep_cache` is on; `scratch` frees them otherwise).
        compiles_steps: the backend can compile its decode step and replay it as CUDA graphs
            (`SamplerSettings.compile` and `cuda_graphs`; on CUDA a run turns both on).
    """

    tokenizer: Any
    exact_logprobs: ClassVar[bool]
    holds_cache: ClassVar[bool]
    compiles_steps: ClassVar[bool]

    def prepare(self, settings: SamplerSettings) -> None:
        """Take the run's `settings` before the first call; a backend ignores what it lacks."""
        ...

    def scratch(self) -> contextlib.AbstractContextManager[None]:
        """A scope at whose end what calls inside it allocated (KV workspaces, graphs) is
        freed; what the sampler held before stays."""
        ...

    def release(self) -> None:
        """Free everything the sampler holds between calls (after running out of memory, so
        that a smaller call does not reuse a larger call's workspaces)."""
        ...

    def metrics(self) -> dict[str, float]:
        """This process's totals to log with each step (e.g. seconds spent compiling)."""
        ...

    def turned_off(self) -> dict[str, bool]:
        """The `SamplerSettings` the sampler stopped honouring after they failed, by name
        (`{"cuda_graphs": False}`): how it samples from then on."""
        ...

    def generate(self, prompts: list[str], group_size: int, params: SamplingParams) -> RolloutBatch:
        """Tokenize `prompts` (with the tokenizer's special tokens) and sample."""
        ...

    def generate_ids(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> RolloutBatch:
        """Sample from already tokenized prompts (B lists of ids, each non-empty)."""
        ...


class Decoder(Protocol):
    """The model side of `TorchSampler`'s decode loop for one call: a KV cache for N rows.

    Layout: B prompts left-padded to P columns, each repeated for the G rows of its group, then
    one column per decode step. Logits are float32 `[n, V]` for the n live rows, in row order,
    on the model's device; rows are only ever dropped (`keep`), never added or reordered
    otherwise. The loop calls it under `torch.inference_mode()`, the model in eval mode.
    """

    def prefill(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int
    ) -> torch.Tensor:
        """Forward the B distinct prompts (`[B, P]` ids and 0/1 mask, left-padded) and give
        each of its G rows their cache. Returns `[B*G, V]` next-token logits, a prompt's G rows
        contiguous."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one `[n]` token per live row; returns their `[n, V]` next-token logits."""
        ...

    def keep(self, index: torch.Tensor) -> None:
        """Keep only live rows `index` (`[m]`, ascending), moved to the front: later steps
        get m tokens, the i-th for the row that was `index[i]`."""
        ...

    def decoding(self) -> contextlib.AbstractContextManager[None]:
        """Wraps every `step` (not `prefill`): a backend may hold resources during the decode,
        and must release them on exit, whatever raised."""
        ...


# (model, rows, width, new, reserve) -> a `Decoder` with room for `rows` rows of a `width`-
# column prompt and `new` fed-back tokens, `reserve` of them known to be needed.
DecoderFactory = Callable[[Any, int, int, int, int], Decoder]

# The cache starts with room for the prompt and `reserve` tokens and grows by a quarter (at
# least this many columns) when the longest live row reaches its end, so that its size follows
# the lengths sampled, not max_new_tokens: GRPO budgets are often several times the typical
# completion.
_GROW_COLUMNS = 16


def first_columns(width: int, reserve: int, limit: int) -> int:
    """Cache columns to allocate up front: the prompt's `width`, then `reserve` (at least
    `_GROW_COLUMNS`) of the at most `limit` in all."""
    return min(limit, width + max(reserve, _GROW_COLUMNS))


def grown_columns(columns: int, limit: int) -> int:
    """Cache columns after a growth from `columns`: a quarter more, at least `_GROW_COLUMNS`."""
    return min(limit, max(columns + _GROW_COLUMNS, columns * 5 // 4))
