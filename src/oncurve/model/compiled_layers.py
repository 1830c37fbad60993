"""Decoder layers whose training-side forward and backward run compiled (`model.compile_layers`).

In eager mode every RMSNorm, rotary embedding, activation and residual add of a layer is
several kernels, forward and backward; on a GPU those launches, not the arithmetic, can set the
time of a microbatch. `compile_decoder_layers` gives each decoder layer a subclass whose
forward calls `torch.compile(layer forward)` (inductor, sizes symbolic: the microbatches'
lengths vary), one compilation for all layers of a class (Dynamo takes the layer as an input).
The compiled forward runs only inside `compiled_layers()`, which the update, the reference and
the old-policy forwards enter (`train_step`); sampling, evaluation and everything else run
the layers as they were. Swapping the class, not the instance's `forward`, keeps a deep copy
(the reference) on its own weights.

A compilation that fails, in the forward or in the backward, turns the compiled forward off
for the rest of the process with one warning line: a forward redoes the layer eagerly, a
backward raises `CompiledLayersFailed` for `update.step.accumulate` to start its microbatches
again.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from oncurve.errors import UserError, error_line

# the backend `torch.compile` uses; tests put a faster one in
BACKEND = "inductor"


class CompiledLayersFailed(RuntimeError):
    """A compiled layer's backward failed; the layers run eagerly from now on."""


class _State:
    """Whether the compiled forwards run now (`compiled_layers`), and why they never will
    again (the first failure's line), per process."""

    active = False
    failure: str | None = None


_subclasses: dict[type, type] = {}


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """Give every decoder layer of `model` (transformers' `GradientCheckpointingLayer`s) its
    compiled subclass; returns how many layers. Call it before any copy of the model that
    should run compiled too (the reference) and before a data-parallel wrapper (FSDP2 makes
    subclasses of the layers' classes). Needs torch 2.5 or later: before it Dynamo compiled an
    `nn.Module`'s code once per instance (modules not inlined), each layer apart, past its
    recompile limit for any real model."""
    if torch.__version__ < (2, 5):  # `TorchVersion` compares with a tuple
        raise UserError(
            f"model.compile_layers needs torch 2.5 or later, whose compiler shares one "
            f"compilation among the layers; torch {torch.__version__} compiles each apart"
        )
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        base = type(layer)
        if base not in _subclasses.values():
            layer.__class__ = _subclasses.setdefault(base, _compiled_subclass(base))
    return len(layers)


def _compiled_subclass(base: type) -> type:
    """`base` with a forward that runs `torch.compile(base.forward)` inside
    `compiled_layers()` and `base.forward` elsewhere or after a failure."""
    compiled = torch.compile(base.forward, dynamic=True, backend=BACKEND)

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _State.active and _State.failure is None:
            try:
                return compiled(self, *args, **kwargs)
            except Exception as error:  # a compiler's: eager from now on; others go through
                if not _from_the_compiler(error):  # (the checkpoint's early stop among them)
                    raise
                _fail(error)
        return base.forward(self, *args, **kwargs)

    # transformers wraps this forward too (`GradientCheckpointingLayer.__init_subclass__`): the
    # checkpointing happens around it, outside the compiled code, and `base.forward`, no longer
    # the outermost wrapper, just runs the layer
    return type(f"Compiled{base.__name__}", (base,), {"forward": forward})


def _fail(error: BaseException) -> None:
    _State.failure = error_line(error)
    print(
        f"warning: compiling the decoder layers failed ({_State.failure}); they run "
        "uncompiled (model.compile_layers)",
        file=sys.stderr,
    )


@contextmanager
def compiled_layers(enabled: bool = True) -> Iterator[None]:
    """The compiled layers' forwards (and so their backwards) run for the duration, when
    `enabled` and none has failed. A compiler error that escapes (a backward's: its
    gradients are partial) raises `CompiledLayersFailed`; any other error passes through."""
    if not enabled or _State.failure is not None:
        yield
        return
    previous, _State.active = _State.active, True
    try:
        yield
    except Exception as error:
        if not _from_the_compiler(error) or _State.failure is not None:
            raise
        _fail(error)
        raise CompiledLayersFailed(_State.failure) from error
    finally:
        _State.active = previous


def _from_the_compiler(error: BaseException) -> bool:
    """Whether `error` was raised by Dynamo, AOTAutograd or inductor (their exception classes
    live in their packages), not by the model or the loss."""
    return type(error).__module__.startswith(
        ("torch._dynamo", "torch._inductor", "torch._functorch")
    )
