"""The training loop end to end on a tiny random model, checked against hand-assembled math."""

from __future__ import annotations

import copy
import gc
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import transformers
from helpers.configs import make_config
from helpers.first_step import capture_first_step, hand_assembled_grpo
from helpers.models import tiny_qwen2
from helpers.sessions import sessions_of

from oncurve.config import load_config
from oncurve.data.given import holding
from oncurve.loop import trainer
from oncurve.loop import training_step as loop_step
from oncurve.loop.trainer import setup, train
from oncurve.loop.training_step import training_step
from oncurve.rollout import cpu_llama
from oncurve.update import policy


@pytest.mark.parametrize("fused", [True, False])
def test_three_steps_write_finite_metrics_samples_and_a_loadable_final_model(
    tiny_model_dir, data_file, tmp_path, monkeypatch, fused
):
    if not fused:  # the decode a larger model gets: q, k, v as the model's own three weights
        monkeypatch.setattr(cpu_llama, "FUSE_MAX_BYTES", 0)
    run_dir = tmp_path / "run"
    sessions = sessions_of(monkeypatch)
    result = train(make_config(tiny_model_dir, data_file, run_dir), quiet=True)
    (s,) = sessions  # the session the run built: the GPU tests read it the same way
    # off CUDA the update keeps its gradients, zeroed (on CUDA they are freed: tests/gpu)
    assert all(p.grad is not None and not p.grad.any() for p in s.policy.trainable())
    trainable = [p for group in s.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in trainable} == {id(p) for p in s.policy.trainable()}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in (
        "reward/mean",
        "reward/std",
        "reward/count_digits",
        "groups/all_equal_frac",
        "adv/abs_mean",
        "loss/policy",
        "kl",
        "entropy",
        "clip/low_frac",
        "clip/high_frac",
        "ratio/min",
        "ratio/max",
        "grad_norm",
        "lr",
        "length/mean",
        "length/max",
        "length/truncated_frac",
        "time/rollout",
        "time/reward",
        "time/reference",
        "time/train",
        "tokens_per_s",
        "logprob_diff/max",
    ):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert all(r["logprob_diff/max"] < 1e-4 for r in rows)
    phases = ("rollout", "reward", "reference", "train")
    for r in rows:
        assert r["time/step"] == pytest.approx(sum(r[f"time/{k}"] for k in phases), rel=1e-12)
    # 16 completions a step; the running total grows by exactly the tokens each step sampled
    totals = [0.0] + [r["tokens/total"] for r in rows]
    for r, before, after in zip(rows, totals, totals[1:], strict=False):
        assert after - before == pytest.approx(16 * r["length/mean"], abs=1e-3)
    assert (run_dir / "samples.jsonl").read_text().count("\n") == 3 * 4
    assert result.steps == 3

    # the final model's files follow the umask, as the run's others do (safetensors writes 0600)
    umask = os.umask(0o022)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in (run_dir / "final").iterdir()} == {0o666 & ~umask}
    final = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final")
    tokenizer = transformers.AutoTokenizer.from_pretrained(run_dir / "final")
    initial = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = [
        not torch.equal(p, q) for p, q in zip(final.parameters(), initial.parameters(), strict=True)
    ]
    assert any(changed)
    prompt = tokenizer(["1+1="], return_tensors="pt")
    out = final.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)


def test_first_step_matches_hand_assembled_grpo(tiny_model_dir, data_file, tmp_path):
    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", "optim.grad_clip=0", "algo.beta=0.04"
    )
    s = setup(config)
    initial = copy.deepcopy(s.policy.model)
    metrics, rollout, grads = capture_first_step(s)
    assert rollout.num_rows == 16
    loss, expected = hand_assembled_grpo(initial, rollout)
    assert metrics["loss/policy"] == pytest.approx(loss, abs=1e-6)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5)
    assert metrics["ratio/min"] == metrics["ratio/max"] == 1.0


