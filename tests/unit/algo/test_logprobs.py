import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from oncurve.algo import entropy_from_logits, logprobs_from_hidden, logprobs_from_logits


def reference(hidden, weight, bias, labels, temperature):
    logits = hidden @ weight.T + (0 if bias is None else bias)
    logp = F.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), logits


def inputs(with_bias, seed=0, n=3, t=5, h=8, v=50):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, t, h, generator=gen).requires_grad_()
    weight = torch.randn(v, h, generator=gen).requires_grad_()
    bias = torch.randn(v, generator=gen).requires_grad_() if with_bias else None
    labels = torch.randint(0, v, (n, t), generator=gen)
    upstream = torch.randn(n, t, generator=gen)
    return hidden, weight, bias, labels, upstream


def grads(out, upstream, tensors):
    return torch.autograd.grad((out * upstream).sum(), [x for x in tensors if x is not None])


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_equals_log_softmax_gather(chunk_size, temperature, with_bias):
    hidden, weight, bias, labels, upstream = inputs(with_bias)
    got, _ = logprobs_from_hidden(hidden, weight, labels, temperature, chunk_size, bias)
    want, _ = reference(hidden, weight, bias, labels, temperature)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    for g_got, g_want in zip(
        grads(got, upstream, [hidden, weight, bias]),
        grads(want, upstream, [hidden, weight, bias]),
        strict=True,
    ):
        assert g_got.abs().max() > 1e-3
        torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-5)


def test_entropy_and_frozen_head():
    hidden, weight, bias, labels, upstream = inputs(True, seed=1)
    weight.requires_grad_(False)
    got, entropy = logprobs_from_hidden(hidden, weight, labels, 0.8, 4, bias, with_entropy=True)
    want, logits = reference(hidden, weight, bias, labels, 0.8)
    torch.testing.assert_close(entropy, entropy_from_logits(logits, 0.8), rtol=0, atol=1e-5)
    torch.testing.assert_close(logprobs_from_logits(logits, labels, 0.8), want)
    assert not entropy.requires_grad
    assert logprobs_from_hidden(hidden, weight, labels, 0.8, 4, bias)[1] is None
    (g_hidden,) = grads(got, upstream, [hidden])
    torch.testing.assert_close(g_hidden, grads(want, upstream, [hidden])[0], rtol=0, atol=1e-5)


def test_bfloat16_model_gets_float32_logprobs_and_own_dtype_grads():
    hidden, weight, _, labels, upstream = inputs(False, seed=2)
    hidden = hidden.detach().bfloat16().requires_grad_()
    weight = weight.detach().bfloat16().requires_grad_()
    got, _ = logprobs_from_hidden(hidden, weight, labels, 1.0, 4)
    want, _ = reference(hidden.float(), weight.float(), None, labels, 1.0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    g_hidden, g_weight = grads(got, upstream, [hidden, weight])
    assert g_hidden.dtype == g_weight.dtype == torch.bfloat16


MEMORY_SCRIPT = """
import resource, sys, torch
from oncurve.algo import logprobs_from_hidden, logprobs_from_logits
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
hidden = torch.randn(8, 256, 64, generator=gen, requires_grad=True)
weight = (0.05 * torch.randn(32000, 64, generator=gen)).requires_grad_()
labels = torch.randint(0, 32000, (8, 256), generator=gen)
def high_water_kib():
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0])
# reset the high-water mark (Linux: clear_refs 5), so that the imports' peak does not count
open("/proc/self/clear_refs", "w").write("5")
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() // 1024
if sys.argv[1] == "chunked":
    logprobs, _ = logprobs_from_hidden(hidden, weight, labels, 0.7, chunk_size=256)
else:
    logprobs = logprobs_from_logits(hidden @ weight.T, labels, 0.7)
logprobs.sum().backward()
print(high_water_kib() - before)
"""


def test_chunked_peak_memory_below_a_quarter_of_unchunked():
    """[8, 256] x vocab 32000 (the logits alone are 262 MB): peak RSS of forward + backward."""
    # A fixed mmap threshold makes glibc return every freed large buffer to the OS, so the peak
    # RSS measures live tensors rather than how the heap happened to fragment.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    runs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", MEMORY_SCRIPT, mode], env=env, stdout=subprocess.PIPE, text=True
        )
        for mode in ("full", "chunked")
    }
    peak = {mode: int(run.communicate()[0]) for mode, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values())
    # The measurement must see at least the one [2048, 32000] float32 logits tensor (256,000 KiB);
    # how many more copies show up depends on what the import had already touched.
    assert peak["full"] > 2048 * 32000 * 4 // 1024, peak
    assert peak["chunked"] < peak["full"] / 4, peak


