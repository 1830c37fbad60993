"""The memory plan: hand-computed estimates, the choices it makes, and how the trainer applies
it (on the CPU; a CUDA device is only named, the budget given, so no GPU is needed)."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch
from helpers.models import tiny_qwen2

from oncurve.config import load_config
from oncurve.model import devices
from oncurve.model.devices import resolve_dtype
from oncurve.rollout import backend_named
from oncurve.run.memory_plan import (
    GIB,
    KEPT_CACHE_BYTES,
    ModelShape,
    activation_bytes_per_token,
    forward_only_bytes_per_token,
    forward_only_tokens,
    keeps_sampler_cache,
    kv_cache_bytes,
    logits_bytes,
    logits_chunk,
    offloads_reference,
    plan_memory,
    sampling_bytes,
    state_bytes,
)
from oncurve.run.session import token_caps
from oncurve.run.settle import RunFacts, settle_memory

# Qwen2.5-0.5B: 494,032,768 parameters, tied embeddings, bfloat16.
QWEN_05B = ModelShape(
    params=494_032_768,
    trainable=494_032_768,
    layers=24,
    hidden=896,
    intermediate=4864,
    kv_dim=128,
    vocab=151_936,
    weight_bytes=2,
    tied=True,
)
SMALL = ModelShape(
    params=1000, trainable=1000, layers=2, hidden=4, intermediate=8, kv_dim=2, vocab=10,
    weight_bytes=4, tied=False,
)  # fmt: skip


def settled_memory(
    config,
    model: torch.nn.Module,
    device: torch.device,
    world_size: int,
    seq_len: int,
    saved: dict | None,
    evaluates: bool = False,
    reward_bytes: int = 0,
    host_bytes: int | None = None,
    processes_on_host: int | None = None,
):
    """`settle_memory` of `model`'s shape as if it ran on `device` (named only: the budget is
    run.gpu_memory_gb, the host's memory this machine's unless given)."""
    gb = config.run.gpu_memory_gb
    facts = RunFacts(
        device_type=device.type,
        shape=ModelShape.of(model),
        sampler=backend_named(config.rollout.backend, model).sampler,
        world_size=world_size,
        seq_len=seq_len,
        budget_bytes=None if gb is None else int(gb * GIB),
        host_bytes=devices.host_memory_bytes() if host_bytes is None else host_bytes,
        processes_on_host=processes_on_host or world_size,
        evaluates=evaluates,
        reward_bytes=reward_bytes,
        saved_memory=saved,
    )
    return settle_memory(config, facts)


def test_state_is_weights_gradients_two_moments_and_the_reference():
    # 1000 params x 4 B: weights + gradients + 2 moments = 16,000; the reference 4,000 more
    assert state_bytes(SMALL, reference=False, critic=False) == 16_000
    assert state_bytes(SMALL, reference=True, critic=False) == 20_000
    # the critic: a float32 trunk (params minus the untied 10 x 4 head) with its own three
    assert state_bytes(SMALL, reference=False, critic=True) == 16_000 + 16 * 960
    lora = dataclasses.replace(SMALL, trainable=10)
    assert state_bytes(lora, reference=False, critic=False) == 4000 + 3 * 40
    # the 0.5B model in bfloat16 with its reference: 5 copies of 0.988 GB
    assert state_bytes(QWEN_05B, reference=True, critic=False) == 494_032_768 * 2 * 5


def test_activations_per_token_by_hand():
    # one layer keeps 9 x 4 + 2 x 2 + 4 x 8 = 72 elements of 4 bytes
    assert activation_bytes_per_token(SMALL, checkpointing=False) == 2 * 288
    # checkpointing: each layer's 4-wide input, plus two layers' worth for the one recomputed
    assert activation_bytes_per_token(SMALL, checkpointing=True) == 2 * 16 + 2 * 288


def test_logits_chunk_keeps_a_chunk_under_256_mib():
    assert logits_chunk(151_936) == 256  # 256 MiB / (151,936 x 4 B) = 441 -> 256
    assert logits_chunk(32_000) == 1024
    assert logits_chunk(10_000_000) == 64
    # bfloat16: a 16k-row float32 block of the head and its gradient, not the whole head
    assert logits_bytes(QWEN_05B, 256, True) == 2 * 256 * 151_936 * 4 + 2 * 16384 * 896 * 4
    # float32: no copy, but the whole head's gradient when it trains
    assert logits_bytes(SMALL, 7, True) == 2 * 7 * 10 * 4 + 10 * 4 * 4
    assert logits_bytes(SMALL, 7, False) == 2 * 7 * 10 * 4


def test_half_billion_model_plan_is_lean_and_under_trls_peak():
    """The issue's job: 8 x 8 rows of 68 + 256 tokens on an 80 GB card. Storing activations of
    a 3,888-token microbatch would take 4.9 GiB, more than a quarter of the 4.6 GiB state, so
    activations are recomputed and the predicted peak stays under TRL's measured 6.6 GB."""
    plan = plan_memory(
        QWEN_05B, seq_len=324, rows_per_step=64, sample_rows=64, budget_bytes=80 * GIB,
        reference=True,
    )  # fmt: skip
    # 12 rows of the widest length; the step's 64 rows, shorter ones sharing a microbatch
    assert (plan.microbatch_rows, plan.microbatch_tokens) == (64, 12 * 324)
    assert plan.gradient_checkpointing and plan.logprob_chunk_size == 256 and plan.fits
    state = 494_032_768 * 2 * 5
    activations = 12 * 324 * activation_bytes_per_token(QWEN_05B, True)
    assert plan.train_peak_bytes == state + logits_bytes(QWEN_05B, 256, True) + activations
    assert plan.peak_bytes < 6.6e9
    assert "64 rows / 3,888 tokens per microbatch, gradient checkpointing on" in plan.describe()


