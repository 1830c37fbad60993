"""`model.compile_layers`: decoder layers compiled for the training-side forwards only, the
same gradients as eager, and a failure in the forward or the backward that falls back."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from helpers.batches import accumulate_grpo, grpo_batch
from helpers.models import make_model

import oncurve.model.compiled_layers as compiled_module
from oncurve.errors import UserError
from oncurve.model import packed_attention, packing
from oncurve.model.packing import RowLengths
from oncurve.model.weights import enable_gradient_checkpointing
from oncurve.update.microbatches import ForwardSettings


class CompilerError(RuntimeError):
    """Stands for an error of torch's compiler stack (the module its classes live in)."""


CompilerError.__module__ = "torch._dynamo.exc"


class FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        raise CompilerError("backward compilation failed (test)")


@pytest.fixture
def compiler(monkeypatch):
    """A backend that runs the captured graph as it is and counts its calls; `fail` makes the
    next compilation raise, `fail_backward` makes the compiled layers' backward raise."""

    class Backend:
        compiled = calls = 0
        fail = fail_backward = False

        def __call__(self, gm, example_inputs):
            if self.fail:
                raise CompilerError("no compiler (test)")
            self.compiled += 1

            def run(*args):
                self.calls += 1
                out = gm.forward(*args)
                if self.fail_backward:
                    out = [FailsInBackward.apply(t) if t.requires_grad else t for t in out]
                return out

            return run

    backend = Backend()
    monkeypatch.setattr(compiled_module, "BACKEND", backend)
    monkeypatch.setattr(compiled_module, "_subclasses", {})
    monkeypatch.setattr(compiled_module._State, "failure", None)
    torch._dynamo.reset()
    yield backend
    torch._dynamo.reset()


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["stored", "recomputed"])
def test_compiled_layers_give_the_eager_gradients_and_run_only_in_training_forwards(
    compiler, checkpointing
):
    """Two microbatches: each layer's compiled forward runs once each, and once more in the
    backward when activations are recomputed (whose early stop is no failure)."""
    model, batch = grpo_batch(0, share_prompt=False)
    if checkpointing:
        enable_gradient_checkpointing(model)
    eager_model = copy.deepcopy(model)
    forward = ForwardSettings(1.0, 16, 4, compile_layers=True)
    tokens = float(batch.completion_mask.sum())
    accumulate_grpo(eager_model, batch, ForwardSettings(1.0, 16, 4), tokens)
    assert compiled_module.compile_decoder_layers(model) == model.config.num_hidden_layers
    reference = copy.deepcopy(model)  # keeps its own weights, compiled too
    assert type(reference.model.layers[0]) is type(model.model.layers[0])
    accumulate_grpo(model, batch, forward, tokens)
    layers = model.config.num_hidden_layers
    assert compiler.compiled >= 1 and compiler.calls == 2 * layers * (2 if checkpointing else 1)
    assert compiled_module._State.failure is None
    for got, want in zip(grads(model), grads(eager_model), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    calls = compiler.calls
    with torch.no_grad():  # outside the training forwards (sampling, evaluation): eager
        model(batch.input_ids, attention_mask=batch.attention_mask)
    assert compiler.calls == calls
    with torch.no_grad():
        reference.model.layers[0].self_attn.o_proj.weight.zero_()
    assert model.model.layers[0].self_attn.o_proj.weight.abs().sum() > 0


def test_compiled_layers_with_packed_rows_give_the_eager_packed_gradients(compiler) -> None:
    """The packed attention's kwargs (the segments' bounds, the shared prompts' layout) pass
    through the compiled layers; on the CPU its loop over segments runs eagerly between them."""
    model, batch = grpo_batch(0, share_prompt=True)
    packed_attention.use_packed_attention(model)
    eager_model = copy.deepcopy(model)
    tokens = float(batch.completion_mask.sum())
    accumulate_grpo(eager_model, batch, ForwardSettings(1.0, 16, 4, pack_rows=True), tokens)
    compiled_module.compile_decoder_layers(model)
    forward = ForwardSettings(1.0, 16, 4, compile_layers=True, pack_rows=True)
    accumulate_grpo(model, batch, forward, tokens)
    assert compiler.compiled >= 1 and compiler.calls >= 2 * model.config.num_hidden_layers
    assert compiled_module._State.failure is None
    for got, want in zip(grads(model), grads(eager_model), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(
    "window_size" not in packed_attention.VARLEN_PARAMETERS,
    reason=f"torch {torch.__version__} has no variable-length attention with windows",
)
# slow (a compile per layout): make test keeps the padded run's once-per-grad-mode guard
@pytest.mark.slow
def test_the_cuda_packed_path_compiles_once_per_layout_for_every_length(monkeypatch) -> None:
    """CUDA's packed attention (torch's variable-length flash attention) inside the compiled
    layers, without a GPU: traced by Dynamo and AOTAutograd on meta tensors, microbatches of
    other lengths and segment counts reuse one forward and one backward graph per layout
    (prompts shared, rows whole), each holding the variable-length attention: no graph break,
    no recompilation, and no Dynamo warning in a user's log."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    kernels = packed_attention.VARLEN_KERNELS
    monkeypatch.setitem(kernels, "meta", kernels["cuda"])
    monkeypatch.setattr(
        compiled_module, "BACKEND", aot_autograd(fw_compiler=keep, bw_compiler=keep)
    )
    monkeypatch.setattr(compiled_module, "_subclasses", {})
    monkeypatch.setattr(compiled_module._State, "failure", None)
    torch._dynamo.reset()
    model = make_model("qwen2").to(torch.bfloat16)
    packed_attention.use_packed_attention(model)
    compiled_module.compile_decoder_layers(model)
    model.to("meta")
    microbatches = [
        RowLengths((4, 4, 3), (5, 2, 6), (0, 0, 1)),
        RowLengths((3, 3, 3, 2, 2), (6, 1, 4, 3, 2), (0, 0, 0, 1, 1)),
        RowLengths((5, 2), (1, 6)),
        RowLengths((4, 1, 3), (2, 6, 5)),
    ]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for rows in microbatches:
            ids = torch.randint(4, 40, (len(rows.prompts), max(rows.prompts) + 6))
            with compiled_module.compiled_layers():
                hidden = packing.packed_hidden(model.model, ids.to("meta"), 6, rows)
                hidden.float().sum().backward()
    torch._dynamo.reset()
    assert compiled_module._State.failure is None
    assert len(graphs) == 4  # (forward, backward) x (shared prompts, rows whole)
    for graph in graphs:
        assert any("varlen" in str(node.target) for node in graph.graph.nodes), graph.code
    assert not [w for w in said if "dynamo" in str(w.message).lower()], said[0].message


@pytest.mark.parametrize("release,refused", [("2.4.1", True), ("2.5.0", False)])
def test_compiled_layers_before_torch_2_5_are_a_one_line_error(
    compiler, monkeypatch, release, refused
):
    """torch 2.4's Dynamo does not inline `nn.Module`s, so each layer would compile apart."""
    model = make_model("qwen2")
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(release))
    if not refused:
        assert compiled_module.compile_decoder_layers(model) == model.config.num_hidden_layers
        return
    with pytest.raises(UserError, match=r"^model.compile_layers needs torch 2.5 or later.*2\.4\.1"):
        compiled_module.compile_decoder_layers(model)
    assert not any(type(m).__name__.startswith("Compiled") for m in model.modules())


@pytest.mark.parametrize(
    "where,says",
    [("forward", "no compiler (test)"), ("backward", "backward compilation failed (test)")],
)
def test_a_compilation_that_fails_gives_one_warning_and_the_eager_gradients(
    compiler, capsys, where, says
):
    """A forward that fails to compile redoes its layer eagerly; a backward that fails leaves
    partial gradients, which are dropped as the accumulation starts again eagerly."""
    model, batch = grpo_batch(0, share_prompt=False)
    eager_model = copy.deepcopy(model)
    tokens = float(batch.completion_mask.sum())
    accumulate_grpo(eager_model, batch, ForwardSettings(1.0, 16, 4), tokens)
    compiled_module.compile_decoder_layers(model)
    compiler.fail, compiler.fail_backward = where == "forward", where == "backward"
    accumulate_grpo(model, batch, ForwardSettings(1.0, 16, 4, compile_layers=True), tokens)
    for got, want in zip(grads(model), grads(eager_model), strict=True):
        assert torch.equal(got, want)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "compiling the decoder layers failed" in warnings[0]
    assert says in warnings[0] and "model.compile_layers" in warnings[0]


# slow (inductor over many lengths): make test keeps the padded run's once-per-grad-mode guard
@pytest.mark.slow
def test_inductor_compiles_the_layers_once_for_every_length_with_recomputation(monkeypatch):
    """The real backend on the CPU, activations recomputed, microbatches of several lengths
    (sizes are symbolic): the eager gradients to float32 rounding, and no fallback."""
    monkeypatch.setattr(compiled_module, "_subclasses", {})
    monkeypatch.setattr(compiled_module._State, "failure", None)
    torch._dynamo.reset()
    model, batch = grpo_batch(0, share_prompt=False)
    enable_gradient_checkpointing(model)
    eager_model = copy.deepcopy(model)
    tokens = float(batch.completion_mask.sum())
    for rows in (4, 3):  # 2 and 3 microbatches, trimmed to different lengths
        forward = ForwardSettings(1.0, 16, rows)
        accumulate_grpo(eager_model, batch, forward, tokens)
        compiled_module.compile_decoder_layers(model)
        accumulate_grpo(model, batch, dataclasses.replace(forward, compile_layers=True), tokens)
        assert compiled_module._State.failure is None
        for got, want in zip(grads(model), grads(eager_model), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch._dynamo.reset()


def test_a_run_with_compile_layers_trains_policy_and_reference_compiled(
    compiler, tiny_model_dir, data_file, tmp_path
):
    """`model.compile_layers=true`: the policy's and the reference's layers (a deep copy, its
    own weights) get the compiled class, and a step trains through them."""
    from helpers.configs import make_config

    from oncurve.loop.trainer import setup
    from oncurve.loop.training_step import training_step

    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", "model.compile_layers=true", "algo.beta=0.04"
    )
    s = setup(config)
    layers = [*s.policy.model.model.layers, *s.policy.reference.model.layers]
    assert {type(layer).__name__ for layer in layers} == {"CompiledQwen2DecoderLayer"}
    assert s.policy.reference.model.layers[0] is not s.policy.model.model.layers[0]
    metrics = training_step(s, 1)
    assert compiler.calls > 0 and compiled_module._State.failure is None
    assert metrics["kl"] >= 0 and torch.isfinite(torch.tensor(metrics["loss/policy"]))


def test_a_padded_run_compiles_the_layers_once_per_grad_mode_step_after_step(
    compiler, tiny_model_dir, data_file, tmp_path
):
    """Rows padded, the layers compiled: two compilations (with and without gradients) for all
    layers and steps, the offloaded reference's swapped weights adding none. A group's prompt
    is not shared through transformers' KV cache here: indexed by the layer's number, it would
    make Dynamo compile each layer apart, past its recompile limit."""
    from helpers.configs import make_config

    from oncurve.loop.trainer import setup
    from oncurve.loop.training_step import training_step

    config = make_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "model.compile_layers=true",
        "model.pack_rows=false",
        "model.offload_reference=true",
        "algo.beta=0.04",
    )
    s = setup(config)
    assert s.config.model.share_prompt_forward and s.policy.reference_offloaded
    assert s.policy.model.config.num_hidden_layers >= 2
    calls = []
    for step in (1, 2, 3):
        training_step(s, step)
        calls.append(compiler.calls)
    assert compiler.compiled == 2 and compiled_module._State.failure is None
    assert calls[0] > 0 and calls[2] - calls[1] == calls[1] - calls[0] > 0
