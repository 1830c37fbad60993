"""The trainer on a CUDA device. Every test here is marked `gpu` and skipped where torch
sees no CUDA device (`make test`); `make gpu-check` runs them on one.

What they hold the GPU to: float32 gradients equal to the CPU's (TF32 off), every preset and
feature training in bfloat16 with finite metrics and a final model that loads on the CPU,
bit-identical resume, checkpoints that resume on the CPU, `oncurve eval`/`sample` of a GPU-trained
model on either device, and with 2 GPUs NCCL ranks equal to one GPU and FSDP2 equal to DDP.
The helpers are the CPU tests' (tests/helpers)."""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import transformers
from helpers.batches import VOCAB, batch_to, fixed_batch, loss_fns
from helpers.configs import make_config
from helpers.counting import rows_per_call
from helpers.data_parallel import one_step, sharded_and_replicated_runs, two_rank_step
from helpers.first_step import capture_first_step, hand_assembled_grpo
from helpers.models import tiny_qwen2
from helpers.run_processes import finish
from helpers.runs import cli_args, metric_rows, rewards_env, train_process
from helpers.sessions import sessions_of
from safetensors.torch import load_file

from oncurve.algo.registry import AGGREGATIONS
from oncurve.cli import main
from oncurve.loop.trainer import setup, train
from oncurve.loop.training_step import training_step
from oncurve.model import forward as training_forward
from oncurve.model import sources as model_sources
from oncurve.model.forward import PolicyLogprobs
from oncurve.run import checkpoint
from oncurve.update import adamw
from oncurve.update.microbatches import ForwardSettings
from oncurve.update.step import accumulate_gradients

pytestmark = pytest.mark.gpu

FP32 = ("run.device=cuda", "model.dtype=float32")
BF16 = ("run.device=cuda", "model.dtype=bfloat16")
LORA = ("model.lora.r=4", "model.lora.alpha=8", "optim.lr=5e-2", "algo.beta=0.04")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@pytest.fixture
def exact_fp32() -> Iterator[Callable[[], None]]:
    """float32 matmuls and convolutions in full precision, not TF32, until the test ends; the
    test calls the value again after anything that may turn TF32 on (the trainer's setup)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def disable() -> None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    disable()
    yield disable
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def assert_close_relative(got: torch.Tensor, want: torch.Tensor, rel: float, msg: str) -> None:
    """Each element within `rel` of its value, or of the tensor's largest value for elements
    near 0 (where a relative difference means nothing)."""
    floor = rel * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=rel, atol=floor, msg=msg)


def trained_rows(run_dir: Path, steps: int) -> list[dict]:
    """The training rows of `metrics.jsonl` (evaluation rows left out), after checking that
    they are steps 1..`steps`, every update was applied and the core metrics are finite."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss/policy" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for key in ("loss/policy", "grad_norm", "reward/mean", "entropy", "logprob_diff/max"):
        assert all(math.isfinite(r[key]) for r in rows), (key, [r[key] for r in rows])
    assert all(r["updates/skipped"] == 0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)
    return rows


def assert_final_is(run_dir: Path, weights: dict[str, torch.Tensor], initial: Path) -> None:
    """`run_dir/final` loads with transformers on the CPU, holds exactly `weights` (the trained
    model's, any device) and differs from the model at `initial`."""
    final = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final", dtype="auto")
    state = final.state_dict()
    assert next(final.parameters()).device.type == "cpu"
    assert state.keys() <= weights.keys()
    for name, value in state.items():
        assert torch.equal(value, weights[name].detach().cpu()), name
    start = transformers.AutoModelForCausalLM.from_pretrained(initial, dtype="auto").state_dict()
    assert any(not torch.equal(value, start[name].to(value.dtype)) for name, value in state.items())


