"""Per-token GRPO math: pure torch functions, no config objects, no I/O."""
