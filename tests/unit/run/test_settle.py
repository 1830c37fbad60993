"""`oncurve.run.settle`: every `auto` and null setting resolved from the config and the facts, in one
pure step, for shapes and devices this machine does not have."""

from __future__ import annotations

import dataclasses

import pytest

from oncurve.config import build_config, load_config, to_dict
from oncurve.errors import UserError
from oncurve.rollout import TorchSampler
from oncurve.rollout.cuda_graph import GraphSampler
from oncurve.run.memory_plan import GIB, ModelShape
from oncurve.run.settle import (
    MEMORY_SETTINGS,
    RunFacts,
    memory_settings,
    same_local_path,
    settle,
    settle_loading,
    settle_paths,
)

# Qwen2.5-1.5B in bfloat16: no weights are loaded, only its sizes are read
QWEN_15B = ModelShape(
    params=1_543_714_304,
    trainable=1_543_714_304,
    layers=28,
    hidden=1536,
    intermediate=8960,
    kv_dim=256,
    vocab=151_936,
    weight_bytes=2,
    tied=True,
)
H100 = RunFacts(
    device_type="cuda",
    shape=QWEN_15B,
    sampler=GraphSampler,
    seq_len=4096 + 256,
    budget_bytes=78 * GIB,
    host_bytes=256 * GIB,
    evaluates=True,
)


def test_a_cuda_run_of_a_model_never_loaded_is_settled_whole_with_its_report() -> None:
    config = load_config(None, ["algo.beta=0.04", "data.prompts_per_step=16"])
    assert all(value is None for value in memory_settings(config).values())
    settled = settle(config, H100)
    c = settled.config
    assert all(value is not None for value in memory_settings(c).values())
    assert len(memory_settings(c)) == len(MEMORY_SETTINGS)
    assert c.algo.is_cap == 2.0  # the graph sampler's logprobs are not the forward's
    assert (c.rollout.cuda_graphs, c.rollout.compile, c.model.pack_rows) == (True, True, True)
    assert settled.plan is not None and settled.plan.budget_bytes == 78 * GIB
    assert c.optim.microbatch_size == settled.plan.microbatch_rows
    assert c.model.offload_reference is settled.plan.offload_reference is True
    assert settled.report == [settled.plan.describe()]


def test_the_same_config_on_the_cpu_takes_the_fixed_defaults_and_compiles_nothing() -> None:
    config = load_config(None, ["algo.beta=0.04"])
    float32 = dataclasses.replace(QWEN_15B, weight_bytes=4)
    cpu = dataclasses.replace(
        H100, device_type="cpu", sampler=TorchSampler, budget_bytes=None, shape=float32
    )
    settled = settle(config, cpu)
    c = settled.config
    assert settled.plan is None and settled.report == []
    assert c.algo.is_cap == 0.0  # the sampler's float32 logprobs are the forward's
    in_bfloat16 = dataclasses.replace(cpu, shape=QWEN_15B)
    assert settle(config, in_bfloat16).config.algo.is_cap == 2.0
    # no correction, nothing to cap: left null, so the settled config loads again as given
    uncorrected = load_config(None, ["algo.is_correction=none"])
    settled_none = settle(uncorrected, in_bfloat16).config
    assert settled_none.algo.is_cap is None
    assert build_config(to_dict(settled_none)).algo.is_cap is None
    assert (c.rollout.cuda_graphs, c.rollout.compile, c.model.pack_rows) == (False,) * 3
    assert (c.model.gradient_checkpointing, c.optim.microbatch_size) == (False, 64)
    assert c.model.offload_reference is False


def test_what_the_user_set_is_kept_and_what_the_facts_rule_out_is_refused() -> None:
    chosen = ["algo.is_cap=0", "rollout.cuda_graphs=false", "optim.microbatch_size=3"]
    c = settle(load_config(None, chosen), H100).config
    assert (c.algo.is_cap, c.rollout.cuda_graphs, c.optim.microbatch_size) == (0.0, False, 3)
    assert c.rollout.compile is True  # still null in the config: settled
    unpackable = dataclasses.replace(H100, unpackable="the model soft-caps its attention logits")
    with pytest.raises(UserError, match=r"^model\.pack_rows: the model soft-caps"):
        settle(load_config(None, ["model.pack_rows=true"]), unpackable)
    assert settle(load_config(), unpackable).config.model.pack_rows is False
    failing = dataclasses.replace(H100, packing_failure="its hidden states differ by 0.5")
    settled = settle(load_config(), failing)
    assert settled.config.model.pack_rows is False
    assert settled.report[-1] == (
        "warning: rows stay padded in the update (model.pack_rows): the packed forward failed "
        "its check: its hidden states differ by 0.5"
    )


