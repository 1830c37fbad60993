"""Reward functions: fn(prompts, completions, **columns) -> list[float | None]."""
