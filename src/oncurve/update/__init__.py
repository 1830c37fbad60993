"""The update: the training forward over microbatches, gradient accumulation, the optimizer
step, and the AdamW that rounds bfloat16 updates stochastically."""
