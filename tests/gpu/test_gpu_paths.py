"""The trainer's real paths on a CUDA device, each in a fresh Python process.

An allocator bug showed only when a process's first graph capture was followed by
recaptures (the first capture puts cuBLAS's workspace in its pool): a test that shares its
process with others that captured before it cannot see it. So every scenario here runs in a new
process with a time limit, and a failure shows that process's log tail. Every test is marked
`gpu` and skipped where torch sees no CUDA device (`make test`); `make gpu-check` runs them.

The scenarios that are not a CLI command are the `scenario_*` functions below, which the child
runs from this file (`runpy.run_path(...)["scenario_..."]()`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from helpers.models import PROMPTS, TOKENIZER, make_model
from helpers.runs import rewards_env

from oncurve.algo.logprobs import MATMUL_OUT_DTYPE, float_logits
from oncurve.rollout import SamplingParams
from oncurve.rollout.cuda_graph import GraphSampler

pytestmark = pytest.mark.gpu

TAIL_LINES = 40


def run_fresh(command: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run `command` in a new process (stdout and stderr together); its output, after checking
    that it exited 0 within `timeout` seconds. A failure shows the last `TAIL_LINES` lines."""
    try:
        proc = subprocess.run(
            command,
            env=env or rewards_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        output = error.output or ""
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        pytest.fail(f"timed out after {timeout:.0f} s: {' '.join(command)}\n{tail(output)}")
    assert proc.returncode == 0, f"exit {proc.returncode}: {' '.join(command)}\n{tail(proc.stdout)}"
    return proc.stdout


def tail(text: str) -> str:
    return "\n".join(text.splitlines()[-TAIL_LINES:])


def run_scenario(name: str, timeout: float = 240, **env: str) -> str:
    """Run `scenario_<name>` of this module in a fresh process, with `env` added."""
    path = str(Path(__file__).resolve())
    code = f"import runpy; runpy.run_path({path!r})['scenario_{name}']()"
    return run_fresh([sys.executable, "-c", code], timeout, {**rewards_env(), **env})


def train_on_cuda(run_dir: Path, *overrides: str, steps: int = 2) -> list[dict]:
    """`oncurve train` of the default job (the bundled model on `arith`, its preflight and its
    evaluations at start and end) on CUDA with `overrides`, in a fresh process. Checks that the
    run sampled with its compiled step in CUDA graphs all along; returns its metrics rows."""
    args = ["run.device=cuda", f"run.steps={steps}", f"run.dir={run_dir}", *overrides]
    log = run_fresh([sys.executable, "-m", "oncurve", "train", "--quiet", *args], timeout=300)
    assert "capturing the decode step failed" not in log, tail(log)
    assert "compiling the decode step failed" not in log, tail(log)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    # a failed capture or compilation rewrites config.yaml with false: true means all held
    assert config["rollout"]["cuda_graphs"] is True, tail(log)
    assert config["rollout"]["compile"] is True, tail(log)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/policy" in r]
    assert [r["step"] for r in trained] == list(range(1, steps + 1)), tail(log)
    for key in ("rollout/graphs", "rollout/compiled"):
        assert all(r[key] == 1.0 for r in trained), (key, [r[key] for r in trained])
    assert all(math.isfinite(r["loss/policy"]) and r["updates/skipped"] == 0 for r in trained)
    assert (run_dir / "final" / "config.json").is_file()
    return rows


# --- the trainer ---------------------------------------------------------------------------------


def test_the_default_job_with_preflight_and_an_evaluation_every_step(tmp_path):
    """The sequence that crashed: preflight (2 prompts x G) -> evaluation (500 prompts in
    chunks) -> training rows -> evaluation again, each a new shape or sampling setting."""
    rows = train_on_cuda(tmp_path / "run", "eval.every=1", steps=3)
    evaluated = [r["step"] for r in rows if "eval/accuracy" in r]
    assert evaluated == [0, 1, 2, 3]


def test_top_p_below_one(tmp_path):
    """Nucleus sampling inside the captured step, with deterministic kernels (the default)."""
    train_on_cuda(tmp_path / "run", "rollout.top_p=0.9", "eval.num_prompts=300")


def test_lora(tmp_path):
    pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    train_on_cuda(
        tmp_path / "run", "model.lora.r=4", "model.lora.alpha=8", "algo.beta=0.04",
        "eval.num_prompts=300",
    )  # fmt: skip


def test_ppo(tmp_path):
    rows = train_on_cuda(tmp_path / "run", "algo.preset=ppo", "eval.num_prompts=300")
    assert all(math.isfinite(r["value/loss"]) for r in rows if "loss/policy" in r)


def test_oncurve_eval_of_more_than_256_prompts(tmp_path):
    """More prompts than one evaluation batch: equal chunks, greedy then sampled (two sampling
    settings), through the CLI."""
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(300)))  # fmt: skip
    out = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "oncurve", "eval", "--model", "default", "--data", str(data)]
    command += ["--device", "cuda", "--samples", "2", "--out", str(out)]
    log = run_fresh(command, timeout=240)
    assert "cuda_graph sampler: captured" in log, tail(log)
    assert "capturing the decode step failed" not in log, tail(log)
    # the summary line is stdout's last; stderr (merged in) may print after it
    (summary,) = [json.loads(line) for line in log.splitlines() if line.startswith('{"n": ')]
    assert summary["n"] == 300
    assert len(out.read_text().splitlines()) == 300