def emulate_half_matmuls(monkeypatch) -> list[int]:
    """The CUDA path that reads a bfloat16 head in place (`torch.mm(..., out_dtype=float32)`,
    which the CPU lacks) on the CPU: float32 products of bfloat16 values are exact and summed in
    float32, as the CUDA kernel does. Returns the list that counts the matmuls."""
    import oncurve.algo.logprobs as logprobs_module

    calls: list[int] = []

    def half_matmul(a, b):
        assert a.dtype == b.dtype == torch.bfloat16
        calls.append(1)
        return a.float() @ b.float()

    monkeypatch.setattr(logprobs_module, "half_matmul", half_matmul)
    monkeypatch.setattr(
        logprobs_module,
        "reads_head_in_place",
        lambda hidden, weight: hidden.dtype == weight.dtype == torch.bfloat16,
    )
    return calls


def test_three_bfloat16_parts_sum_to_a_float32_tensor_exactly():
    """Matmuls with the parts are as exact as with the float32 tensor; with the first part
    alone (the tensor rounded to bfloat16) they are off by about 2^-9 of each term."""
    from oncurve.algo.logprobs import bfloat16_parts

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 256, generator=gen) * torch.logspace(-30, 10, 256)  # wide exponents
    b = torch.randn(256, 32, generator=gen).bfloat16().double()
    parts = bfloat16_parts(a.clone())
    assert [p.dtype for p in parts] == [torch.bfloat16] * 3
    assert torch.equal(parts[0].float() + parts[1].float() + parts[2].float(), a)
    exact = a.double() @ b
    scale = (a.abs().double() @ b.abs()).max()
    split = (sum(p.float() @ b.float() for p in parts).double() - exact).abs().max() / scale
    rounded = (parts[0].double() @ b - exact).abs().max() / scale
    assert split < 1e-6 and rounded > 100 * split


@pytest.mark.parametrize("in_place", [False, True], ids=["float32 blocks", "in place"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_head_in_vocabulary_blocks_equals_its_float32_copy(
    monkeypatch, with_bias, in_place
):
    """A bfloat16 head is made float32 a block of rows at a time (here 16 of 50, so the last
    block is short and labels fall in every block), or read in place by matmuls that write
    float32 (CUDA's, emulated); values and gradients are those of the whole float32 copy."""
    import oncurve.algo.logprobs as logprobs_module

    monkeypatch.setattr(logprobs_module, "HEAD_BLOCK_ROWS", 16)
    calls = emulate_half_matmuls(monkeypatch) if in_place else []
    hidden, weight, bias, labels, upstream = inputs(with_bias, n=4, t=6)
    hidden16 = hidden.detach().bfloat16().requires_grad_()
    weight16 = weight.detach().bfloat16().requires_grad_()
    bias16 = None if bias is None else bias.detach().bfloat16().requires_grad_()
    labels[0, 0] = 49  # the short last block
    assert {int(y) // 16 for y in labels.flatten()} == {0, 1, 2, 3}
    got, entropy = logprobs_from_hidden(hidden16, weight16, labels, 0.7, 5, bias16, True)
    hidden32 = hidden16.detach().float().requires_grad_()
    weight32 = weight16.detach().float().requires_grad_()
    bias32 = None if bias16 is None else bias16.detach().float().requires_grad_()
    want, logits = reference(hidden32, weight32, bias32, labels, 0.7)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        entropy, entropy_from_logits(logits.detach(), 0.7), rtol=0, atol=1e-5
    )
    got_grads = grads(got, upstream, [hidden16, weight16, bias16])
    want_grads = grads(want, upstream, [hidden32, weight32, bias32])
    for g, w in zip(got_grads, want_grads, strict=True):
        assert g.dtype == torch.bfloat16
        # the bfloat16 rounding of the float32 gradient, nothing more
        torch.testing.assert_close(g, w.bfloat16(), rtol=0, atol=0)
    # the forward's logits per chunk of 5 of the 24 positions; the backward's in chunks of
    # 2 * 5 * 50 // (5 * 16) = 6 positions, per block and chunk: logits, the hidden states'
    # gradient and the weight's (three parts each)
    assert len(calls) == (5 + 7 * 4 * 4 if in_place else 0)