def test_long_completions_get_a_budget_of_fewer_rows_and_fit_16_gib():
    plan = plan_memory(
        QWEN_05B, seq_len=68 + 1024, rows_per_step=64, sample_rows=64, budget_bytes=16 * GIB,
        reference=True,
    )  # fmt: skip
    assert plan.microbatch_tokens == 3 * 1092 and plan.microbatch_rows == 64
    assert plan.gradient_checkpointing and plan.fits
    assert plan.peak_bytes < 0.9 * 16 * GIB


def test_a_small_model_keeps_its_activations_and_a_tight_budget_halves_the_rows():
    plan = plan_memory(
        SMALL, seq_len=100, rows_per_step=64, sample_rows=64, budget_bytes=GIB, reference=True
    )
    assert not plan.gradient_checkpointing  # 40 rows x 100 tokens x 576 B = 2.3 MB
    assert (plan.microbatch_rows, plan.microbatch_tokens) == (64, 40 * 100)
    # 8 layers: a budget that holds 15 rows' stored activations (2,304 B a token) but not
    # 40's; recomputing (704 B a token) fits all 40, and comes before smaller microbatches
    deep = dataclasses.replace(SMALL, layers=8)
    tight = 20_000 + logits_bytes(deep, 1024, True) + 15 * 100 * 2304
    plan = plan_memory(
        deep, seq_len=100, rows_per_step=64, sample_rows=1, budget_bytes=int(tight / 0.9) + 1,
        reference=True,
    )  # fmt: skip
    assert plan.gradient_checkpointing and plan.microbatch_tokens == 40 * 100 and plan.fits
    # a 2-layer model gains nothing from recomputing: its rows are halved instead
    tight = 20_000 + logits_bytes(SMALL, 1024, True) + 15 * 100 * 576
    plan = plan_memory(
        SMALL, seq_len=100, rows_per_step=64, sample_rows=1, budget_bytes=int(tight / 0.9) + 1,
        reference=True,
    )  # fmt: skip
    assert not plan.gradient_checkpointing and plan.microbatch_tokens == 10 * 100 and plan.fits
    # nothing fits: one row, checkpointing on, and the plan says it does not fit
    plan = plan_memory(
        QWEN_05B, seq_len=324, rows_per_step=64, sample_rows=64, budget_bytes=4 * GIB,
        reference=True,
    )  # fmt: skip
    assert plan.microbatch_tokens == 324 and plan.gradient_checkpointing and not plan.fits