# --- the sampler ---------------------------------------------------------------------------------


def scenario_shapes_and_temperatures() -> None:
    """One graph sampler as the trainer builds it (compiled step, graphs) through three prompt
    shapes (more than its workspaces, so one is evicted and recaptured) and two temperatures,
    each call's samples equal to an eager sampler's (neither compiled nor captured) with the
    same seed."""
    model = make_model("qwen2").cuda()
    graphed = GraphSampler(model, TOKENIZER)
    eager = GraphSampler(model, TOKENIZER, use_graphs=False, compile_step=False)
    long = ["7" * 70, "1+2+3=" * 12]  # a wider workspace than the short prompts'
    shapes = [(PROMPTS, 4), (PROMPTS * 4, 4), (long, 2), (PROMPTS, 4)]
    for prompts, group in shapes:
        for temperature in (1.0, 0.7):
            params = SamplingParams(max_new_tokens=24, temperature=temperature, seed=3)
            got = graphed.generate(prompts, group, params)
            want = eager.generate(prompts, group, params)
            where = f"{len(prompts)} prompts x {group}, temperature {temperature}"
            assert graphed.graph_error is None, graphed.graph_error
            assert graphed.compile_error is None, graphed.compile_error
            assert torch.equal(got.completion_ids, want.completion_ids), where
            torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=0, msg=where)
    assert graphed.use_graphs and graphed.capture_seconds > 0


def test_one_sampler_through_three_shapes_and_two_temperatures():
    run_scenario("shapes_and_temperatures")


def scenario_an_evaluations_workspace_is_freed() -> None:
    """As the trainer runs an evaluation (`scratch`): its workspace, 16 times the
    training call's rows, holds memory while it samples and gives it back when it ends; a
    second evaluation makes it again (recaptured, not compiled again) with the same samples
    and leaves no more behind than the first."""
    model = make_model("qwen2", hidden=512).cuda()  # the evaluation KV cache: 75 MB
    sampler = GraphSampler(model, TOKENIZER)
    params = SamplingParams(max_new_tokens=32, seed=0)
    greedy = SamplingParams(max_new_tokens=32, temperature=0.0)
    sampler.generate(PROMPTS, 4, params)  # the training workspace: 12 rows
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    after, samples = [], []
    for _ in range(2):
        compiled = sampler.compile_seconds
        with sampler.scratch():
            samples.append(sampler.generate(PROMPTS * 16, 4, greedy).completion_ids)
            torch.cuda.synchronize()
            during = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
        assert sampler.graph_error is None and sampler.compile_error is None
        assert during - before > 64 * 2**20, (before, during)
        assert after[-1] - before < 0.25 * (during - before), (before, during, after)
    assert sampler.compile_seconds - compiled < 0.5  # the second evaluation compiled nothing
    assert after[1] - after[0] < 8 * 2**20, after
    assert torch.equal(samples[0], samples[1])
    assert len(sampler._workspaces) == 1


