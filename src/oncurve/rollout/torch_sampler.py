"""The decode loop that `Decoder` backends share: group sampling with a KV cache.

Each of the B prompts is prefilled once and its cache copied into the G rows of its group.
Decoding then feeds one token per active row per step into a KV cache; rows that end
(EOS, a stop string) are dropped from the batch once they make up a quarter of it, so finished
rows stop costing compute without copying the cache at every ending. The decoder, which owns
the model's forward and the cache, is the backend's (`oncurve.rollout.base.Decoder`).

Per step the work is a fixed number of tensor ops whatever the batch size; the only Python loop
over rows is the stop-string check, and it visits only rows whose new token could end a stop
string (see `_stop_candidates`).
"""

from __future__ import annotations

import contextlib

import torch
import transformers

from oncurve.algo.truncation import (
    Truncation,
    chosen_normaliser,
    keep_threshold,
    kept_logsumexp,
)
from oncurve.rollout import cpu_llama
from oncurve.rollout.base import (
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_REASONS,
    FINISH_STOP,
    Decoder,
    DecoderFactory,
    SamplerSettings,
    SamplingParams,
    check_room,
    seeded_generator,
)
from oncurve.types import RolloutBatch

# Finished rows are compacted away once they are this fraction of the batch: compaction copies
# the live cache, so doing it at every ending would cost more than decoding the dead rows.
COMPACT_FRACTION = 0.25
# decode steps between host reads of which rows ended, on an accelerator
CHECK_EVERY = 8