def test_the_users_settings_are_kept():
    plan = plan_memory(
        QWEN_05B, seq_len=324, rows_per_step=64, sample_rows=64, budget_bytes=80 * GIB,
        reference=True, microbatch_rows=64, gradient_checkpointing=False, logprob_chunk_size=512,
    )  # fmt: skip
    assert (plan.microbatch_rows, plan.gradient_checkpointing) == (64, False)
    assert plan.logprob_chunk_size == 512
    # the measured 31.4 GB for these settings: predicted within 20%
    assert 0.8 * 31.4e9 < plan.peak_bytes < 1.2 * 31.4e9


def test_model_shape_of_a_hugging_face_model():
    model = tiny_qwen2(vocab_size=40)
    shape = ModelShape.of(model)
    assert shape == ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        trainable=sum(p.numel() for p in model.parameters()),
        layers=2, hidden=32, intermediate=64, kv_dim=2 * 8, vocab=40, weight_bytes=4, tied=True,
    )  # fmt: skip
    model.model.layers.requires_grad_(False)
    frozen = sum(p.numel() for p in model.model.layers.parameters())
    assert ModelShape.of(model).trainable == shape.params - frozen


@pytest.mark.parametrize(
    "major,auto", [(9, "bfloat16"), (8, "bfloat16"), (7, "float32")], ids=["H100", "A100", "T4"]
)
def test_dtype_auto_is_bfloat16_on_a_gpu_that_computes_in_it_else_float32(monkeypatch, major, auto):
    """Through torch's own check, with a GPU's compute capability faked: before Ampere (major 8)
    torch can make bfloat16 tensors (emulation, which it counts as support), but `auto` keeps
    float32."""
    assert resolve_dtype("auto", torch.device("cpu")) == "float32"
    assert resolve_dtype("bfloat16", torch.device("cpu")) == "bfloat16"
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # some torch releases check it too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(major=major)
    )
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    assert torch.cuda.is_bf16_supported()  # emulated or not
    assert resolve_dtype("auto", torch.device("cuda")) == auto
    assert resolve_dtype("float32", torch.device("cuda")) == "float32"
    assert resolve_dtype("bfloat16", torch.device("cuda")) == "bfloat16"


def test_settle_memory_on_cpu_keeps_the_cpu_defaults():
    config, plan = settled_memory(
        load_config(), tiny_qwen2(40), torch.device("cpu"), 1, seq_len=100, saved=None
    )
    assert plan is None
    assert config.model.gradient_checkpointing is False
    assert (config.model.logprob_chunk_size, config.optim.microbatch_size) == (1024, 64)
    assert config.optim.microbatch_tokens is None


def test_settle_memory_on_cuda_applies_the_plan_and_keeps_what_the_user_set():
    model = tiny_qwen2(40)
    cuda = torch.device("cuda")  # named only: with run.gpu_memory_gb no CUDA call is made
    config, plan = settled_memory(
        load_config(None, ["run.gpu_memory_gb=16", "model.gradient_checkpointing=true"]),
        model, cuda, 1, seq_len=100, saved=None,
    )  # fmt: skip
    assert plan is not None and plan.budget_bytes == 16 * GIB
    assert config.model.gradient_checkpointing is True  # the user's
    assert config.optim.microbatch_size == plan.microbatch_rows == 128  # the step's 16 x 8
    assert config.optim.microbatch_tokens == plan.microbatch_tokens == 4000  # 4096 // 100 rows
    assert config.model.logprob_chunk_size == 1024
    # an evaluation samples 256 rows at once, twice a step's 16 x 8: the plan makes room for it
    budget = load_config(None, ["run.gpu_memory_gb=16"])
    _, evaluating = settled_memory(budget, model, cuda, 1, 100, None, evaluates=True)
    _, training = settled_memory(budget, model, cuda, 1, 100, None, evaluates=False)
    shape = ModelShape.of(model)
    assert evaluating.sample_peak_bytes - training.sample_peak_bytes == (
        sampling_bytes(shape, 256, 100) - sampling_bytes(shape, 128, 100)
    )
    # under data parallelism each rank plans for its share of the rows
    config, plan = settled_memory(
        load_config(None, ["run.gpu_memory_gb=16", "data.prompts_per_step=2"]),
        model, cuda, 2, seq_len=100, saved=None,
    )  # fmt: skip
    assert config.optim.microbatch_size == 8  # 2 x 8 rows / 2 ranks