def test_an_evaluations_workspace_is_freed_when_it_ends():
    run_scenario("an_evaluations_workspace_is_freed")


def scenario_no_sync_between_checks() -> None:
    """Decode steps with top-p < 1 under deterministic kernels (`CUBLAS_WORKSPACE_CONFIG` is
    set by the parent, before CUDA starts): the eager step and every captured graph run under
    `set_sync_debug_mode("error")`, and a whole decode reads the device only at its checks."""
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # as the trainer sets it (`oncurve.update.determinism`): deterministic reroutes, no error on kernels
    # that have no deterministic version
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = make_model("qwen2").cuda()
    sampler = GraphSampler(model, TOKENIZER)
    new = 64
    params = SamplingParams(max_new_tokens=new, min_new_tokens=new, top_p=0.9, seed=0)
    decode = sampler._decode
    syncs: list[str] = []

    def counted(*args) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                decode(*args)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs.extend(str(w.message) for w in caught if "synchronizing" in str(w.message))

    sampler._decode = counted
    sampler.generate(PROMPTS * 4, 4, params)  # captures: a sync in the step fails the capture
    assert sampler.graph_error is None, sampler.graph_error
    assert sampler.compile_error is None, sampler.compile_error
    # min_new_tokens = new: no row ends, so the only reads are the checks (one host read each;
    # its copy and its wait may count apart); a read per step would give `new` or more
    checks = math.ceil(new / sampler.check_every)
    assert 0 < len(syncs) <= 2 * checks, (len(syncs), checks, syncs[:3])
    (ws,) = sampler._workspaces
    (graphs,) = ws.graphs.values()
    rows = len(PROMPTS) * 4 * 4
    sampler._reset(ws, rows, seed=0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for bucket, graph in graphs.items():
            sampler._step(ws, bucket, params)  # raises on any host sync
            graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    smallest = min(graphs)  # rows every step recorded
    assert bool(torch.isfinite(ws.logprobs[:smallest, : 2 * len(graphs)]).all())


def test_decode_steps_never_wait_for_the_device_between_checks():
    run_scenario("no_sync_between_checks", CUBLAS_WORKSPACE_CONFIG=":4096:8")


# --- the logits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_head_logits_are_float32_exact_up_to_the_order_of_the_sums(with_bias):
    """`float_logits` on a bf16 CUDA head (one bf16 matmul with a float32 output where torch has
    `torch.mm(out_dtype=)`) against the float64 product of the same bf16 values: every element
    within the worst-case float32 summation bound H * 2^-24 * sum |h_i w_i|, which a matmul that
    rounds its output to bf16 exceeds."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, hidden, vocab = 64, 896, 4096  # Qwen2.5-0.5B's width
    h = torch.randn(rows, hidden, device="cuda", generator=generator).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=generator) * 0.02).bfloat16()
    b = (torch.randn(vocab, device="cuda", generator=generator) * 0.1).bfloat16()
    bias = b if with_bias else None
    got = float_logits(h, w, bias)
    assert got.dtype == torch.float32 and got.shape == (rows, vocab)
    want = h.double() @ w.double().T + (b.double() if with_bias else 0)
    bound = hidden * 2**-24 * (h.double().abs() @ w.double().abs().T + b.double().abs())
    error = (got.double() - want).abs()
    path = "torch.mm(out_dtype=float32)" if MATMUL_OUT_DTYPE else "float32 head blocks"
    assert bool((error <= bound).all()), f"{path}: max error / bound {float((error / bound).max())}"
    rounded = (h @ w.T).double() + (b.double() if with_bias else 0)
    assert bool(((rounded - want).abs() > bound).any())  # the bound tells bf16 output apart


def test_bfloat16_head_gradients_read_in_place_are_the_float32_heads(monkeypatch):
    """The chunked logprob's backward on a bf16 CUDA head read in place (tensor-core matmuls
    writing float32, the logits' gradient in three bf16 parts) against the same backward on
    float32 copies of the head: the bf16 gradients are equal but where float32 sums in another
    order land across a rounding boundary. On the CPU (emulated) that is 99.98% equal; the
    logits' gradient rounded to bf16 alone gives 58-73%."""
    import oncurve.algo.logprobs as logprobs_module
    from oncurve.algo import logprobs_from_hidden

    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, positions, hidden, vocab = 4, 96, 896, 40_000  # three 16k-row blocks of the head
    h = torch.randn(rows, positions, hidden, device="cuda", generator=generator).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=generator) * 0.02).bfloat16()
    labels = torch.randint(0, vocab, (rows, positions), device="cuda", generator=generator)
    upstream = torch.randn(rows, positions, device="cuda", generator=generator)

    def gradients() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        leaves = [h.clone().requires_grad_(), w.clone().requires_grad_()]
        logprobs, _ = logprobs_from_hidden(leaves[0], leaves[1], labels, 0.7, 64)
        return (logprobs.detach(), *torch.autograd.grad((logprobs * upstream).sum(), leaves))

    products = []
    original = logprobs_module.half_matmul
    monkeypatch.setattr(
        logprobs_module, "half_matmul", lambda a, b: products.append(1) or original(a, b)
    )
    in_place = gradients()
    assert MATMUL_OUT_DTYPE and len(products) > 2  # the backward's matmuls ran in place
    monkeypatch.setattr(logprobs_module, "reads_head_in_place", lambda hidden, weight: False)
    copied = gradients()
    torch.testing.assert_close(in_place[0], copied[0], rtol=0, atol=1e-5)
    for name, got, want in zip(("hidden", "weight"), in_place[1:], copied[1:], strict=True):
        assert got.dtype == want.dtype == torch.bfloat16
        equal = float((got == want).double().mean())
        assert equal > 0.995, f"{name}: {equal:.4%} of the elements equal"