def test_fewer_rows_than_a_step_takes_are_said_at_start(tiny_model_dir, tmp_path, capsys):
    """A step then repeats prompts: said in one line, as a file of the wrong split would be."""
    rows = tmp_path / "three.jsonl"
    rows.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(3)))
    setup(make_config(tiny_model_dir, rows, tmp_path / "run", "data.prompts_per_step=4"))
    assert "data: 3 training rows, fewer than data.prompts_per_step=4" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["algo.preset=gspo", "algo.minibatches=1"], "algo.loss=gspo's clip of the sequence ratio"),
        (["algo.preset=cispo", "algo.minibatches=1"], "algo.loss=cispo's cap of the weight"),
        (["algo.epsilon_high=0.28"], "algo.epsilon_high=0.28"),
        (["algo.preset=dapo", "algo.minibatches=1"], "algo.epsilon_high=0.28"),
        (["algo.preset=gspo"], None),  # 4 minibatches: the ratio moves after the first
        (["algo.epsilon_high=0.28", "algo.mu=2"], None),
        ([], None),  # DeepSeekMath's symmetric clip at mu=1 is GRPO as it is meant
    ],
)
def test_a_clip_that_an_on_policy_update_never_reaches_is_said_at_start(
    tiny_model_dir, data_file, tmp_path, capsys, settings, said
):
    """With algo.mu * algo.minibatches = 1 the old logprobs are the current ones: every ratio
    is 1, so GSPO's clip, CISPO's cap and a clip-higher bound never bind."""
    setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *settings))
    err = capsys.readouterr().err
    if said is None:
        assert "never binds" not in err
    else:
        assert (
            f"warning: {said} never binds with algo.mu=1 and algo.minibatches=1: the update "
            "is on-policy, so every importance ratio is 1; set algo.minibatches or algo.mu "
            "above 1\n"
        ) in err


def test_held_out_prompts_that_are_also_training_prompts_are_said_at_start(
    tiny_model_dir, tmp_path, capsys
):
    train_rows = tmp_path / "train.jsonl"
    train_rows.write_text(
        "".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(6))
    )
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        "".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(4, 9))
    )
    setup(make_config(tiny_model_dir, train_rows, tmp_path / "run", f"eval.path={held_out}"))
    assert (
        "eval: 2 of the 5 held-out prompts are training prompts too: held-out accuracy is "
        "measured partly on the training set"
    ) in capsys.readouterr().err


def test_a_task_with_fewer_test_problems_than_asked_says_so_at_start(tmp_path, capsys):
    setup(load_config(None, ["data.task=sums", f"run.dir={tmp_path / 'run'}", "run.device=cpu"]))
    assert (
        "eval: sums has 43 test problems, fewer than eval.num_prompts=500: each evaluation "
        "scores them all"
    ) in capsys.readouterr().err


def test_an_eval_file_longer_than_eval_num_prompts_says_so_at_start(
    tiny_model_dir, data_file, tmp_path, capsys
):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(7)))
    options = [f"eval.path={held_out}", "eval.num_prompts=5"]
    setup(make_config(tiny_model_dir, data_file, tmp_path / "run", *options))
    assert (
        f"eval: {held_out} has 7 rows; each evaluation scores the first eval.num_prompts=5 "
        "(null, or a larger number, for them all)"
    ) in capsys.readouterr().err
    # rows passed to `oncurve.train` are named as they were passed, not as config.yaml names them
    rows = [json.loads(line) for line in held_out.read_text().splitlines()]
    given = ["eval.path=given:eval_dataset", "eval.num_prompts=5"]
    with holding({"eval_dataset": rows}):
        setup(make_config(tiny_model_dir, data_file, tmp_path / "given", *given))
    assert (
        "eval: eval_dataset has 7 rows; each evaluation scores the first "
        "eval.num_prompts=5 (null, or a larger number, for them all)"
    ) in capsys.readouterr().err


def test_beta_zero_never_builds_a_reference(tiny_model_dir, data_file, tmp_path, monkeypatch):
    copies = []
    monkeypatch.setattr(policy, "frozen_copy", lambda m: copies.append(m) or m)
    s = setup(make_config(tiny_model_dir, data_file, tmp_path / "run", "algo.beta=0.0"))
    assert s.policy.reference is None and copies == []


