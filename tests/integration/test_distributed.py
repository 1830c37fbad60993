"""Data parallelism on 2 gloo ranks equals one process on the same global batch (on 2 NCCL
ranks too: tests/gpu/test_gpu.py runs its helpers, helpers/data_parallel.py, with device="cuda")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from helpers.batches import GROUPS, VOCAB, G, fixed_batch, loss_fns
from helpers.data_parallel import (
    _rank_step,
    _sharded_and_replicated,
    one_step,
    sharded_and_replicated_runs,
)
from helpers.models import tiny_qwen2
from helpers.paths import TESTS
from helpers.rank_pool import RankPool
from helpers.run_processes import (
    descendants,
    finish,
    kill_all,
    latest_step,
    still_alive,
    wait_for,
)
from helpers.runs import run_clis, tiny_job
from safetensors.torch import load_file

from oncurve import distributed
from oncurve.algo import group_advantages
from oncurve.algo.registry import AGGREGATIONS
from oncurve.cli import main
from oncurve.errors import UserError
from oncurve.model.forward import PolicyLogprobs
from oncurve.update.microbatches import ForwardSettings, microbatches
from oncurve.update.step import optimizer_step

LONG = 400  # steps of a run that a signal stops long before its end


def test_each_optimizer_step_applies_only_its_own_gradient() -> None:
    """Two steps in a row equal a fresh optimizer's one step from the first step's weights:
    the gradients kept between steps (zeroed in place, not freed) carry nothing over."""
    model = tiny_qwen2(VOCAB, seed=0)
    batch, fns = fixed_batch(model), loss_fns("seq-mean-token-mean")

    def step(net: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        forward = ForwardSettings(chunk_size=16, microbatch_rows=4)
        optimizer_step(PolicyLogprobs(net), optimizer, batch, fns, forward, grad_clip=0)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    step(model, optimizer)
    fresh = tiny_qwen2(VOCAB, seed=0)
    fresh.load_state_dict(model.state_dict())
    step(model, optimizer)
    step(fresh, torch.optim.SGD(fresh.parameters(), lr=0.5))
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, atol=1e-6, rtol=0, msg=name)


def _gloo_step(
    rank: int,
    world_size: int,
    aggregation: str,
    fsdp: bool,
    pack: bool,
    microbatch: tuple[int, int],
) -> dict[str, torch.Tensor] | None:
    """A `two_ranks` job: `_rank_step` on gloo ranks (the pool leaves the group after it)."""
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return _rank_step(rank, world_size, aggregation, fsdp, "cpu", pack, microbatch)


def gloo_step(
    two_ranks: RankPool,
    aggregation: str,
    fsdp: bool,
    pack: bool = False,
    microbatch: tuple[int, int] = (2, 0),
) -> dict[str, torch.Tensor]:
    """`two_rank_step` on the CPU, run by the session's two gloo ranks (`rank_pool`)."""
    weights, _ = two_ranks.run(_gloo_step, aggregation, fsdp, pack, microbatch)
    return weights


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_two_ranks_with_half_the_groups_each_equal_one_rank_with_all(aggregation, two_ranks):
    on_two = gloo_step(two_ranks, aggregation, fsdp=False)
    one_rank = one_step(aggregation, None)
    initial = tiny_qwen2(VOCAB, seed=0).state_dict()
    moved = max(float((one_rank[k] - initial[k]).abs().max()) for k in one_rank)
    assert moved > 1e-3  # the step did something, so equality below means something
    for name, tensor in one_rank.items():
        torch.testing.assert_close(on_two[name], tensor, atol=1e-6, rtol=0)