def test_graphs_or_compilation_asked_of_a_sampler_that_cannot_are_off_with_a_note() -> None:
    """The torch sampler compiles and captures nothing: what was asked of it is turned off,
    so that config.yaml and the `rollout/compiled` metric say what runs, and a start-up note
    says why; the graph sampler tries both on any device (a failed capture warns itself)."""
    asked = load_config(None, ["rollout.cuda_graphs=true", "rollout.compile=true"])
    on_cpu = dataclasses.replace(H100, device_type="cpu", budget_bytes=None)
    settled = settle(asked, dataclasses.replace(on_cpu, sampler=TorchSampler))
    assert (settled.config.rollout.cuda_graphs, settled.config.rollout.compile) == (False, False)
    assert settled.report[0] == (
        "note: rollout.cuda_graphs=true and rollout.compile=true have no effect here "
        "(rollout.backend=auto on cpu): off"
    )
    settled = settle(load_config(None, ["rollout.compile=true"]), on_cpu)
    assert (settled.config.rollout.cuda_graphs, settled.config.rollout.compile) == (False, True)
    assert settled.report == []
    assert settle(asked, on_cpu).config.rollout.cuda_graphs is True


def test_a_gpu_memory_cap_off_cuda_is_a_note() -> None:
    capped = load_config(None, ["run.gpu_memory_gb=8"])
    on_cpu = dataclasses.replace(H100, device_type="cpu", budget_bytes=None)
    assert settle(capped, on_cpu).report == [
        "note: run.gpu_memory_gb has no effect here (run.device=cpu): it caps a CUDA device's "
        "memory"
    ]
    assert settle(load_config(), on_cpu).report == []
    assert not any("gpu_memory_gb" in line for line in settle(capped, H100).report)


def test_a_resumed_run_settles_to_its_checkpoints_memory_settings() -> None:
    saved = {"microbatch_size": 5, "microbatch_tokens": 500, "gradient_checkpointing": True}
    c = settle(load_config(), dataclasses.replace(H100, saved_memory=saved)).config
    assert (c.optim.microbatch_size, c.optim.microbatch_tokens) == (5, 500)
    assert c.model.gradient_checkpointing is True


def test_loading_settles_auto_dtype_to_the_devices_and_records_a_hub_commit() -> None:
    """`auto` becomes what it means on the device; a dtype the user named stays; a Hub
    model's resolved commit replaces the requested revision, and a local model keeps its own."""
    auto = load_config(None, [])
    assert auto.model.dtype == "auto"
    settled = settle_loading(auto, "bfloat16", "0123abcd")
    assert settled.model.dtype == "bfloat16" and settled.model.revision == "0123abcd"
    named = load_config(None, ["model.dtype=float32", "model.revision=v1"])
    kept = settle_loading(named, "bfloat16", None)
    assert kept.model.dtype == "float32" and kept.model.revision == "v1"
    assert settle_loading(kept, "bfloat16", None) == kept


def test_local_paths_are_made_whole_and_compare_by_what_they_name(tmp_path, monkeypatch):
    """A relative model or data path is recorded absolute (`default` and Hub ids as given); a
    run that recorded one relative names the same path as its absolute form, from the same
    directory."""
    (tmp_path / "model").mkdir()
    (tmp_path / "rows.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    config = settle_paths(load_config(None, ["model.path=model", "data.path=rows.jsonl"]))
    assert (config.model.path, config.data.path) == (
        str(tmp_path / "model"),
        str(tmp_path / "rows.jsonl"),
    )
    hub = settle_paths(load_config(None, ["model.path=org/name", "data.path=org/rows"]))
    assert (hub.model.path, hub.data.path) == ("org/name", "org/rows")
    assert settle_paths(load_config(None, [])).model.path == "default"
    assert same_local_path("model", str(tmp_path / "model"))
    assert same_local_path("./model/", str(tmp_path / "model"))
    assert not same_local_path("rows.jsonl", str(tmp_path / "model"))
    assert not same_local_path("org/name", "org/name2") and not same_local_path(None, "model")