# --- a. float32 on the GPU computes the CPU's numbers ------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ("model.gradient_checkpointing=false", "model.share_prompt_forward=true"),
        ("model.gradient_checkpointing=true",),
    ],
    ids=["shared-prompt", "checkpointing"],
)
def test_first_cuda_step_in_float32_matches_the_cpu_hand_assembled_grpo(
    tiny_model_dir, data_file, tmp_path, exact_fp32, overrides
):
    """test_trainer's hand-assembled GRPO step, the trainer on the GPU and the hand-assembled
    loss and gradients on the CPU, from the rollout the GPU sampled."""
    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", *FP32, "optim.grad_clip=0", *overrides
    )
    s = setup(config)
    exact_fp32()
    assert {(p.device.type, p.dtype) for p in s.policy.model.parameters()} == {
        ("cuda", torch.float32)
    }
    metrics, rollout, grads = capture_first_step(s)
    assert rollout.completion_ids.device.type == "cuda"
    cpu_model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32
    ).eval()
    loss, expected = hand_assembled_grpo(cpu_model, batch_to(rollout, "cpu"))
    # ratio 1 and pi_ref = pi: the loss is ~0 (the group z-scores sum to 0), so it is compared
    # to 1e-6 absolute as on the CPU; the gradients are not 0 and compare to 1e-4 relative
    assert metrics["loss/policy"] == pytest.approx(loss, abs=1e-6)
    assert metrics["ratio/min"] == metrics["ratio/max"] == 1.0
    assert max(float(g.abs().max()) for g in expected.values()) > 1e-3
    assert grads.keys() == expected.keys()
    for name, want in expected.items():
        assert_close_relative(grads[name].cpu(), want, 1e-4, name)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_accumulated_float32_gradients_on_cuda_equal_the_cpus(exact_fp32, aggregation):
    """One `accumulate_gradients` over the data-parallel tests' `fixed_batch` (ragged prompts and
    completions, 3 microbatches) on the CPU and on the GPU from the same weights."""
    cpu_model = tiny_qwen2(VOCAB, seed=0)
    batch = fixed_batch(cpu_model)
    batch.advantages = batch.advantages + 0.5  # a loss far from 0: 1e-4 relative means something
    cuda_model = copy.deepcopy(cpu_model).to("cuda")
    results = []
    for model, device in ((cpu_model, "cpu"), (cuda_model, "cuda")):
        stats = accumulate_gradients(
            PolicyLogprobs(model),
            batch_to(batch, device),
            loss_fns(aggregation),
            ForwardSettings(chunk_size=16, microbatch_rows=4),
            num_seqs=float(batch.num_rows),
            num_tokens=float(batch.completion_mask.sum()),
        )
        results.append((stats, {n: p.grad.cpu() for n, p in model.named_parameters()}))
    (cpu_stats, cpu_grads), (cuda_stats, cuda_grads) = results
    assert abs(cpu_stats["loss/policy"]) > 0.1
    for key in ("loss/policy", "kl", "entropy"):
        assert cuda_stats[key] == pytest.approx(cpu_stats[key], rel=1e-4), key
    assert max(float(g.abs().max()) for g in cpu_grads.values()) > 1e-3
    for name, want in cpu_grads.items():
        assert_close_relative(cuda_grads[name], want, 1e-4, name)


