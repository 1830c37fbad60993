"""Imported by a 2-rank test run through its reward (`helpers.oom_on_rank_1:count_digits`): on
rank 1, the first sampler call of training raises torch.OutOfMemoryError, as a card short of
memory would."""

import os

import torch

from helpers.rewards_for_tests import count_digits
from oncurve.loop import collect

__all__ = ["count_digits"]

if os.environ.get("RANK") == "1":
    real_draw = collect.draw
    calls: list[int] = []

    def draw_out_of_memory_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real_draw(*args, **kwargs)

    collect.draw = draw_out_of_memory_once
