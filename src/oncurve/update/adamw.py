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
Eagerly a slice's update is about twenty elementwise ops, each a kernel launch on CUDA, for
each of a model's hundreds of parameters: with `compile_update` the bfloat16 update of a slice
is compiled (inductor, sizes symbolic) into one kernel after its random draw, with the same
arithmetic; a compilation that fails runs it eagerly from then on, with one warning.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import torch

from oncurve.errors import error_line
from oncurve.model.devices import host_to_device

SLICE = 2**22


def round_with(values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """`values` (float32) as bfloat16, rounded up where `noise` (int32 in [0, 2^16), the shape
    of `values`) carries into bfloat16's last mantissa bit, else down."""
    # Adding up to 2^16 - 1 below bfloat16's last mantissa bit carries into it with exactly that
    # probability; clearing the low 16 bits then truncates, which bfloat16 represents exactly.
    rounded = (values.view(torch.int32) + noise) & -65536
    return rounded.view(torch.float32).to(torch.bfloat16)


def stochastic_round(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`values` (float32) as bfloat16, each rounded up or down to a neighbour with probability
    proportional to its distance from the other (exact values stay as they are)."""
    return round_with(values, _noise(values, generator))


def _noise(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(
        0, 1 << 16, values.shape, dtype=torch.int32, device=values.device, generator=generator
    )


def _adamw_slice(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    hyper: torch.Tensor,
) -> torch.Tensor:
    """The moments of one slice updated in place; returns its float32 updated weights.
    `hyper` is `_hyper`'s."""
    step_size, root_correction, keep, beta2, fresh, eps, decay = hyper.unbind()
    g = grad.float()
    m = torch.lerp(exp_avg.float(), g, keep)
    v = exp_avg_sq.float() * beta2 + fresh * g * g
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    return param.float() * decay - step_size * (m / (v.sqrt() / root_correction + eps))


def _bfloat16_slice(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    noise: torch.Tensor,
    hyper: torch.Tensor,
) -> None:
    param.copy_(round_with(_adamw_slice(param, grad, exp_avg, exp_avg_sq, hyper), noise))


class AdamW(torch.optim.Optimizer):
    """torch's AdamW (decoupled weight decay, bias-corrected moments) whose bfloat16 parameters
    are written back with `stochastic_round`; float32 parameters are written exactly.

    Args:
        params: the parameters (or groups) to train.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`.
        seed: seeds each step's random bits together with the step number.
        compile_update: compile the bfloat16 update of a slice (module docstring).

    Attributes:
        compile_error: the first line of the error that turned `compile_update` off, else None.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        seed: int = 0,
        compile_update: bool = False,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.seed = seed
        self.compile_error: str | None = None
        self._bfloat16_slice = (
            torch.compile(_bfloat16_slice, dynamic=True, fullgraph=True)
            if compile_update
            else _bfloat16_slice
        )

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("oncurve.update.adamw.AdamW takes no closure")
        generators: dict[torch.device, torch.Generator] = {}
        for group in self.param_groups:
            hypers: dict[tuple[torch.device, int], torch.Tensor] = {}
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
                if (param.device, step) not in hypers:
                    hypers[param.device, step] = _hyper(group, step, param.device)
                hyper = hypers[param.device, step]
                tensors = (param, param.grad, state["exp_avg"], state["exp_avg_sq"])
                flat = [t.view(-1) for t in tensors]
                for start in range(0, param.numel(), SLICE):
                    p, g, m, v = (t[start : start + SLICE] for t in flat)
                    if p.dtype != torch.bfloat16:
                        p.copy_(_adamw_slice(p, g, m, v, hyper))
                        continue
                    self._update_bfloat16(p, g, m, v, _noise(p, generators[param.device]), hyper)

    def _update_bfloat16(self, *slices_noise_hyper: torch.Tensor) -> None:
        """`_bfloat16_slice`, compiled while compiling works."""
        try:
            self._bfloat16_slice(*slices_noise_hyper)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure to compile: eager from now on
            if self._bfloat16_slice is _bfloat16_slice:
                raise
            self.compile_error = error_line(error)
            self._bfloat16_slice = _bfloat16_slice
            print(
                f"warning: compiling the optimizer's bfloat16 update failed ({self.compile_error});"
                " it runs uncompiled, with the same arithmetic",
                file=sys.stderr,
            )
            _bfloat16_slice(*slices_noise_hyper)


def _hyper(group: dict, step: int, device: torch.device) -> torch.Tensor:
    """`[7]` float32 on `device`: `group`'s step size at `step` (counted from 1), the second
    moment's bias correction's root, 1 - beta1, beta2, 1 - beta2, eps and the decay factor;
    tensors, not Python numbers, so that the compiled update does not specialise to a step,
    made in one host-to-device copy a step, which waits for nothing queued before it."""
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    values = (
        lr / (1 - beta1**step),
        (1 - beta2**step) ** 0.5,
        1 - beta1,
        beta2,
        1 - beta2,
        group["eps"],
        1 - lr * group["weight_decay"],
    )
    return host_to_device(list(values), device, torch.float32)