def test_an_offloaded_reference_is_on_the_gpu_for_its_pass_only():
    """`Policy(offload_reference=True)`: the reference's weights wait in pinned host memory,
    are on the GPU during the reference pass (the pass's peak holds them) and freed after it
    (allocated memory is back to what it was, plus the logprobs); the logprobs are the kept
    reference's bit for bit."""
    from helpers.batches import lengths_batch

    from oncurve.update.microbatches import ForwardSettings
    from oncurve.update.policy import Policy

    cpu_batch = lengths_batch([4, 3, 4, 2], [5, 5, 2, 4])
    batch = dataclasses.replace(
        cpu_batch, **{f: getattr(cpu_batch, f).cuda() for f in ("input_ids", "attention_mask",
        "completion_mask", "advantages")},
    )  # fmt: skip
    forward = ForwardSettings(1.0, 16, 8)
    kept = Policy(make_model("qwen2").cuda(), forward=forward, with_reference=True)
    offloaded = Policy(
        make_model("qwen2").cuda(), forward=forward, with_reference=True, offload_reference=True
    )
    params = list(offloaded.reference.parameters())
    assert all(p.device.type == "cpu" and p.is_pinned() for p in params)
    weights = sum(p.numel() * p.element_size() for p in params)
    want = kept.reference_logprobs(batch)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = offloaded.reference_logprobs(batch)
    torch.cuda.synchronize()
    assert got.device.type == "cuda" and torch.equal(got, want)
    assert torch.cuda.max_memory_allocated() - before >= weights
    assert torch.cuda.memory_allocated() - before <= got.numel() * got.element_size() + 512
    assert all(p.device.type == "cpu" and p.is_pinned() for p in offloaded.reference.parameters())