# --- b. every preset in bfloat16 ---------------------------------------------------------------


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "ppo"])
def test_every_preset_trains_three_bfloat16_steps_on_cuda(
    tiny_model_dir, data_file, tmp_path, monkeypatch, preset
):
    run_dir = tmp_path / "run"
    config = make_config(tiny_model_dir, data_file, run_dir, *BF16, f"algo.preset={preset}")
    assert config.algo.dynamic_sampling == (preset == "dapo")
    sessions = sessions_of(monkeypatch)
    assert train(config, quiet=True).steps == 3
    (s,) = sessions
    assert {(p.device.type, p.dtype) for p in s.policy.model.parameters()} == {
        ("cuda", torch.bfloat16)
    }
    rows = trained_rows(run_dir, 3)
    assert all(r["memory/gpu_peak_gb"] > 0 for r in rows)
    for r in rows:  # each phase's own peak, the step's the largest
        phases = [r[f"memory/{stage}_peak_gb"] for stage in ("rollout", "reward", "train")]
        assert all(0 < peak <= r["memory/gpu_peak_gb"] for peak in phases)
        assert ("memory/reference_peak_gb" in r) == (config.algo.beta > 0)
    # the gradients exist during the update only (the critic's are its own)
    assert all(p.grad is None for p in s.policy.trainable())
    if config.algo.beta > 0:  # in pinned host memory but for its pass (the default on CUDA)
        assert s.config.model.offload_reference and s.policy.reference_offloaded
        assert all(
            p.device.type == "cpu" and p.is_pinned() for p in s.policy.reference.parameters()
        )
    if preset == "dapo":
        assert all(r["groups/sampling_rounds"] >= 1 for r in rows)
    if preset == "ppo":
        assert s.advantage is not None
        assert next(s.advantage.model.parameters()).device.type == "cuda"
        for key in ("value/loss", "value/grad_norm", "value/mean", "kl"):
            assert all(math.isfinite(r[key]) for r in rows), key
        assert (run_dir / "checkpoints" / "step-000003" / "value.safetensors").is_file()
    assert_final_is(run_dir, s.policy.model.state_dict(), tiny_model_dir)


# --- c. the features, each on its own ----------------------------------------------------------


@pytest.mark.parametrize(
    "feature",
    [
        "lora",
        "gradient-checkpointing",
        "shared-prompt-forward",
        "packed-rows",
        "eval-every-step",
        "cache-freed-each-step",
    ],
)
def test_each_feature_trains_on_cuda_and_its_final_model_loads_on_the_cpu(
    tiny_model_dir, data_file, tmp_path, monkeypatch, feature
):
    overrides: tuple[str, ...] = {
        "lora": LORA,
        "gradient-checkpointing": ("model.gradient_checkpointing=true",),
        "shared-prompt-forward": (
            "model.gradient_checkpointing=false",
            "model.share_prompt_forward=true",
            "model.pack_rows=false",
        ),
        "packed-rows": ("model.pack_rows=true",),
        "eval-every-step": (
            "eval.every=1",
            f"eval.path={data_file}",
            "eval.num_prompts=6",
            "eval.samples=2",
        ),
        "cache-freed-each-step": ("rollout.keep_cache=false",),
    }[feature]
    if feature == "lora":
        pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    shared_rows = rows_per_call(monkeypatch, training_forward, "_shared_prompt_hidden")
    packed_rows = rows_per_call(monkeypatch, training_forward, "packed_hidden")
    sessions = sessions_of(monkeypatch)
    run_dir = tmp_path / "run"
    train(make_config(tiny_model_dir, data_file, run_dir, *BF16, *overrides), quiet=True)
    (s,) = sessions
    assert next(s.policy.model.parameters()).device.type == "cuda"
    trained_rows(run_dir, 3)
    trainable = [p for group in s.optimizer.param_groups for p in group["params"]]
    if any(p.dtype == torch.bfloat16 for p in trainable):  # LoRA's adapters are float32
        # oncurve's AdamW, its update compiled and never fallen back
        assert isinstance(s.optimizer, adamw.AdamW) and s.optimizer.compile_error is None
        assert s.optimizer._bfloat16_slice is not adamw._bfloat16_slice
    if feature == "lora":
        changed = load_file(run_dir / "checkpoints" / "step-000003" / "model.safetensors")
        assert changed and all("lora_" in name for name in changed)
        assert all(changed[n].abs().sum() > 0 for n in changed if "lora_B" in n)
        weights = copy.deepcopy(s.policy.peft_model).merge_and_unload().state_dict()
    else:
        weights = s.policy.model.state_dict()
    if feature == "gradient-checkpointing":
        assert any(getattr(m, "gradient_checkpointing", False) for m in s.policy.model.modules())
        assert shared_rows == []  # HF drops the KV cache under checkpointing
    if feature == "shared-prompt-forward":
        assert shared_rows and all(n > 0 for n in shared_rows)
    if feature == "packed-rows":
        assert s.config.model.pack_rows and packed_rows and shared_rows == []
    if feature == "cache-freed-each-step":  # a workspace made, captured and freed each step
        assert s.config.rollout.keep_cache is False and s.sampler._workspaces == []
        assert s.sampler.use_graphs and s.sampler.capture_seconds > 0
    if feature == "eval-every-step":
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in rows if "eval/accuracy" in r]
        assert [r["step"] for r in evaluated] == [0, 1, 2, 3]
        for r in evaluated:
            assert r["eval/accuracy"] * 6 == pytest.approx(round(r["eval/accuracy"] * 6))
            assert 0 <= r["eval/accuracy"] <= 1 and 0 <= r["eval/mean@2"] <= r["eval/pass@2"] <= 1
    assert_final_is(run_dir, weights, tiny_model_dir)