def test_a_resumed_run_takes_its_checkpoints_memory_settings():
    saved = {
        "gradient_checkpointing": True,
        "logprob_chunk_size": 128,
        "microbatch_size": 5,
        "microbatch_tokens": 500,
    }
    config, _ = settled_memory(
        load_config(None, ["optim.microbatch_size=7"]), tiny_qwen2(40), torch.device("cpu"), 1,
        seq_len=100, saved=saved,
    )  # fmt: skip
    assert config.optim.microbatch_size == 7  # set by the user: kept
    assert config.model.gradient_checkpointing is True
    assert (config.model.logprob_chunk_size, config.optim.microbatch_tokens) == (128, 500)


def test_a_cpu_runs_config_yaml_records_what_auto_and_null_became(
    tiny_model_dir, data_file, tmp_path
):
    import yaml

    from oncurve.loop.trainer import setup

    config = load_config(
        None,
        [f"model.path={tiny_model_dir}", f"data.path={data_file}", "run.device=cpu",
         f"run.dir={tmp_path / 'run'}", "optim.microbatch_tokens=0",
         "reward.functions=[helpers.rewards_for_tests:count_digits]", "rollout.max_new_tokens=16"],
    )  # fmt: skip
    s = setup(config)
    s.rewards.close()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["dtype"] == "float32"
    assert saved["model"]["gradient_checkpointing"] is False
    assert saved["model"]["logprob_chunk_size"] == 1024
    assert (saved["optim"]["microbatch_size"], saved["optim"]["microbatch_tokens"]) == (64, 0)
    assert s.config.model.dtype == "float32" and s.policy.forward.microbatch_tokens == 0


def test_a_kv_cache_held_between_rollouts_counts_in_the_update():
    """The cuda_graph sampler keeps its cache through the update: the plan adds it to the
    training peak and fits fewer rows in the same budget."""
    common = dict(seq_len=324, rows_per_step=64, sample_rows=64, reference=True)
    free = plan_memory(QWEN_05B, budget_bytes=6 * GIB, **common)
    held = plan_memory(QWEN_05B, budget_bytes=6 * GIB, held_cache_rows=64, **common)
    cache = kv_cache_bytes(QWEN_05B, 64, 324)
    assert cache == 64 * 324 * QWEN_05B.layers * 2 * QWEN_05B.kv_dim * QWEN_05B.weight_bytes
    assert held.state_bytes == free.state_bytes
    pinned = plan_memory(
        QWEN_05B, budget_bytes=80 * GIB, held_cache_rows=64, microbatch_rows=4, **common
    )
    unpinned = plan_memory(QWEN_05B, budget_bytes=80 * GIB, microbatch_rows=4, **common)
    assert pinned.train_peak_bytes - unpinned.train_peak_bytes == cache
    assert held.microbatch_tokens <= free.microbatch_tokens