def test_packed_rows_on_cuda_are_the_padded_forward_within_bfloat16_rounding():
    """A tiny Qwen2's packed forward passes the trainer's own check, and its packed logprobs
    and gradients (ragged prompts and completions, shared prompts run once or every row
    whole) are the padded forward's within bf16 rounding."""
    from helpers.batches import COMPLETION_LEN, grouped_rows, lengths_of

    from oncurve.loop.preflight import Tolerances
    from oncurve.model import packed_attention
    from oncurve.model.forward import completion_logprobs

    model = make_model("qwen2", hidden=128).to("cuda", torch.bfloat16)
    ids, mask, completion_mask, groups = grouped_rows()
    ways = {"padded": None, "whole rows": lengths_of(mask, None)}
    ways["shared prompts"] = lengths_of(mask, groups)
    ids, mask, completion_mask = ids.cuda(), mask.cuda(), completion_mask.cuda()
    results = {}
    for way, rows in ways.items():
        if rows is not None and model.config._attn_implementation != packed_attention.ATTENTION:
            assert packed_attention.unsupported(model) is None
            packed_attention.use_packed_attention(model)
            assert packed_attention.packed_failure(model) is None
        logprobs, _ = completion_logprobs(model, ids, mask, COMPLETION_LEN, packed=rows)
        grads = torch.autograd.grad((logprobs * completion_mask).sum(), list(model.parameters()))
        results[way] = (logprobs[completion_mask.bool()].detach().float(), grads)
    padded, padded_grads = results.pop("padded")
    tolerance = Tolerances.of(torch.bfloat16)
    for way, (packed, packed_grads) in results.items():
        assert float((packed - padded).abs().mean()) < tolerance.logprob / 10, way
        # over all the weights at once, as preflight's check: one small bias may differ more
        pairs = list(zip(packed_grads, padded_grads, strict=True))
        apart = sum(float((got.float() - want.float()).norm() ** 2) for got, want in pairs)
        size = sum(float(want.float().norm() ** 2) for _, want in pairs)
        assert (apart / size) ** 0.5 < tolerance.gradient, way


# --- the optimizer -----------------------------------------------------------------------------


def test_the_compiled_bfloat16_adamw_update_is_the_eager_one_on_cuda():
    """`oncurve.update.adamw.AdamW(compile_update=True)`, as the trainer builds it on CUDA: inductor's
    Triton kernel for a slice's update against the eager ops, over a 0.5B layer's MLP weight
    (two slices) for three steps. Weights and moments are equal but where float32 reordering
    moved a result across a rounding boundary (the moments' nearest rounding, the weights'
    stochastic threshold): rarely, and by one bf16 step."""
    from oncurve.update.adamw import AdamW, _bfloat16_slice

    generator = torch.Generator(device="cuda").manual_seed(0)
    start = (torch.randn(4864, 896, device="cuda", generator=generator) * 0.02).bfloat16()
    grads = [torch.randn(4864, 896, device="cuda", generator=generator).bfloat16() for _ in "abc"]
    results = []
    for compile_update in (False, True):
        param = torch.nn.Parameter(start.clone())
        opt = AdamW([param], lr=1e-4, seed=1, compile_update=compile_update)
        for grad in grads:
            param.grad = grad.clone()
            opt.step()
        assert opt.compile_error is None
        assert (opt._bfloat16_slice is _bfloat16_slice) is not compile_update
        state = opt.state[param]
        results.append(
            (param.detach().float(), state["exp_avg"].float(), state["exp_avg_sq"].float())
        )
    (p_eager, m_eager, v_eager), (p_compiled, m_compiled, v_compiled) = results
    assert not torch.equal(p_eager, start.float())
    assert bool((m_eager != 0).all()) and bool((v_eager > 0).all())
    for got, want in ((p_compiled, p_eager), (m_compiled, m_eager), (v_compiled, v_eager)):
        # equal but where float32 reordering crossed a rounding boundary, rarely ...
        assert float((got != want).float().mean()) < 1e-3
        # ... and there by one bf16 step (at most 2^-7 of the value)
        step = want.abs().clamp(min=2**-126) * 2**-7
        assert bool(((got - want).abs() <= step * 1.01).all())
