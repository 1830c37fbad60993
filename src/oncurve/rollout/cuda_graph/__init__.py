"""The `cuda_graph` backend: a static-cache decode for the Llama family, replayed as CUDA graphs.

On a GPU a decode step is a few hundred small kernels whose launches, not their memory traffic,
set the pace. This backend makes every shape static so that the whole step (the model's forward
for one token per row, temperature / top-k / top-p / min-p, the draw, the drawn token's logprob,
EOS bookkeeping) is captured once as a CUDA graph and replayed:

- one KV cache `[rows, kv_heads, L, head_dim]` per layer (`_cache_columns`: W + new - 1 and up to
  15 never attended to), allocated for all rows; the B
  prompts are prefilled once (Hugging Face forward) and each copied into its G rows; attention
  runs over every column with a visibility mask, so its shape never changes;
- the uniforms of every draw are drawn up front from the call's seed (`[new, rows]`), and a row
  reads those of its output row, so compaction never changes what a row samples;
- graphs are captured per batch-size bucket (rows, then halves down to 8): once the live rows
  fit a smaller bucket, they are gathered to the front and the smaller graph runs, so finished
  rows stop costing compute;
- prompt widths are rounded up to a multiple of `WIDTH_STEP`, so steps whose prompts differ by a
  few tokens replay the same graphs.

The step calls the model's own modules (norms, projections, MLP, rotary embedding), so it reads
the training weights in place: after an optimizer step the next rollout samples the new weights
with no copy and no recapture, LoRA adapters included. The sampler lays each layer's q, k and v
weights out back to back in one tensor, and its gate and up weights in another
(`lay_out_projections`: the same parameters, now views), so that the step reads each group with
one matmul: three kernels fewer a layer. Only the attention over the static cache
is written here (grouped-query attention through `scaled_dot_product_attention`). Graphs are
recaptured only when a weight's storage moved (FSDP2 refills its whole-weights copy) or the
sampling settings or sizes change. Without CUDA the same step runs eagerly, which is how the CPU
tests check it.

Before it is captured the step is compiled (`torch.compile`, inductor, static shapes, in four
regions: entering the layers, one decoder layer, leaving them up to what the draw reads of the
float32 logits, and recording what was drawn), so that norms, rotary embeddings, activations and
bookkeeping become a few fused kernels instead of a few hundred launches. The draw itself stays
uncompiled: inductor's code for a scan as wide as a real vocabulary (the inverse-CDF draw's
cumsum) fails on CUDA. Each bucket gets
its compiled regions, the layer's shared by every layer (they differ only in their weights,
which are inputs of the compiled code, read in place like the eager step's); the graphs capture
the compiled kernels. With `dynamic_compile` the regions are compiled once for every bucket and
workspace instead (`torch.compile(dynamic=True)`: sizes are symbols), the way vLLM compiles its
step before capturing a graph per batch size: a few seconds of compiling in all instead of a few
per bucket, with kernels for symbolic sizes. A failure to compile decodes with the eager step
from then on, with one warning.

Supported: Llama, Qwen2, Qwen3 and Mistral with static RoPE and no sliding window in reach;
`supports` says which.

The package, one job a module: `step` (the static layer step, the projections laid out for it,
the step's regions compiled or eager), `edges` (the regions before and after the layers, the
draw and its record), `workspace` (the static buffers, the buckets, the workspaces kept),
`graphs` (capturing and keeping the graphs) and `sampler` (`GraphSampler`: the prefill and the
decode loop over buckets). `GraphSampler` is assembled from the mixins of the others.

`GraphSampler` subclasses `TorchSampler` because it is one: only its single-turn sampling
(`generate_ids`) is the static decode. Multi-turn episodes (`oncurve.rollout.episodes`, which
takes any `TorchSampler`) run `TorchSampler`'s eager decode loop with its decoder (`cpu_llama`'s
factory, HF's forward where that does not apply), and both decodes share its prompt padding,
EOS and pad ids, stop-string tables and the `RolloutBatch` they build.
"""

from oncurve.rollout.cuda_graph.sampler import GraphSampler
from oncurve.rollout.cuda_graph.step import lay_out_projections, supports
from oncurve.rollout.cuda_graph.workspace import bucket_for, buckets

__all__ = [
    "GraphSampler",
    "bucket_for",
    "buckets",
    "lay_out_projections",
    "supports",
]