def test_the_sampler_keeps_its_cache_between_steps_only_while_it_is_small():
    """`rollout.keep_cache` null: the cuda_graph sampler's training cache is kept (and counted
    in the update's peak) while it is at most 64 MiB, else freed after each step's sampling
    (and not counted); the user's setting overrides, and config.yaml records the choice."""
    per_row = kv_cache_bytes(QWEN_05B, 1, 324)
    assert KEPT_CACHE_BYTES == 64 * 2**20 and 16 * per_row <= KEPT_CACHE_BYTES < 17 * per_row
    assert keeps_sampler_cache(QWEN_05B, 16, 324)
    assert not keeps_sampler_cache(QWEN_05B, 17, 324)
    assert not keeps_sampler_cache(QWEN_05B, 64, 324)  # the 0.5B step against TRL: 243 MiB

    model, cuda = tiny_qwen2(40), torch.device("cuda")
    shape = ModelShape.of(model)
    rows = 16 * 8  # the default prompts_per_step x group_size
    small = 100
    large = KEPT_CACHE_BYTES // kv_cache_bytes(shape, rows, 1) + 1
    assert keeps_sampler_cache(shape, rows, small) and not keeps_sampler_cache(shape, rows, large)
    peaks = {}
    for keep, seq_len, expected in (
        ("null", small, True),
        ("null", large, False),
        ("true", large, True),
        ("false", small, False),
    ):
        overrides = ["run.gpu_memory_gb=16", "rollout.backend=cuda_graph"]
        config = load_config(None, [*overrides, f"rollout.keep_cache={keep}"])
        settled, plan = settled_memory(config, model, cuda, 1, seq_len, None)
        assert settled.rollout.keep_cache is expected
        peaks[keep, seq_len] = plan.train_peak_bytes
    assert peaks["true", large] - peaks["null", large] == kv_cache_bytes(shape, rows, large)
    assert peaks["null", small] - peaks["false", small] == kv_cache_bytes(shape, rows, small)
    # another sampler holds nothing between steps: nothing to keep counts
    config = load_config(None, ["run.gpu_memory_gb=16", "rollout.backend=hf"])
    _, plan = settled_memory(config, model, cuda, 1, small, None)
    assert plan.train_peak_bytes == peaks["false", small]


def test_an_evaluations_workspace_counts_only_while_it_samples():
    """An evaluation's rows take a workspace beside the held training one, freed after it
    (`GraphSampler.scratch`): it adds to the sampling peak, not to the update's;
    fewer rows than the held workspace's sample in that one. Sampling holds the state but the
    gradients, which exist during the update only."""
    common = dict(seq_len=324, rows_per_step=64, sample_rows=64, reference=True)
    held = dict(budget_bytes=80 * GIB, held_cache_rows=64, microbatch_rows=4, **common)
    alone = plan_memory(QWEN_05B, **held)
    evaluating = plan_memory(QWEN_05B, eval_rows=256, **held)
    assert evaluating.train_peak_bytes == alone.train_peak_bytes
    gradients = 494_032_768 * 2
    assert evaluating.sample_peak_bytes == alone.state_bytes - gradients + kv_cache_bytes(
        QWEN_05B, 64, 324
    ) + sampling_bytes(QWEN_05B, 256, 324)
    assert plan_memory(QWEN_05B, eval_rows=32, **held).sample_peak_bytes == (
        alone.sample_peak_bytes
    )
    # without a held cache (another sampler) an evaluation's call is all there is
    plain = plan_memory(QWEN_05B, eval_rows=256, budget_bytes=80 * GIB, **common)
    assert plain.sample_peak_bytes == (
        plain.state_bytes - gradients + sampling_bytes(QWEN_05B, 256, 324)
    )


def test_a_reward_models_weights_count_in_the_state():
    common = dict(seq_len=324, rows_per_step=64, sample_rows=64, reference=True)
    without = plan_memory(QWEN_05B, budget_bytes=80 * GIB, microbatch_rows=4, **common)
    extra = 2 * GIB
    with_rm = plan_memory(
        QWEN_05B, budget_bytes=80 * GIB, microbatch_rows=4, extra_state_bytes=extra, **common
    )
    assert with_rm.state_bytes - without.state_bytes == extra
    assert with_rm.train_peak_bytes - without.train_peak_bytes == extra
    assert with_rm.sample_peak_bytes - without.sample_peak_bytes == extra
    # in a tight budget the same run fits fewer rows per microbatch
    tight = plan_memory(QWEN_05B, budget_bytes=6 * GIB, **common)
    tighter = plan_memory(QWEN_05B, budget_bytes=6 * GIB, extra_state_bytes=extra, **common)
    assert tighter.microbatch_tokens < tight.microbatch_tokens
    # the trainer passes the reward runner's bytes through settle_memory
    config = load_config(None, ["run.gpu_memory_gb=16"])
    model, cuda = tiny_qwen2(40), torch.device("cuda")
    _, plain = settled_memory(config, model, cuda, 1, 100, None)
    _, rewarded = settled_memory(config, model, cuda, 1, 100, None, reward_bytes=12345)
    assert rewarded.state_bytes - plain.state_bytes == 12345