def test_fsdp2_on_two_ranks_matches_the_data_parallel_update(two_ranks):
    sharded = gloo_step(two_ranks, "token-mean", fsdp=True)
    one_rank = one_step("token-mean", None)
    for name, tensor in one_rank.items():
        torch.testing.assert_close(sharded[name], tensor, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_packed_rows_on_two_ranks_equal_padded_rows_on_one(fsdp, two_ranks):
    """Packed rows, each group's prompt once, under DDP and under FSDP2 (the segments' bounds
    reach each wrapped layer as keyword arguments): one rank's padded update."""
    packed = gloo_step(two_ranks, "token-mean", fsdp=fsdp, pack=True)
    padded = one_step("token-mean", None)
    for name, tensor in padded.items():
        torch.testing.assert_close(packed[name], tensor, atol=1e-5, rtol=0, msg=name)


def test_fsdp2_ranks_whose_token_caps_cut_them_unequal_microbatches_all_finish(two_ranks):
    """A 28-token cap cuts rank 0's rows into 3 microbatches and rank 1's into 2, while each
    forward of an FSDP2 module gathers its weights on every rank: rank 1 runs a stand-in
    forward and backward that adds nothing (`train_step.even_across_ranks`), so neither waits
    for ever, and the step is one rank's with the same cap."""
    model = tiny_qwen2(VOCAB, seed=0)
    batch = fixed_batch(model)
    halves = [batch.rows(slice(r * GROUPS * G // 2, (r + 1) * GROUPS * G // 2)) for r in (0, 1)]
    assert [len(microbatches(half, 6, 28)) for half in halves] == [3, 2]
    sharded = gloo_step(two_ranks, "token-mean", fsdp=True, microbatch=(6, 28))
    one_rank = one_step("token-mean", None, microbatch=(6, 28))
    for name, tensor in one_rank.items():
        torch.testing.assert_close(sharded[name], tensor, atol=1e-5, rtol=0, msg=name)


def _batch_scale_rank(rank: int, world_size: int, rewards: torch.Tensor) -> dict:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rows = distributed.shard(rewards.numel() // G, rank, world_size)
    local = rewards[rows.start * G : rows.stop * G]
    std = distributed.batch_std(local)
    adv = group_advantages(local, G, "batch", batch_std=std)
    return {"adv": adv, "std": std.reshape(1)}


def test_batch_scaled_advantages_on_two_ranks_equal_one_rank(two_ranks):
    """scale="batch" divides by the std of the GLOBAL batch, reduced across ranks."""
    g = torch.Generator().manual_seed(2)
    rewards = torch.randint(0, 4, (GROUPS * G,), generator=g).float()
    rewards[:G] += 10.0  # only on rank 0: each rank's own std is far from the batch's
    rewards[[1, 7]] = float("nan")  # one per rank, left out of the std
    ranks = two_ranks.run(_batch_scale_rank, rewards)
    finite = rewards[torch.isfinite(rewards)]
    for saved in ranks:
        assert saved["std"].item() == pytest.approx(finite.std(unbiased=False).item(), rel=1e-6)
    full = group_advantages(rewards, G, "batch")
    got = torch.cat([saved["adv"] for saved in ranks])
    torch.testing.assert_close(got, full, atol=1e-6, rtol=0)
    # without the reduction rank 1 would divide by its own std, a fraction of the global one
    rank1 = rewards[GROUPS * G // 2 :]
    assert rank1[torch.isfinite(rank1)].std(unbiased=False) < 0.5 * ranks[1]["std"].item()


def test_shard_refuses_groups_that_do_not_divide(tmp_path: Path):
    with pytest.raises(ValueError, match="must be divisible by the number of ranks"):
        distributed.shard(5, 0, 2)


def test_on_torch_2_4_checkpoints_keep_their_tensors_and_fsdp_is_a_one_line_error(monkeypatch):
    """torch 2.4 (the declared floor) has an empty `torch.distributed.tensor` and FSDP2 only
    under a private name: every checkpoint's optimizer state passes through `whole_state` and
    a resume through `shard_optimizer_state`, which must not need DTensor, and
    `dist.fsdp=true` says what it needs instead of an ImportError."""
    for name in ("torch.distributed.tensor", "torch.distributed.fsdp"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    param = torch.nn.Parameter(torch.randn(3, 2))
    optimizer = torch.optim.AdamW([param])
    param.grad = torch.ones_like(param)
    optimizer.step()
    state = optimizer.state_dict()
    whole = distributed.whole_state(state)
    assert whole["state"][0]["exp_avg"] is state["state"][0]["exp_avg"]
    assert whole["param_groups"] == state["param_groups"]
    exp_avg = optimizer.state[param]["exp_avg"]
    distributed.shard_optimizer_state(optimizer)
    assert optimizer.state[param]["exp_avg"] is exp_avg
    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    with pytest.raises(
        UserError, match=r"^dist.fsdp=true needs torch 2.6 or later .*this is torch"
    ):
        distributed.wrap(torch.nn.Linear(2, 2), "cpu", fsdp=True)


@pytest.fixture(scope="module")
def two_rank_runs(
    tiny_model_dir, data_file, tmp_path_factory
) -> tuple[Path, Path, list[str], subprocess.CompletedProcess]:
    """3 steps of the 2-rank `oncurve train` job (mu = 2, a checkpoint each step) under FSDP2
    and under DDP, checked alike by `sharded_and_replicated_runs`, for the tests below: (FSDP2
    run dir, DDP run dir, the shared arguments, the DDP run's finished process). Each test
    changes one run dir only: the DDP one its test of the files and the resume, the FSDP2 one
    its test of the resume from a checkpoint."""
    return _sharded_and_replicated(
        tiny_model_dir,
        data_file,
        tmp_path_factory.mktemp("two-rank-runs"),
        "run.steps=3",
        "algo.mu=2",
    )


def oncurve_process(args: list[str], stdout: int = subprocess.PIPE) -> subprocess.Popen:
    """`python -m oncurve ARGS` started, the tests' helpers importable, its stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "oncurve", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks' pids in /proc")
def test_two_rank_run_writes_one_log_one_checkpoint_set_and_resumes(two_rank_runs, capsys):
    _, run_dir, common, first = two_rank_runs
    common = [*common, f"run.dir={run_dir}", "dist.fsdp=false"]
    # rank 0 alone reports: one progress line for the last step, one summary
    assert first.stderr.count("step 3/3") == 1
    assert len(first.stdout.strip().splitlines()) == 1
    metrics = run_dir / "metrics.jsonl"
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-000001", "step-000002", "step-000003"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step-000003").glob("rng-*")) == [
        "rng-rank0.json",
        "rng-rank1.json",
    ]
    # resumed, and its launcher killed outright once two steps more are logged: it forwards
    # nothing, torchrun is sent SIGTERM by the kernel and the job stops (at a step's end, with
    # its checkpoint) instead of training on orphaned (a SIGTERM to the launcher: the FSDP2
    # test below)
    resume = [*common, f"run.steps={LONG}", "run.save_every=1000", "run.resume=auto"]
    launcher = oncurve_process(resume, stdout=subprocess.DEVNULL)
    job_pids: list[int] = []
    try:
        wait_for(lambda: len(metrics.read_text().splitlines()) > 4, launcher, "two steps")
        job_pids = descendants(launcher.pid)
        assert len(job_pids) >= 3  # torchrun and two ranks
        launcher.kill()
        launcher.wait()
        left = still_alive(job_pids, 60)
    finally:
        kill_all(job_pids)
        launcher.stderr.close()
    assert left == []
    assert latest_step(run_dir) < LONG  # stopped, not run to its end
    # one process (in this one: the refusal comes before any rank would start)
    one_rank = [a for a in common if a != "dist.nproc=2"]
    assert main([*one_rank, "dist.nproc=1", f"run.steps={LONG + 1}", "run.resume=auto"]) == 2
    assert "written by 2 ranks" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks' pids in /proc")
def test_fsdp2_run_equals_the_data_parallel_run_resumes_exactly_and_stops_on_sigterm(
    two_rank_runs,
):
    """`oncurve train dist.fsdp=true` on 2 ranks: the same weights and metrics as DDP after 3
    steps (sampling reads the gathered copy; the update and the pi_old pass of mu = 2 read the
    shards; checked by the fixture), a checkpoint in the single-process format, and a resume
    from step 2 that reproduces step 3. SIGTERM to the launcher once the resumed job has logged
    step 4 (what tests/integration/test_stopping.py's table says of the launcher): it forwards
    the signal to its ranks, both finish the step under way, one checkpoint holds both ranks'
    state, every process of the job has ended and the launcher exits 0."""
    sharded, _, common, _ = two_rank_runs
    final = load_file(sharded / "final" / "model.safetensors")
    resume_from = sharded / "checkpoints" / "step-000002"
    saved = torch.load(resume_from / "optimizer.pt", weights_only=True)["optimizer"]
    shapes = sorted(tuple(s["exp_avg"].shape) for s in saved["state"].values())
    assert shapes == sorted(tuple(v.shape) for v in final.values())  # whole, not shards

    resume = [*common, f"run.dir={sharded}", "dist.fsdp=true", f"run.resume={resume_from}"]
    resume += ["run.overwrite=true", f"run.steps={LONG}", "run.save_every=3"]  # saves step 3
    metrics = sharded / "metrics.jsonl"
    launcher = oncurve_process(resume)
    job_pids: list[int] = []
    try:
        wait_for(lambda: len(metrics.read_text().splitlines()) >= 4, launcher, "step 4")
        job_pids = descendants(launcher.pid)
        assert len(job_pids) >= 3  # torchrun and two ranks
        launcher.send_signal(signal.SIGTERM)
        code, err = finish(launcher)
        left = still_alive(job_pids, 10)
    finally:
        kill_all(job_pids)
        launcher.kill()
        launcher.wait()
    assert code == 0, err[-3000:]
    assert left == []
    step_3 = load_file(sharded / "checkpoints" / "step-000003" / "model.safetensors")
    for name, value in step_3.items():
        torch.testing.assert_close(value, final[name], atol=1e-7, rtol=0, msg=name)
    stopped_at = latest_step(sharded)
    assert 4 <= stopped_at < LONG
    stop = sharded / "checkpoints" / f"step-{stopped_at:06d}"
    assert sorted(p.name for p in stop.glob("rng-*")) == ["rng-rank0.json", "rng-rank1.json"]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, stopped_at + 1))
    assert f"stopped at step {stopped_at} on request" in err


@pytest.mark.slow  # the longest of the suite; FSDP2 against DDP is also held for GRPO above
def test_ppo_under_fsdp2_equals_ppo_under_data_parallelism(tiny_model_dir, data_file, tmp_path):
    """PPO's policy sharded by FSDP2, its critic replicated by DDP: the policy (checked by the
    helper) and the critic end as in the all-DDP run."""
    sharded, replicated, _ = sharded_and_replicated_runs(
        tiny_model_dir, data_file, tmp_path, "run.steps=2", "algo.preset=ppo"
    )
    critic_file = Path("checkpoints") / "step-000002" / "value.safetensors"
    critic = load_file(sharded / critic_file)
    earlier = load_file(sharded / "checkpoints" / "step-000001" / "value.safetensors")
    assert max(float((critic[k] - earlier[k]).abs().max()) for k in critic) > 1e-5  # it trained
    for name, value in load_file(replicated / critic_file).items():
        torch.testing.assert_close(critic[name], value, atol=1e-6, rtol=0, msg=name)


@pytest.fixture(scope="module")
def rank_1_fault_runs(
    tiny_model_dir, data_file, tmp_path_factory
) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """The two 2-rank jobs whose rank 1 meets a fault, run at once for the two tests below:
    their run dirs and finished processes, by fault ("raises", "oom")."""
    tmp_path = tmp_path_factory.mktemp("rank-1-faults")
    raises = [
        "train",
        f"model.path={tiny_model_dir}",
        f"data.path={data_file}",
        "data.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_new_tokens=8",
        "reward.functions=[helpers.rewards_for_tests:fails_on_rank_1]",
        "reward.timeout=null",
        f"run.dir={tmp_path / 'raises'}",
        "run.steps=3",
        "dist.nproc=2",
        "dist.timeout_s=30",
        "run.device=cpu",
    ]
    oom = [*tiny_job(tiny_model_dir, data_file), f"run.dir={tmp_path / 'oom'}", "dist.nproc=2"]
    oom = [a.replace("helpers.rewards_for_tests:", "helpers.oom_on_rank_1:") for a in oom]
    procs = run_clis([raises, [*oom, "run.steps=2"]], timeout=180)
    return {"raises": (tmp_path / "raises", procs[0]), "oom": (tmp_path / "oom", procs[1])}


def test_a_rank_that_raises_fails_the_job_instead_of_hanging(rank_1_fault_runs):
    # rank 1's reward raises on its first call; rank 0 waits in the next collective until the
    # process group sees the peer gone (or dist.timeout_s), then torchrun exits non-zero.
    _, proc = rank_1_fault_runs["raises"]
    assert proc.returncode != 0
    assert "reward 'fails_on_rank_1' failed" in proc.stderr
    # rank 0 says in one line that a peer failed, with no traceback of its own
    assert "rank 0: a collective failed: another rank" in proc.stderr
    assert "[rank0]: Traceback" not in proc.stderr


def test_a_rank_that_runs_out_of_memory_sampling_redoes_it_and_every_rank_takes_its_setting(
    rank_1_fault_runs,
):
    """Rank 1 runs out of memory in its first sampling call: it samples again in calls of
    half as many prompts while rank 0 goes on, neither hangs, and from the end of that step
    both sample with the smaller setting (`oncurve.run.oom.agree`)."""
    run_dir, proc = rank_1_fault_runs["oom"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "out of memory in sampling: redoing it with rollout.prompts_per_call 2 -> 1" in (
        proc.stderr
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    retries = [r["memory/oom_retries"] for r in rows if "memory/oom_retries" in r]
    assert retries == [0.5, 0.0]  # the mean over ranks: one rank redid its sampling once
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["rollout"]["prompts_per_call"] == 1  # rank 0's config: it took rank 1's
