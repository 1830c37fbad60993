"""Per-token log-probabilities and entropy of chosen tokens.

The naive path, `log_softmax(hidden @ W.T / temperature)`, materialises `[N, T, vocab]` logits
(and keeps them for backward): for a 150k vocabulary that tensor, not the model, is the peak of
a GRPO step. `logprobs_from_hidden` instead walks over chunks of rows, keeps only one row's
log-sum-exp for backward, and recomputes a chunk's logits there, so at most `[chunk, vocab]`
logits exist at any time. Logits are computed in float32 whatever the model's dtype.

With a `Truncation` (top-k, top-p, min-p sampling) the logprobs are those of the truncated,
renormalised distribution the sampler draws from (`oncurve.algo.truncation`): each row's kept
tokens are found from its own logits, and only they (and the chosen token) make the normaliser.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from oncurve.algo.truncation import (
    KEEP_ALL,
    Truncation,
    chosen_normaliser,
    keep_threshold,
    kept_logsumexp,
    truncated_entropy,
)


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    truncation: Truncation = KEEP_ALL,
) -> torch.Tensor:
    """log softmax(logits / temperature)[label], the unchunked reference; with `truncation`
    active, the softmax over the tokens it keeps and the label (`oncurve.algo.truncation`).

    Args:
        logits: `[..., V]`.
        labels: `[...]` token ids.
    Returns:
        `[...]` float32 log-probabilities.
    """
    scaled = logits.float() / temperature
    if not truncation.active:
        logp = F.log_softmax(scaled, dim=-1)
        return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    threshold = keep_threshold(scaled.detach(), truncation)
    chosen = scaled.gather(-1, labels.unsqueeze(-1))
    normaliser = chosen_normaliser(chosen, kept_logsumexp(scaled, threshold), threshold)
    return (chosen - normaliser).squeeze(-1)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, truncation: Truncation = KEEP_ALL
) -> torch.Tensor:
    """Entropy `-sum_v p_v log p_v` of softmax(logits / temperature), or of its truncation:
    `[..., V]` -> `[...]`."""
    scaled = logits.float() / temperature
    if truncation.active:
        return truncated_entropy(scaled, keep_threshold(scaled, truncation))
    logp = F.log_softmax(scaled, dim=-1)
    return -(logp.exp() * logp).sum(-1)


class _ChunkedLogprobs(torch.autograd.Function):
    """Autograd for log softmax(h W^T + b)[y] / T over row chunks; see the module docstring.

    d logp / d logits = (onehot(y) - softmax) / temperature, so backward needs only the saved
    log-sum-exp per row and the recomputed logits, which it forms one `head_blocks` block of the
    vocabulary at a time: a block's float32 weight and gradient are all it holds of the head.
    With a truncation the softmax is over the kept tokens and the label, and each row's
    `keep_threshold` is saved too, so that the backward finds the same tokens in every block.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, hidden, weight, bias, labels, temperature, chunk_size, with_entropy, shape, truncation
    ):
        rows = hidden.shape[0]
        # Outputs are made in their final `shape` and written through flat views: a returned
        # view is one that FSDP2 warns could lose its pre-backward hook to an in-place op.
        logprobs_out = hidden.new_empty(shape, dtype=torch.float32)
        entropy_out = hidden.new_empty(shape if with_entropy else (0,), dtype=torch.float32)
        logprobs, entropy = logprobs_out.view(-1), entropy_out.view(-1)
        lse = hidden.new_empty(rows, dtype=torch.float32)
        thresholds = hidden.new_empty(rows if truncation.active else 0, dtype=torch.float32)
        for start in range(0, rows, chunk_size):
            part = slice(start, start + chunk_size)
            logits = float_logits(hidden[part], weight, bias).div_(temperature)
            if truncation.active:
                lse[part], logprobs[part], thresholds[part], chunk_entropy = _truncated_chunk(
                    logits, labels[part], truncation, with_entropy
                )
                if with_entropy:
                    entropy[part] = chunk_entropy
                continue
            lse[part] = torch.logsumexp(logits, dim=-1)
            logprobs[part] = logits.gather(-1, labels[part].unsqueeze(-1)).squeeze(-1) - lse[part]
            if with_entropy:
                probs = (logits - lse[part].unsqueeze(-1)).exp_()
                entropy[part] = lse[part] - (probs * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, thresholds)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.truncated = truncation.active
        ctx.mark_non_differentiable(entropy_out)
        return logprobs_out, entropy_out

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):  # type: ignore[override]
        hidden, weight, bias, labels, lse, thresholds = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        grad_logprobs = grad_logprobs.reshape(-1)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        # A bfloat16 head is read as it is, by tensor-core matmuls writing float32, with the
        # float32 gradient of the logits cut into `bfloat16_parts`; a block of rows holds a
        # [rows, block] float32 buffer and its three parts, so as many rows as keep those within
        # one [chunk, vocab] float32 buffer of the forward go at once (fewer, larger kernels;
        # the full head's gradient is alive here, which the forward does not hold). Otherwise
        # the head is made float32 a block at a time.
        in_place = reads_head_in_place(hidden, weight) and weight.dtype == torch.bfloat16
        if in_place:
            operand, blocks, matmul = hidden, vocab_blocks(weight), half_matmul
            rows = max(chunk_size, 2 * chunk_size * weight.shape[0] // (5 * HEAD_BLOCK_ROWS))
        else:
            operand, blocks, matmul = hidden.float(), head_blocks(weight), torch.mm
            rows = chunk_size
        # made once, sliced in every block's chunks
        grad_rows = grad_logprobs.float().unsqueeze(-1)
        positions = torch.arange(rows, device=labels.device)
        grad_hidden = torch.zeros_like(hidden, dtype=torch.float32) if need_h else None
        # float32 weights are one block, whose gradient becomes the weight's gradient as is
        grad_weight = torch.empty_like(weight) if need_w and weight.dtype != torch.float32 else None
        grad_bias = torch.empty_like(bias) if need_b else None
        for vocab, block in blocks:
            block_bias = None if bias is None else bias[vocab].float()
            block_grad_weight = torch.zeros_like(block, dtype=torch.float32) if need_w else None
            block_grad_bias = torch.zeros_like(block_bias) if need_b else None
            for start in range(0, hidden.shape[0], rows):
                part = slice(start, start + rows)
                logits = matmul(operand[part], block.T)
                if block_bias is not None:
                    logits += block_bias
                g = grad_rows[part]
                label = labels[part] - vocab.start
                inside = (label >= 0) & (label < block.shape[0])
                at = (positions[: label.shape[0]], label.clamp(0, block.shape[0] - 1))
                logits.div_(temperature)
                if ctx.truncated:
                    # the dropped tokens have no probability; the label keeps its own
                    chosen = logits[at]
                    logits.masked_fill_(logits < thresholds[part].unsqueeze(-1), float("-inf"))
                    logits.index_put_(at, torch.where(inside, chosen, logits[at]))
                # in place: one [rows, block] buffer holds logits, then softmax, then gradient
                grad_logits = logits.sub_(lse[part].unsqueeze(-1)).exp_().mul_(-g)
                # one label per row, so a plain write of the sum adds it: scatter_add_ would
                # take CUDA's deterministic-mode reroute, which copies its coordinates from the
                # host at every chunk
                grad_logits.index_put_(at, grad_logits[at] + g.squeeze(1) * inside)
                grad_logits /= temperature
                if need_b:
                    block_grad_bias += grad_logits.sum(0)
                factors = bfloat16_parts(grad_logits) if in_place else [grad_logits]
                for factor in factors:
                    if need_h:
                        grad_hidden[part] += matmul(factor, block)
                    if need_w:
                        block_grad_weight += matmul(factor.T, operand[part])
            if need_w and block is weight:
                grad_weight = block_grad_weight
            elif need_w:
                grad_weight[vocab] = block_grad_weight
            if need_b:
                grad_bias[vocab] = block_grad_bias
        if need_h:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


# Rows of a chunk whose `keep_threshold` is found at once: top-p sorts each row's vocabulary,
# and the sort and the sums around it hold about six `[rows, V]` float32 buffers at a time, so
# an eighth of the chunk's rows keeps them within one buffer of the chunk's size.
THRESHOLD_PARTS = 8


def _truncated_chunk(
    logits: torch.Tensor, labels: torch.Tensor, truncation: Truncation, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The forward of one chunk of rows under `truncation`, from their `[rows, V]` float32
    logits divided by the temperature (used up: the dropped tokens are left at -inf) and their
    `[rows]` labels: `[rows]` normalisers (over the kept tokens and the label), logprobs,
    `keep_threshold`s, and the entropy of the truncated distribution (or None)."""
    rows = logits.shape[0]
    piece = -(-rows // THRESHOLD_PARTS)
    threshold = torch.cat(
        [keep_threshold(logits[i : i + piece], truncation) for i in range(0, rows, piece)]
    )
    chosen = logits.gather(-1, labels.unsqueeze(-1))
    logits.masked_fill_(logits < threshold, float("-inf"))
    kept = torch.logsumexp(logits, dim=-1, keepdim=True)
    normaliser = chosen_normaliser(chosen, kept, threshold)
    entropy = None
    if with_entropy:
        entropy = torch.special.entr(logits.sub_(kept).exp_()).sum(-1)
    logprobs = chosen - normaliser
    return normaliser.squeeze(-1), logprobs.squeeze(-1), threshold.squeeze(-1), entropy


# Vocabulary rows of a non-float32 output embedding made float32 at once: 16k rows of a
# 896-wide head are 56 MB, where the whole float32 copy of a 151k vocabulary is 545 MB.
HEAD_BLOCK_ROWS = 16384


def vocab_blocks(weight: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """`(vocab slice, rows)` of a `[V, H]` output embedding, `HEAD_BLOCK_ROWS` rows at a time,
    as views of the weight."""
    vocab_size = weight.shape[0]
    for start in range(0, vocab_size, HEAD_BLOCK_ROWS):
        vocab = slice(start, min(start + HEAD_BLOCK_ROWS, vocab_size))
        yield vocab, weight[vocab]


def head_blocks(weight: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """`(vocab slice, float32 rows)` covering a `[V, H]` output embedding: the weight itself
    when it is float32 (no copy), else float32 copies of `HEAD_BLOCK_ROWS` rows, one at a time."""
    if weight.dtype == torch.float32:
        yield slice(0, weight.shape[0]), weight
        return
    for vocab, rows in vocab_blocks(weight):
        yield vocab, rows.float()


def _has_matmul_out_dtype() -> bool:
    """Whether this torch has `torch.mm(..., out_dtype=)`: a half-precision matmul that
    accumulates and writes float32 (CUDA kernels; probed on the meta device)."""
    try:
        half = torch.empty(1, 1, dtype=torch.bfloat16, device="meta")
        torch.mm(half, half, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


MATMUL_OUT_DTYPE = _has_matmul_out_dtype()
HALF = (torch.bfloat16, torch.float16)


def reads_head_in_place(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether logits (and, for a bfloat16 head, their gradients) are formed from the
    half-precision head and hidden states as they are, by matmuls that accumulate and write
    float32 (`MATMUL_OUT_DTYPE`, CUDA), instead of from float32 copies: the products of two
    half-precision values are exact in float32, so only the order of the sums differs, and the
    tensor cores do the work."""
    return (
        MATMUL_OUT_DTYPE
        and weight.is_cuda
        and weight.dtype in HALF
        and hidden.dtype == weight.dtype
    )


def half_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` of two half-precision matrices, accumulated and written in float32."""
    return torch.mm(a, b, out_dtype=torch.float32)


def bfloat16_parts(values: torch.Tensor) -> list[torch.Tensor]:
    """Three bfloat16 tensors whose float32 sum is `values` (float32) exactly: 8 + 8 + 8 bits
    of mantissa hold float32's 24, and bfloat16 has float32's exponent range. Products with
    them are as exact as float32 products, where `values` rounded to bfloat16 alone is off by
    up to 2^-9 of each term, which a sum that cancels (a gradient through softmax) turns into
    much more of the result. `values` is used up: it is left holding what no part holds (0)."""
    parts = []
    for _ in range(3):
        part = values.to(torch.bfloat16)
        values.sub_(part)
        parts.append(part)
    return parts


def float_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`[rows, V]` float32 `hidden @ weight.T + bias` from `[rows, H]` hidden states of any
    dtype, without a float32 copy of the whole output embedding: on CUDA one matmul reads the
    head in its own dtype and writes float32 (`MATMUL_OUT_DTYPE`: the products of two bf16 or
    fp16 values are exact in float32, so only the order of the sums differs), elsewhere the
    head is made float32 a block at a time (`head_blocks`)."""
    if reads_head_in_place(hidden, weight):
        logits = half_matmul(hidden, weight.T)
        return logits if bias is None else logits.add_(bias.float())
    hidden32 = hidden.float()
    if weight.dtype == torch.float32:
        logits = hidden32 @ weight.T
    else:
        logits = hidden32.new_empty(hidden.shape[0], weight.shape[0])
        for vocab, block in head_blocks(weight):
            logits[:, vocab] = hidden32 @ block.T
    if bias is not None:
        logits += bias.float()
    return logits


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    bias: torch.Tensor | None = None,
    with_entropy: bool = False,
    truncation: Truncation = KEEP_ALL,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax((hidden @ weight.T + bias) / temperature)[labels], chunked over rows; with
    `truncation` active, the softmax over the tokens it keeps and the label (see the module
    docstring).

    Args:
        hidden: `[N, T, H]` final hidden states at the positions that predict `labels`.
        weight: `[V, H]` output-embedding (lm_head) weight.
        labels: `[N, T]` token ids whose log-probability is wanted.
        temperature: divides the logits, as in sampling.
        chunk_size: rows of N*T per chunk; peak extra memory is about `2 * chunk_size * V`
            float32 values (a chunk's logits and one temporary), plus, for weights that are not
            float32, one `head_blocks` block's float32 copy and gradient.
        bias: optional `[V]` lm_head bias.
        with_entropy: also return the entropy of each position's distribution (no gradient),
            the truncated one's under a truncation.
        truncation: the sampler's top-k / top-p / min-p (`oncurve.algo.truncation`).
    Returns:
        (`[N, T]` float32 log-probabilities, differentiable in hidden/weight/bias;
        `[N, T]` entropy or None).
    """
    n, t, h = hidden.shape
    flat_hidden = hidden.reshape(n * t, h)
    flat_labels = labels.reshape(n * t)
    logprobs, entropy = _ChunkedLogprobs.apply(
        flat_hidden, weight, bias, flat_labels, temperature, chunk_size, with_entropy, (n, t),
        truncation,
    )  # fmt: skip
    return logprobs, entropy if with_entropy else None
