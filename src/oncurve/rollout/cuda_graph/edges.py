"""The edges of a `cuda_graph` sampler's decode step, around its layers (`StepEdges`):
entering them (embedding, rotary tables, the attention bias), leaving them (float32 logits and
what the draw reads), the draw itself and the record of what was drawn (tokens, logprobs, EOS).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from oncurve.algo.logprobs import float_logits
from oncurve.algo.truncation import Truncation
from oncurve.rollout.base import FINISH_EOS, SamplingParams
from oncurve.rollout.cuda_graph.workspace import Workspace
from oncurve.rollout.torch_sampler import (
    draw_token_ids,
    drawn_logprobs,
    policy_logsumexp,
    truncation_thresholds,
)


class StepEdges:
    """`GraphSampler`'s step regions before and after the layers (`StaticStep` compiles them),
    the draw between them, and the first draw, from the prefill's logits."""

    def _enter(self, ws: Workspace, rows: int) -> tuple[torch.Tensor, ...]:
        """The first region of a step: the embeddings `[n, 1, H]` of the first `rows` decoder
        rows' tokens and zeros as the residual stream's other part (`_layer_step`), their
        rotary tables cos and sin `[n, 1, 1, d]` (broadcast over heads), and the attention bias
        `[n, 1, 1, L]` of the columns they attend to, now with the one the step writes: made
        once for every layer, in the queries' dtype, as the attention kernel takes it (given a
        boolean mask, each layer would convert it)."""
        trunk = self.model.base_model
        # `forward`, not the module's call: gradient checkpointing hooks the embedding's output
        # with `requires_grad_`, which a compiled region cannot return
        x = trunk.embed_tokens.forward(ws.tokens[:rows, None])
        cos, sin = trunk.rotary_emb(x, ws.positions[:rows, None])
        visible = ws.visible[:rows]
        visible.index_fill_(1, ws.column, True)
        bias = torch.zeros(visible.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(~visible, float("-inf"))
        return x, torch.zeros_like(x), cos[:, None], sin[:, None], bias[:, None, None, :]

    def _leave(
        self,
        ws: Workspace,
        rows: int,
        x: torch.Tensor,
        mlp_out: torch.Tensor,
        temperature: float,
        min_new_tokens: int,
        truncation: Truncation,
        eos: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        """The region after the layers: from the last layer's residual stream (`_layer_step`),
        the float32 logits and what the draw reads of them (`_draw_inputs`)."""
        trunk = self.model.base_model
        hidden = trunk.norm(x + mlp_out)[:, 0]
        head = self.model.get_output_embeddings()
        logits = float_logits(hidden, head.weight, head.bias)
        return self._draw_inputs(ws, rows, logits, temperature, min_new_tokens, truncation, eos)

    def _draw_inputs(
        self,
        ws: Workspace,
        rows: int,
        logits: torch.Tensor,
        temperature: float,
        min_new_tokens: int,
        truncation: Truncation,
        eos: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...]:
        """What the draw of token t reads, from `[rows, V]` float32 logits (as
        `torch_sampler.sample_tokens`): them divided by the temperature, the policy's
        logsumexp `[rows]` (`policy_logsumexp`), the same logits with EOS (`eos`, `[V]` bool)
        at -inf while fewer than `min_new_tokens` tokens were drawn, each row's uniform
        `[rows, 1]` (None for greedy), and the `[rows, 1]` thresholds of `truncation` of the
        policy and of the draw (`truncation_thresholds`; None when nothing is truncated). A
        decode step forms them in its compiled last region, where the logsumexp and the masks
        are a few kernels instead of dozens."""
        scaled = logits / temperature if temperature not in (0, 1) else logits
        work = scaled
        if min_new_tokens > 0:
            work = scaled.masked_fill(eos[None] & (ws.t < min_new_tokens), float("-inf"))
        threshold, draw_threshold = truncation_thresholds(scaled, work, temperature, truncation)
        lse = policy_logsumexp(scaled, threshold)
        uniforms = None
        if temperature != 0:
            uniforms = ws.uniforms.index_select(0, ws.t)[0, ws.row_ids[:rows]][:, None]
        return scaled, lse, work, uniforms, threshold, draw_threshold

    def _sample_and_record(
        self,
        ws: Workspace,
        rows: int,
        inputs: tuple[torch.Tensor | None, ...],
        eos: torch.Tensor,
        params: SamplingParams,
        record: Callable | None = None,
    ) -> None:
        """Draw token t for the first `rows` decoder rows from their `_draw_inputs` and record
        it with `record`, a step's last region (the positions and the cache column advance),
        or else `_record` alone (after the prefill, whose state is the first step's)."""
        scaled, lse, work, uniforms, threshold, draw_threshold = inputs
        tokens = draw_token_ids(work, params, uniforms, draw_threshold)
        if record is None:
            self._record(ws, rows, tokens, scaled, lse, threshold, eos, advance=False)
        else:
            record(ws, rows, tokens, scaled, lse, threshold, eos, advance=True)

    def _record(
        self,
        ws: Workspace,
        rows: int,
        tokens: torch.Tensor,
        scaled: torch.Tensor,
        lse: torch.Tensor,
        threshold: torch.Tensor | None,
        eos: torch.Tensor,
        advance: bool,
    ) -> None:
        """Write the drawn `tokens` `[rows]`, their logprobs under `scaled` `[rows, V]`
        truncated at `threshold` `[rows, 1]` (`drawn_logprobs`; `lse` is the policy's
        logsumexp) and any EOS (`eos`, `[V]` bool) in the output rows, and feed the
        tokens back; t advances, and with `advance` the rows' positions and the cache column
        (the step that fed the previous tokens is over). The only writes of a step that are
        not rewrites, so a step whose compilation fails runs again eagerly from its start.
        Every index is a device tensor (a 0-dim tensor used as an index is read on the host)."""
        if advance:
            ws.positions[:rows] += 1
            ws.column += 1
        token_logprobs = drawn_logprobs(scaled, tokens, lse, threshold)
        out_rows = ws.row_ids[:rows]
        at = (out_rows, ws.t.expand(rows))
        ws.completion.index_put_(at, tokens)
        ws.logprobs.index_put_(at, token_logprobs)
        alive = ws.alive[:rows]
        hit = alive & eos[tokens]
        ws.ends.index_put_((out_rows,), torch.where(hit, ws.t + 1, ws.ends[out_rows]))
        ws.reasons.index_put_((out_rows,), torch.where(hit, FINISH_EOS, ws.reasons[out_rows]))
        alive &= ~hit
        ws.tokens[:rows] = tokens
        ws.t += 1

    def _first_draw(
        self, ws: Workspace, rows: int, logits: torch.Tensor, params: SamplingParams
    ) -> None:
        """Draw and record token 0 of the first `rows` rows from the prefill's `[rows, V]`
        logits, outside a step."""
        eos = self._eos_mask(logits.shape[-1], logits.device)
        settings = (params.temperature, params.min_new_tokens, params.truncation, eos)
        inputs = self._draw_inputs(ws, rows, logits, *settings)
        self._sample_and_record(ws, rows, inputs, eos, params)

    def _eos_mask(self, vocab: int, device: torch.device) -> torch.Tensor:
        """`[V]` True on EOS ids; made once per vocabulary size and device, before any capture,
        so that graphs read a tensor that outlives them."""
        key = (vocab, str(device))
        if getattr(self, "_eos", (None, None))[0] != key:
            mask = torch.zeros(vocab, dtype=torch.bool)
            mask[[e for e in self.eos_ids if e < vocab]] = True
            self._eos = (key, mask.to(device))
        return self._eos[1]