def test_mu_two_computes_pi_old_once_before_the_update_and_the_second_pass_moves_the_ratio(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    s = setup(
        make_config(
            tiny_model_dir,
            data_file,
            tmp_path / "run",
            "algo.mu=2",
            "algo.beta=0.0",
            "optim.lr=1e-2",
        )
    )
    initial = copy.deepcopy(s.policy.model)
    calls, old, passes = [], [], []
    real_logprobs, real_step = policy.batch_logprobs, loop_step.optimizer_step

    def batch_logprobs(model, batch, *args):
        calls.append(model)
        old.append((batch, real_logprobs(model, batch, *args)))
        return old[-1][1]

    def optimizer_step(*args, **kwargs):
        passes.append(real_step(*args, **kwargs))
        return passes[-1]

    monkeypatch.setattr(policy, "batch_logprobs", batch_logprobs)
    monkeypatch.setattr(loop_step, "optimizer_step", optimizer_step)
    metrics = training_step(s, 1)
    assert calls == [s.policy.train_forward]
    assert len(passes) == 2
    # pi_old is a forward of the weights before the first update: a plain HF forward of them
    ((batch, pi_old),) = old
    mask = batch.completion_mask.bool()
    ids, attention = batch.input_ids, batch.attention_mask
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    t = mask.shape[1]
    with torch.no_grad():
        logits = initial(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    expected = torch.log_softmax(logits[:, -t - 1 : -1], -1).gather(-1, ids[:, -t:, None])
    torch.testing.assert_close(pi_old[mask], expected.squeeze(-1)[mask], atol=1e-6, rtol=0)
    assert (pi_old[~mask] == 0).all()
    # so the first pass, at those weights, has ratio 1; the second, one update later, does not
    assert passes[0]["ratio/min"] == pytest.approx(1.0, abs=1e-6)
    assert passes[0]["ratio/max"] == pytest.approx(1.0, abs=1e-6)
    assert passes[1]["ratio/min"] < 0.99 and passes[1]["ratio/max"] > 1.01
    assert metrics["ratio/min"] == passes[1]["ratio/min"]
    assert metrics["ratio/max"] == passes[1]["ratio/max"]


def test_constant_reward_gives_zero_advantage_and_leaves_weights_unchanged(
    tiny_model_dir, data_file, tmp_path
):
    config = make_config(
        tiny_model_dir,
        data_file,
        tmp_path / "run",
        "algo.beta=0.0",
        "optim.weight_decay=0.0",
        "reward.functions=[helpers.rewards_for_tests:constant]",
    )
    s = setup(config)
    before = {n: p.detach().clone() for n, p in s.policy.model.named_parameters()}
    metrics = training_step(s, 1)
    assert metrics["adv/abs_mean"] == 0.0
    assert metrics["groups/all_equal_frac"] == 1.0
    for name, param in s.policy.model.named_parameters():
        assert torch.equal(param, before[name]), name


def test_gradient_checkpointing_gives_the_same_update(tiny_model_dir, data_file, tmp_path):
    """Recomputing activations in backward saves memory and changes nothing else."""
    weights = []
    for flag in ("false", "true"):
        config = make_config(
            tiny_model_dir,
            data_file,
            tmp_path / flag,
            f"model.gradient_checkpointing={flag}",
            # checkpointing runs every row whole, so the plain run must too for 1e-6
            "model.share_prompt_forward=false",
            "optim.lr=1e-2",
        )
        s = setup(config)
        enabled = any(getattr(m, "gradient_checkpointing", False) for m in s.policy.model.modules())
        assert enabled == (flag == "true")
        training_step(s, 1)
        training_step(s, 2)
        weights.append({n: p.detach().clone() for n, p in s.policy.model.named_parameters()})
    initial = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    plain, checkpointed = weights
    assert max(float((plain[n] - initial[n]).abs().max()) for n in plain) > 1e-3
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, atol=1e-6, rtol=0)


def test_a_bfloat16_model_trains_in_bfloat16_with_float32_logprobs(
    tiny_model_dir, data_file, tmp_path
):
    run_dir = tmp_path / "run"
    config = make_config(
        tiny_model_dir, data_file, run_dir, "model.dtype=bfloat16", "optim.lr=1e-2"
    )
    train(config, quiet=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss/policy", "kl", "entropy", "grad_norm"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert all(r["updates/skipped"] == 0 for r in rows)
    # the sampler and the trainer run the same bf16 weights; their logprobs agree to bf16
    # rounding of the activations, not to float32's 1e-5
    assert all(r["logprob_diff/max"] < 1e-2 for r in rows)
    final = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final", dtype="auto")
    initial = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.bfloat16
    )
    assert {p.dtype for p in final.parameters()} == {torch.bfloat16}
    moved = [
        not torch.equal(p, q) for p, q in zip(final.parameters(), initial.parameters(), strict=True)
    ]
    assert all(moved)


def test_cli_rejects_an_unknown_key_with_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "oncurve", "train", "algo.betta=0.1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2
    assert len(lines) == 1 and "unknown key algo.betta" in lines[0]


def test_deterministic_kernels_hold_for_the_run_only():
    from oncurve.update.determinism import deterministic_kernels

    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory  # torch's default
    with deterministic_kernels(True):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory
    with deterministic_kernels(False):
        assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_kernels_launch_no_fill_of_memory_a_step_writes_anyway():
    """Deterministic mode alone fills each `empty` tensor with NaN, a kernel each (on CUDA
    most ops' outputs): a forward and backward of a tiny model runs as many fills under
    `deterministic_kernels` as with deterministic algorithms off, and its gradients are
    those."""
    from torch.profiler import ProfilerActivity, profile

    from oncurve.update.determinism import deterministic_kernels

    model = tiny_qwen2(50)
    ids = torch.randint(0, 50, (4, 24), generator=torch.Generator().manual_seed(0))

    def fills_and_gradients() -> tuple[int, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(ids).logits.float().logsumexp(-1).sum().backward()
        fills = sum(e.count for e in prof.key_averages() if e.key == "aten::fill_")
        return fills, [p.grad.clone() for p in model.parameters()]

    plain, want = fills_and_gradients()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        filled, _ = fills_and_gradients()  # torch's deterministic mode as it comes
    finally:
        torch.use_deterministic_algorithms(False)
    with deterministic_kernels(True):
        ours, got = fills_and_gradients()
    assert filled > plain and ours == plain
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_an_evaluation_frees_the_workspace_it_sampled_in(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """With the cuda_graph sampler (eager on the CPU) an evaluation of more rows than a step's
    samples in a workspace of its own, freed when it ends, so that the updates until the next
    evaluation run beside the training workspace alone."""
    config = make_config(
        tiny_model_dir, data_file, tmp_path / "run", "rollout.backend=cuda_graph",
        "rollout.cuda_graphs=false", f"eval.path={data_file}", "eval.num_prompts=24",
    )  # fmt: skip
    s = setup(config)
    made = []
    workspace = s.sampler._workspace

    def recording(rows: int, width: int, new: int) -> object:
        made.append(rows)
        return workspace(rows, width, new)

    monkeypatch.setattr(s.sampler, "_workspace", recording)
    with s.rewards:
        training_step(s, 1)
        trainer._evaluate(s, 1)
        training_step(s, 2)
    assert made == [16, 24, 16]
    assert [ws.rows for ws in s.sampler._workspaces] == [16]


def test_a_cache_not_kept_is_freed_after_each_steps_sampling_and_trains_the_same(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """`rollout.keep_cache=false`: the cuda_graph sampler's workspace (eager on the CPU) is
    freed when a step's sampling ends, before the update, and made again by the next step,
    without a whole garbage collection when nothing else holds it; the steps' metrics are
    those of a run that keeps it."""
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    runs = {}
    for keep in ("true", "false"):
        config = make_config(
            tiny_model_dir, data_file, tmp_path / keep, "rollout.backend=cuda_graph",
            "rollout.cuda_graphs=false", f"rollout.keep_cache={keep}",
        )  # fmt: skip
        s = setup(config)
        assert s.config.rollout.keep_cache is (keep == "true")
        kept = []
        with s.rewards:
            for step in (1, 2):
                runs.setdefault(keep, []).append(training_step(s, step))
                kept.append(len(s.sampler._workspaces))
        assert kept == ([1, 1] if keep == "true" else [0, 0])
    assert collections == []
    assert_same_untimed_metrics(runs["true"], runs["false"])


def assert_same_untimed_metrics(steps: list[dict], others: list[dict]) -> None:
    """Each step's metrics are the other run's, but for times and memory (over 20 remain)."""
    for step, other in zip(steps, others, strict=True):
        timed = ("time/", "memory/", "tokens_per_s", "reward/slowest_row_s")
        untimed = {k: v for k, v in step.items() if not k.startswith(timed)}
        assert len(untimed) > 20 and untimed == {k: other[k] for k in untimed}


def test_a_reference_offloaded_between_passes_trains_and_syncs_as_a_kept_one(
    tiny_model_dir, data_file, tmp_path, monkeypatch
):
    """`model.offload_reference=true` (on the CPU its "device" copies are host copies): each
    step's reference pass runs on copies made for it, the reference's own tensors stay the
    same host tensors, `algo.ref_sync_every` writes the policy into them, and the steps'
    metrics are those of a run whose reference stays in place."""
    entered = []
    real_weights_on = policy.weights_on
    monkeypatch.setattr(
        policy,
        "weights_on",
        lambda module, device: entered.append(device) or real_weights_on(module, device),
    )
    runs, references = {}, {}
    for offload in ("true", "false"):
        config = make_config(
            tiny_model_dir, data_file, tmp_path / offload, "algo.beta=0.04",
            "algo.ref_sync_every=1", f"model.offload_reference={offload}",
        )  # fmt: skip
        s = setup(config)
        assert s.policy.reference_offloaded is (offload == "true")
        pointers = [p.data_ptr() for p in s.policy.reference.parameters()]
        with s.rewards:
            for step in (1, 2):
                runs.setdefault(offload, []).append(training_step(s, step))
        assert [p.data_ptr() for p in s.policy.reference.parameters()] == pointers
        references[offload] = s.policy.reference.state_dict()
        trained = s.policy.model.state_dict()
        assert all(torch.equal(references[offload][k], trained[k]) for k in trained)  # synced
    assert entered == [torch.device("cpu")] * 2
    assert all("kl" in step for step in runs["true"])
    assert_same_untimed_metrics(runs["true"], runs["false"])
    assert all(torch.equal(references["true"][k], v) for k, v in references["false"].items())