def test_the_reference_pass_takes_as_many_tokens_as_an_update_keeps_for_its_backward():
    """A forward without gradients holds a decoder layer's activations a token, one layer at a
    time; an update keeps `activation_bytes_per_token` a token for its backward. The 0.5B
    shape with checkpointing keeps 154,112 B a token, a layer is 55,552 B: a 3,888-token
    microbatch's memory runs 10,786 reference tokens; without checkpointing, 24 layers' worth."""
    assert forward_only_tokens(QWEN_05B, 3888, True) == 3888 * 154_112 // 55_552 == 10_786
    assert forward_only_tokens(QWEN_05B, 3888, False) == 24 * 3888
    assert forward_only_tokens(QWEN_05B, 0, True) == 0  # no cap stays none


def test_the_reference_pass_has_a_token_cap_of_its_own_on_an_accelerator_only():
    """On the CPU the cap bounds the widest activation, which both passes make: one cap.
    Elsewhere (meta: an accelerator's path with no value read) the reference pass's own."""
    config = load_config(
        None, ["optim.microbatch_tokens=4000", "model.gradient_checkpointing=true"]
    )
    model = tiny_qwen2(40)
    assert token_caps(model, config) == {"microbatch_tokens": 4000, "reference_tokens": None}
    meta = model.to("meta")
    reference = forward_only_tokens(ModelShape.of(meta), 4000, checkpointing=True)
    assert token_caps(meta, config) == {"microbatch_tokens": 4000, "reference_tokens": reference}
    assert reference > 4000


def test_an_offloaded_reference_takes_the_room_the_gradients_leave_in_its_pass():
    """The 0.5B step against TRL (64 rows of 75 + 256 tokens). The gradients exist during the
    update only; the reference's 0.99 GB of weights, offloaded, are on the device for its pass
    only. So the update and sampling peaks drop by the weights, the reference pass (the state
    but the gradients, 2.8x a training microbatch's tokens a layer at a time) holds them where
    the gradients were, and the step's peak is the update's: 0.75 GiB under the kept
    reference's, 0.82x TRL's measured 5.72 GiB on an H100."""
    common = dict(seq_len=331, rows_per_step=64, sample_rows=64, budget_bytes=80 * GIB)
    kept = plan_memory(QWEN_05B, reference=True, **common)
    offloaded = plan_memory(QWEN_05B, reference=True, offload_reference=True, **common)
    weights = 494_032_768 * 2
    assert (kept.microbatch_tokens, offloaded.microbatch_tokens) == (12 * 331, 12 * 331)
    assert kept.state_bytes == offloaded.state_bytes == 5 * weights
    fixed = 5 * weights + logits_bytes(QWEN_05B, 256, True)
    activations = 12 * 331 * activation_bytes_per_token(QWEN_05B, True)
    assert kept.train_peak_bytes == fixed + activations
    assert offloaded.train_peak_bytes == fixed - weights + activations
    assert kept.sample_peak_bytes - offloaded.sample_peak_bytes == weights
    assert offloaded.sample_peak_bytes == 3 * weights + sampling_bytes(QWEN_05B, 64, 331)
    assert forward_only_bytes_per_token(QWEN_05B) == 55_552
    forward_tokens = forward_only_tokens(QWEN_05B, 12 * 331, True)
    reference_pass = fixed - weights + forward_tokens * 55_552
    assert kept.reference_peak_bytes == offloaded.reference_peak_bytes == reference_pass
    assert offloaded.peak_bytes == offloaded.train_peak_bytes >= reference_pass
    assert kept.peak_bytes - offloaded.peak_bytes == weights > 0.9 * GIB
    assert offloaded.peak_bytes < 0.82 * 5.72 * GIB < kept.peak_bytes
    assert "reference pass 4.7 with its weights offloaded between passes" in offloaded.describe()
    # no reference, nothing to offload and no reference pass
    alone = plan_memory(QWEN_05B, reference=False, offload_reference=True, **common)
    assert alone.reference_peak_bytes == 0 and not alone.offload_reference
    assert alone.train_peak_bytes == kept.train_peak_bytes - weights