# --- d. resume ---------------------------------------------------------------------------------


INTERRUPTED_TRAIN = """
import os, signal, sys
from oncurve.loop import trainer
from oncurve.cli import main

real_step = trainer.training_step

def step_then_interrupt(s, step):
    metrics = real_step(s, step)
    if step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the step ends and is checkpointed
    return metrics

trainer.training_step = step_then_interrupt
sys.exit(main(["train", "--quiet", *sys.argv[2:]]))
"""


def test_a_cuda_run_stopped_at_step_2_resumes_bit_identically(tiny_model_dir, data_file, tmp_path):
    """4 steps straight against 2 steps stopped by SIGINT and resumed with run.resume=auto, each
    in a fresh process as a user would run them: the same final weights, bit for bit, the same
    metrics and samples."""

    def args(run_dir: Path, *extra: str) -> list[str]:
        return cli_args(tiny_model_dir, data_file, run_dir, *BF16, "run.steps=4", *extra)

    straight = tmp_path / "straight"
    code, err = finish(train_process(*args(straight)))
    assert code == 0, err

    run_dir = tmp_path / "run"
    interrupted = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_TRAIN, "2", *args(run_dir)],
        env=rewards_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, err = finish(interrupted)
    assert code == 0, err
    assert "stopped at step 2 on request" in err
    assert checkpoint.latest_checkpoint(run_dir) == run_dir / "checkpoints" / "step-000002"
    assert not (run_dir / "final").exists()

    code, err = finish(train_process(*args(run_dir, "run.resume=auto")))
    assert code == 0, err
    got = load_file(run_dir / "final" / "model.safetensors")
    want = load_file(straight / "final" / "model.safetensors")
    assert got.keys() == want.keys()
    assert {v.dtype for v in want.values()} == {torch.bfloat16}
    for name in want:
        assert torch.equal(got[name], want[name]), name
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows == metric_rows(straight)
    assert (run_dir / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()


# --- e. from the GPU to the CPU ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_run(tiny_model_dir, data_file, tmp_path_factory) -> Path:
    """A finished 2-step bfloat16 run on cuda with a checkpoint after each step (shared: tests
    copy it before changing it)."""
    run_dir = tmp_path_factory.mktemp("cuda") / "run"
    config = make_config(
        tiny_model_dir, data_file, run_dir, *BF16, "run.steps=2", "run.save_every=1"
    )
    train(config, quiet=True)
    return run_dir


def test_a_checkpoint_written_on_cuda_resumes_on_the_cpu(
    cuda_run, tiny_model_dir, data_file, tmp_path
):
    run_dir = tmp_path / "run"
    shutil.copytree(cuda_run, run_dir)
    config = make_config(
        tiny_model_dir,
        data_file,
        run_dir,
        "model.dtype=bfloat16",  # run.device=cpu comes from make_config
        "run.steps=3",
        "run.resume=auto",
    )
    s = setup(config)
    assert s.start_step == 2
    saved = load_file(run_dir / "checkpoints" / "step-000002" / "model.safetensors")
    state = s.policy.model.state_dict()
    for name, value in saved.items():
        assert state[name].device.type == "cpu"
        assert torch.equal(state[name], value), name
    moments = [s.optimizer.state[p] for p in s.policy.model.parameters()]
    assert moments and all(float(m["step"]) == 2.0 for m in moments)
    tensors = [v for m in moments for v in m.values() if isinstance(v, torch.Tensor)]
    assert {v.device.type for v in tensors} == {"cpu"}
    with s.rewards:
        metrics = training_step(s, 3)
    for key in ("loss/policy", "grad_norm", "reward/mean"):
        assert math.isfinite(metrics[key]), key
    assert metrics["updates/skipped"] == 0
    assert any(not torch.equal(state[name], value) for name, value in saved.items())


@pytest.mark.parametrize(("flags", "device"), [(["--device", "cpu"], "cpu"), ([], "cuda")])
def test_eval_and_sample_run_a_cuda_trained_final_model(
    cuda_run, data_file, monkeypatch, capsys, flags, device
):
    """On the CPU when told, on the GPU by default (`--device auto`)."""
    devices = []
    real_load = model_sources.load_model

    def recording(*args, **kwargs):
        model = real_load(*args, **kwargs)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(model_sources, "load_model", recording)
    final = str(cuda_run / "final")
    evaluation = ["eval", "--model", final, "--data", str(data_file), "--max-new-tokens", "8"]
    assert main([*evaluation, "--samples", "2", *flags]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 40
    assert 0 <= result["accuracy"] <= 1 and 0 <= result["mean@2"] <= result["pass@2"] <= 1
    sample = ["sample", "--model", final, "--prompt", "3+4=", "-n", "3", "--max-new-tokens", "6"]
    assert main([*sample, *flags]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3
    assert all(line["finish_reason"] in ("eos", "stop", "length") for line in lines)
    assert all(isinstance(line["completion"], str) for line in lines)
    assert devices == [device, device]


# --- f. two GPUs -------------------------------------------------------------------------------


@two_gpus
@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_two_nccl_ranks_with_half_the_groups_each_equal_one_gpu_with_all(
    aggregation, tmp_path, exact_fp32
):
    """test_distributed's 2-rank SGD step (`two_rank_step`) on NCCL, one GPU a rank, against one GPU with the
    whole batch, to test_distributed's tolerance. (TF32 is off by default in the ranks.)"""
    two_ranks = two_rank_step(aggregation, tmp_path, fsdp=False, device="cuda")
    one_gpu = one_step(aggregation, None, device="cuda")
    initial = tiny_qwen2(VOCAB, seed=0).state_dict()
    moved = max(float((one_gpu[k] - initial[k]).abs().max()) for k in one_gpu)
    assert moved > 1e-3  # the step did something, so equality below means something
    for name, tensor in one_gpu.items():
        torch.testing.assert_close(two_ranks[name], tensor, atol=1e-6, rtol=0)


@two_gpus
def test_a_two_gpu_run_under_fsdp2_trains_as_under_ddp(tiny_model_dir, data_file, tmp_path):
    """`oncurve train dist.nproc=2 run.device=cuda` with and without FSDP2: the helper checks
    that both trained alike (weights to 1e-6, gradient norms to 1e-5 relative)."""
    sharded, replicated, _ = sharded_and_replicated_runs(
        tiny_model_dir, data_file, tmp_path, *FP32, "run.steps=2"
    )
    for run_dir in (sharded, replicated):
        trained_rows(run_dir, 2)
        assert sorted(p.name for p in (run_dir / "checkpoints" / "step-000002").glob("rng-*")) == [
            "rng-rank0.json",
            "rng-rank1.json",
        ]
