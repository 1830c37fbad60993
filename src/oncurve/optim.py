"""AdamW for bfloat16 weights, with stochastically rounded updates.

A bfloat16 weight has 8 bits of mantissa: next to a weight of 0.02 the nearest other value is
0.02 +- 6e-5, so an Adam step of lr = 1e-6 (a step moves a weight by about lr), rounded to
nearest, leaves it where it was; at the learning rates RL fine-tuning uses, only the smallest
weights move at all. torch's AdamW on bfloat16 parameters rounds to nearest, and so does every
trainer that keeps bfloat16 weights without float32 master copies.

Stochastic rounding writes the updated weight as one of its two bfloat16 neighbours, the upper
one with probability equal to how far up the float32 result lies between them: the rounded
weight is the exact update in expectation, and many small steps add up as they would in float32,
with no master copy (Zamirai et al., 2020, "Revisiting BFloat16 Training"). The random bits come
from a generator seeded by (seed, step), so a resumed run draws what an uninterrupted one does.

The moments stay in the parameters' dtype, as torch keeps them; the arithmetic is float32, one
slice of at most `SLICE` elements at a time, so a 136M-element embedding needs no float32 copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

SLICE = 2**22


def stochastic_round(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`values` (float32) as bfloat16, each rounded up or down to a neighbour with probability
    proportional to its distance from the other (exact values stay as they are)."""
    bits = values.view(torch.int32)
    noise = torch.randint(
        0, 1 << 16, values.shape, dtype=torch.int32, device=values.device, generator=generator
    )
    # Adding up to 2^16 - 1 below bfloat16's last mantissa bit carries into it with exactly that
    # probability; clearing the low 16 bits then truncates, which bfloat16 represents exactly.
    rounded = (bits + noise).bitwise_and_(-65536)
    return rounded.view(torch.float32).to(torch.bfloat16)


class AdamW(torch.optim.Optimizer):
    """torch's AdamW (decoupled weight decay, bias-corrected moments) whose bfloat16 parameters
    are written back with `stochastic_round`; float32 parameters are written exactly.

    Args:
        params: the parameters (or groups) to train.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`.
        seed: seeds each step's random bits together with the step number.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        seed: int = 0,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.seed = seed

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("oncurve.optim.AdamW takes no closure")
        generators: dict[torch.device, torch.Generator] = {}
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["step"] += 1
                step = int(state["step"])
                if param.device not in generators:
                    seed = (self.seed * 1_000_003 + step * 7_919) % (2**63)
                    generators[param.device] = torch.Generator(param.device).manual_seed(seed)
                _update(
                    param,
                    param.grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    step=step,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    generator=generators[param.device],
                )


def _update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    generator: torch.Generator,
) -> None:
    """One AdamW update of `param` in float32, `SLICE` elements at a time."""
    step_size = lr / (1 - beta1**step)
    root_correction = (1 - beta2**step) ** 0.5
    flat = [t.view(-1) for t in (param, grad, exp_avg, exp_avg_sq)]
    for start in range(0, param.numel(), SLICE):
        p, g, m, v = (t[start : start + SLICE] for t in flat)
        g32 = g.float()
        m32 = m.float().lerp_(g32, 1 - beta1)
        v32 = v.float().mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
        m.copy_(m32)
        v.copy_(v32)
        w = p.float().mul_(1 - lr * weight_decay)
        w.addcdiv_(m32, v32.sqrt().div_(root_correction).add_(eps), value=-step_size)
        p.copy_(stochastic_round(w, generator) if p.dtype == torch.bfloat16 else w)