class TorchSampler:
    """A `Sampler` that samples G completions per prompt from `model` through `decoder`;
    see the module docstring.

    Args:
        model: a Hugging Face causal LM (`base_model` trunk + output embeddings).
        tokenizer: its tokenizer; the pad id (or EOS when there is none) fills padding, and EOS
            ids are the tokenizer's plus the model's generation config's.
        decoder: makes each call's `Decoder` (`oncurve.rollout.base.DecoderFactory`); by
            default the `cpu_llama` backend's, which takes HF's forward for what it does not
            support. `oncurve.rollout.build_sampler` picks one by name.

    Attributes:
        check_every: decode steps between host reads of which rows ended: 1 on the CPU, where
            a read costs nothing, `CHECK_EVERY` on an accelerator, where each waits for it.
    """

    def __init__(
        self,
        model: transformers.PreTrainedModel,
        tokenizer,
        decoder: DecoderFactory = cpu_llama.make_decoder,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.make_decoder = decoder
        eos = {tokenizer.eos_token_id}
        generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(generation_eos) if isinstance(generation_eos, list) else {generation_eos}
        self.eos_ids = sorted(e for e in eos if e is not None)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self._stop_tables: dict[tuple[str, ...], torch.Tensor] = {}
        device = model.get_output_embeddings().weight.device
        self.check_every = 1 if device.type == "cpu" else CHECK_EVERY

    # the decode loop's logprobs are the model's forward, as the trainer's; nothing is kept
    # between calls
    exact_logprobs = True
    holds_cache = False
    compiles_steps = False

    def prepare(self, settings: SamplerSettings) -> None:
        """Nothing to prepare: every call sizes its cache to its prompts."""

    def scratch(self) -> contextlib.AbstractContextManager[None]:
        """Nothing outlives a call: an empty scope."""
        return contextlib.nullcontext()

    def release(self) -> None:
        """Nothing is held between calls."""

    def metrics(self) -> dict[str, float]:
        return {}

    def turned_off(self) -> dict[str, bool]:
        return {}

    def generate(self, prompts: list[str], group_size: int, params: SamplingParams) -> RolloutBatch:
        """Tokenize `prompts` (with the tokenizer's special tokens) and sample."""
        if isinstance(prompts, str):
            raise ValueError("prompts must be a list of strings, not one string")
        ids = self.tokenizer(list(prompts))["input_ids"]
        return self.generate_ids(ids, group_size, params)

    @torch.inference_mode()
    def generate_ids(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> RolloutBatch:
        """Sample `group_size` completions of each tokenized prompt.

        Returns:
            a `RolloutBatch` with N = len(prompt_ids) * group_size rows, a prompt's G rows
            contiguous; completions right-padded to the longest one.
        """
        ids, mask = self._pad_prompts(prompt_ids, group_size, params)
        width, new = ids.shape[1], params.max_new_tokens
        device = ids.device
        rows = ids.shape[0] * group_size

        # Eval mode while sampling: HF turns the KV cache off in train mode under gradient
        # checkpointing (the trainer's setting), and dropout must be off anyway.
        was_training = self.model.training
        self.model.eval()
        try:
            # the last sampled token is never fed back, so the cache needs new - 1 columns
            reserve = params.min_new_tokens - 1
            decoder = self.make_decoder(self.model, rows, width, new - 1, reserve)
            logits = decoder.prefill(ids, mask, group_size)
            with decoder.decoding():
                completion, logprobs, ends, reasons = self._decode(
                    decoder, logits, rows, params, device
                )
        finally:
            self.model.train(was_training)

        return self._rollout(ids, mask, group_size, completion, logprobs, ends, reasons, params)

    def _rollout(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        group_size: int,
        completion: torch.Tensor,
        logprobs: torch.Tensor,
        ends: torch.Tensor,
        reasons: torch.Tensor,
        params: SamplingParams,
    ) -> RolloutBatch:
        """The `RolloutBatch` of a decode: `[B, P]` prompts and mask, `[N, t]` completion ids
        and logprobs (garbage past a row's end), `[N]` lengths and finish reason codes."""
        positions = torch.arange(completion.shape[1], device=completion.device)
        completion_mask = (positions[None] < ends[:, None]).long()
        completion = completion.masked_fill(completion_mask == 0, self.pad_id)
        logprobs = logprobs * completion_mask
        finish = [FINISH_REASONS[r] for r in reasons.tolist()]
        texts = self._texts(completion, ends, finish, params.stop)
        return RolloutBatch(
            prompt_ids=ids.repeat_interleave(group_size, 0),
            prompt_mask=mask.repeat_interleave(group_size, 0),
            completion_ids=completion,
            completion_mask=completion_mask,
            logprobs=logprobs,
            texts=texts,
            finish_reasons=finish,
            group_size=group_size,
        )

    def _pad_prompts(
        self, prompt_ids: list[list[int]], group_size: int, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`[B, P]` left-padded ids and their mask on the model's device, after checking the
        call's arguments."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if not prompt_ids:
            raise ValueError("prompt_ids is empty: nothing to sample from")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("prompt_ids: every prompt needs at least one token")
        width = max(len(p) for p in prompt_ids)
        check_room(width, params.max_new_tokens, self.model.config, "max_new_tokens")
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        device = self.model.get_output_embeddings().weight.device
        return ids.to(device), mask.to(device)

    def _decode(
        self,
        decoder: Decoder,
        logits: torch.Tensor,
        rows: int,
        params: SamplingParams,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decode loop. Returns completion ids `[N, t]` and logprobs `[N, t]` (garbage past
        a row's end), `[N]` lengths and `[N]` finish reason codes.

        Which rows ended is read on the host only every `check_every` steps (each read waits
        for an accelerator): rows that end in between are decoded on, their ends already
        recorded (stop strings found afterwards by `end_at_stops`)."""
        new = params.max_new_tokens
        vocab = logits.shape[-1]
        generator = seeded_generator(params.decode_seed, device)
        is_eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        is_eos[[e for e in self.eos_ids if e < vocab]] = True
        eos_index = is_eos.nonzero().squeeze(1)
        stop_table = self._stop_table(params.stop, vocab, device) if params.stop else None

        completion = torch.full((rows, new), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((rows, new), dtype=torch.float32, device=device)
        ends = torch.full((rows,), new, dtype=torch.long, device=device)
        reasons = torch.full((rows,), FINISH_LENGTH, dtype=torch.long, device=device)
        active = torch.arange(rows, device=device)  # output row of each decoder row
        alive = torch.ones(rows, dtype=torch.bool, device=device)
        checked = 0  # tokens of every row whose endings were read on the host
        for t in range(new):
            suppress = eos_index if t < params.min_new_tokens else None
            tokens, token_logprobs = sample_tokens(logits, params, generator, suppress)
            completion[active, t] = tokens
            logprobs[active, t] = token_logprobs
            eos_hit = alive & is_eos[tokens]
            ends[active] = torch.where(eos_hit, t + 1, ends[active])
            reasons[active] = torch.where(eos_hit, FINISH_EOS, reasons[active])
            alive &= ~eos_hit
            drawn = t + 1
            if drawn == new or drawn - checked >= self.check_every:
                if stop_table is not None:
                    end_at_stops(
                        self.tokenizer, params.stop, stop_table, completion, active, alive,
                        ends, reasons, checked, drawn,
                    )  # fmt: skip
                checked = drawn
                n_alive = int(alive.sum())
                if n_alive == 0 or drawn == new:
                    break
                if alive.shape[0] - n_alive >= COMPACT_FRACTION * alive.shape[0]:
                    index = alive.nonzero().squeeze(1)
                    decoder.keep(index)
                    active, tokens, alive = active[index], tokens[index], alive[index]
            logits = decoder.step(tokens)
        width = int(ends.max())
        return completion[:, :width], logprobs[:, :width], ends, reasons

    def _stop_table(self, stops: tuple[str, ...], vocab: int, device: torch.device) -> torch.Tensor:
        """`[V]` True for tokens that could complete one of `stops`, cached per stop tuple."""
        if stops not in self._stop_tables:
            self._stop_tables[stops] = _stop_candidates(self.tokenizer, stops, vocab).to(device)
        return self._stop_tables[stops]

    def _texts(
        self, completion: torch.Tensor, ends: torch.Tensor, finish: list[str], stops: tuple
    ) -> list[str]:
        rows = [ids[:end] for ids, end in zip(completion.tolist(), ends.tolist(), strict=True)]
        texts = self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        for i, reason in enumerate(finish):
            if reason == "stop":
                cuts = [texts[i].find(s) + len(s) for s in stops if s in texts[i]]
                if cuts:
                    texts[i] = texts[i][: min(cuts)]
        return texts


def end_at_stops(
    tokenizer,
    stops: tuple[str, ...],
    stop_table: torch.Tensor,
    completion: torch.Tensor,
    out_rows: torch.Tensor,
    alive: torch.Tensor,
    ends: torch.Tensor,
    reasons: torch.Tensor,
    start: int,
    end: int,
) -> None:
    """End, in place, the decoder rows whose text holds a stop string completed by one of
    tokens `start..end-1`, at the first such token, unless the row had ended before it (a stop
    on the EOS token itself loses to the EOS). Host side: it reads tokens and decodes text.

    Args:
        stop_table: `[V]` the tokens that can complete a stop string (`_stop_candidates`).
        completion: `[N, new]` tokens by output row; `ends`, `reasons` `[N]` by output row.
        out_rows: `[n]` the output row of each decoder row; `alive` `[n]` per decoder row.
    """
    tokens = completion[out_rows, start:end]  # [n, end - start]
    limit = ends[out_rows] - (reasons[out_rows] == FINISH_EOS).long()
    positions = torch.arange(start, end, device=tokens.device)
    candidates = (stop_table[tokens] & (positions[None] < limit[:, None])).nonzero().tolist()
    if not candidates:
        return
    window = 4 * max(len(s) for s in stops) + 2
    first = max(0, start + 1 - window)
    # one read, not one per candidate: each decoder row's output row, then its tokens from
    # `first` on
    read = torch.cat([out_rows[:, None], completion[out_rows, first:end]], 1).tolist()
    ended: set[int] = set()
    for i, offset in candidates:  # in row order, then token order
        if i in ended:
            continue
        row, t = read[i][0], start + offset
        tail = read[i][1 + max(first, t + 1 - window) - first : 1 + t + 1 - first]
        if any(s in tokenizer.decode(tail, skip_special_tokens=True) for s in stops):
            ended.add(i)
            alive[i] = False
            ends[row] = t + 1
            reasons[row] = FINISH_STOP


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    suppress: torch.Tensor | None = None,
    suppress_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and its logprob under the policy the trainer models:
    softmax(logits / temperature), truncated by top-k, then top-p, then min-p (as in
    transformers; `oncurve.algo.truncation`), as the training forward computes it.

    EOS suppression changes what is drawn (the truncation of the suppressed distribution), not
    the returned logprob. Temperature 0 takes the argmax and returns logprobs at temperature 1
    over the full vocabulary.

    Args:
        logits: `[n, V]` float32 next-token logits.
        suppress: token ids that must not be drawn (EOS before min_new_tokens).
        suppress_rows: `[n]` bool, the rows `suppress` holds for (None: every row).
    Returns:
        (`[n]` token ids, `[n]` float32 logprobs).
    """
    scaled = logits / params.temperature if params.temperature not in (0, 1) else logits
    work = scaled if suppress is None else scaled.index_fill(1, suppress, float("-inf"))
    if suppress_rows is not None:
        work = torch.where(suppress_rows[:, None], work, scaled)
    truncation = params.truncation
    threshold, draw_threshold = truncation_thresholds(scaled, work, params.temperature, truncation)
    lse = policy_logsumexp(scaled, threshold)
    uniforms = None
    if params.temperature != 0:
        uniforms = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device)
    tokens = draw_token_ids(work, params, uniforms, draw_threshold)
    return tokens, drawn_logprobs(scaled, tokens, lse, threshold)


def truncation_thresholds(
    scaled: torch.Tensor, work: torch.Tensor, temperature: float, truncation: Truncation
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The `[n, 1]` `keep_threshold`s of `truncation` in the policy's distribution, from
    `scaled` `[n, V]` (logits / temperature), and in the draw's, from `work` (`scaled` with the
    tokens that must not be drawn at -inf; the same threshold when `work` is `scaled`);
    (None, None) when nothing is truncated or the draw is greedy (temperature 0). Static
    shapes, no host reads."""
    if temperature == 0 or not truncation.active:
        return None, None
    threshold = keep_threshold(scaled, truncation)
    if work is scaled:
        return threshold, threshold
    return threshold, keep_threshold(work, truncation)


def policy_logsumexp(scaled: torch.Tensor, threshold: torch.Tensor | None) -> torch.Tensor:
    """`[n]` the logsumexp of the `[n, V]` `scaled` logits that reach `threshold` `[n, 1]`
    (every one where it is None): log Z_K of the policy's distribution."""
    if threshold is None:
        return torch.logsumexp(scaled, dim=-1)
    return kept_logsumexp(scaled, threshold).squeeze(-1)


def drawn_logprobs(
    scaled: torch.Tensor, tokens: torch.Tensor, lse: torch.Tensor, threshold: torch.Tensor | None
) -> torch.Tensor:
    """`[n]` float32 logprobs of the drawn `tokens` `[n]` under the policy's distribution:
    from the `[n, V]` `scaled` logits, `policy_logsumexp`'s `lse` `[n]` and the `threshold`
    `[n, 1]` it was given (`chosen_normaliser`: a token is its own normaliser's too)."""
    chosen = scaled.gather(1, tokens[:, None])
    if threshold is None:
        return chosen.squeeze(1) - lse
    return (chosen - chosen_normaliser(chosen, lse[:, None], threshold)).squeeze(1)


def draw_token_ids(
    work: torch.Tensor,
    params: SamplingParams,
    uniforms: torch.Tensor | None,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """The token ids `[n]` drawn from `work` `[n, V]` (logits / temperature, the tokens that
    must not be drawn at -inf): its argmax for greedy (`uniforms` None), else by inverse CDF
    with one uniform `[n, 1]` per row, over the tokens whose logits reach `threshold` `[n, 1]`
    (`truncation_thresholds`; all of them when None). Static shapes and no host
    synchronisation, so that a CUDA graph can hold it."""
    if params.temperature == 0:
        return work.argmax(-1)
    if threshold is not None:
        work = work.masked_fill(work < threshold, float("-inf"))
    # inverse-CDF draw: one uniform per row (multinomial draws one exponential per token)
    cdf = work.softmax(-1).cumsum_(-1)
    u = uniforms * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


def _stop_candidates(tokenizer, stops: tuple[str, ...], vocab: int) -> torch.Tensor:
    """`[V]` True for tokens whose text, in context, can hold the last character of a stop
    string, and for tokens that decode to a partial character: only after such a token can a
    stop string have just been completed. Decoded after an anchor token so that leading spaces
    that a lone-token decode drops (SentencePiece) are seen."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
    prefix = tokenizer.decode(anchor)
    # the model's vocabulary may be padded past the tokenizer's; those ids never decode
    known = min(vocab, len(tokenizer))
    pieces = tokenizer.batch_decode([anchor + [v] for v in range(known)], skip_special_tokens=True)
    lasts = {s[-1] for s in stops}
    special = set(tokenizer.all_special_ids)
    flags = []
    for v, piece in enumerate(pieces):
        text = piece[len(prefix) :] if piece.startswith(prefix) else piece
        partial = "\ufffd" in text or (text == "" and v not in special)
        flags.append(partial or any(c in text for c in lasts))
    return torch.tensor(flags + [False] * (vocab - known), dtype=torch.bool)
