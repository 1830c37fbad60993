"""A tiny causal LM with tied embedding and head weights, its optimizer and LR schedule, and a
few updates of it: the checkpoint tests' model (their SIGKILL child imports it too)."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


class TiedLM(nn.Module):
    """Embedding and output head share one weight, as in most small causal LMs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.mid = nn.Linear(4, 4)
        self.head = nn.Linear(4, 8, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mid(self.embed(ids))))


def make_setup(seed: int) -> tuple[TiedLM, torch.optim.Optimizer, LambdaLR]:
    torch.manual_seed(seed)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    return model, optimizer, scheduler


def train(model: nn.Module, optimizer, scheduler, steps: int) -> None:
    """A few updates on random token ids (drawn from the torch RNG, so RNG state matters)."""
    for _ in range(steps):
        ids = torch.randint(0, 8, (3, 5))
        loss = nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