def test_the_reference_is_offloaded_while_the_hosts_memory_holds_every_processs_copy():
    """Unset, `model.offload_reference` is on with CUDA when a frozen reference is held and
    the pinned copies of all local processes fit in half the host's memory; config.yaml
    records the choice."""
    weights = 494_032_768 * 2
    assert offloads_reference(QWEN_05B, 8, 16 * weights)
    assert not offloads_reference(QWEN_05B, 8, 16 * weights - 1)
    model, cuda = tiny_qwen2(40), torch.device("cuda")
    cases = {
        (): True,
        ("algo.beta=0",): False,  # no reference
        ("model.lora.r=4",): False,  # the reference is the base with the adapter off
        ("model.offload_reference=false",): False,
    }
    for overrides, expected in cases.items():
        config = load_config(None, ["run.gpu_memory_gb=16", "algo.beta=0.04", *overrides])
        settled, plan = settled_memory(config, model, cuda, 1, 100, None)
        assert settled.model.offload_reference is plan.offload_reference is expected, overrides
    tiny = ModelShape.of(model).params * 4  # float32 on the CPU
    for host, processes, expected in ((2 * tiny, 1, True), (2 * tiny - 1, 1, False)):
        config = load_config(None, ["run.gpu_memory_gb=16", "algo.beta=0.04"])
        settled, _ = settled_memory(
            config, model, cuda, 4, 100, None, host_bytes=host, processes_on_host=processes
        )
        assert settled.model.offload_reference is expected
    # on the CPU the weights are in host memory already
    config = load_config(None, ["algo.beta=0.04"])
    settled, _ = settled_memory(config, model, torch.device("cpu"), 1, 100, None)
    assert settled.model.offload_reference is False


def test_the_hosts_memory_is_a_containers_cgroup_limit_where_that_is_lower(tmp_path, monkeypatch):
    """`host_memory_bytes`: the physical memory, unless the first cgroup limit file there is
    (v2's, else v1's) holds a lower number of bytes; "max" means no limit."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(devices, "CGROUP_MEMORY_LIMITS", (str(v2), str(v1)))
    assert devices.host_memory_bytes() == physical  # neither file
    v1.write_text(f"{2**30}\n")
    assert devices.host_memory_bytes() == 2**30
    v2.write_text("max\n")  # v2's says no limit: v1's is not read
    assert devices.host_memory_bytes() == physical
    v2.write_text(f"{physical + 4096}\n")
    assert devices.host_memory_bytes() == physical


def test_the_reference_pass_never_peaks_above_the_update():
    """Whether its weights stay or are offloaded, the reference pass holds no gradients and
    at most a training microbatch's activation memory, so the update's peak bounds it: for
    the 0.5B shape and a float32 one, across lengths and budgets that halve the rows."""
    for shape in (QWEN_05B, dataclasses.replace(QWEN_05B, weight_bytes=4, layers=4)):
        for seq_len in (64, 331, 1092, 8192):
            for budget in (6 * GIB, 80 * GIB):
                for offload in (False, True):
                    plan = plan_memory(
                        shape, seq_len=seq_len, rows_per_step=64, sample_rows=64,
                        budget_bytes=budget, reference=True, offload_reference=offload,
                    )  # fmt: skip
                    assert 0 < plan.reference_peak_bytes <= plan.train_peak_bytes
                    assert plan.peak_bytes == max(plan.train_peak_bytes, plan.sample_peak_bytes)
