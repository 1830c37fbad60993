"""A checkpoint loads as the model its run held at that step (LoRA merged), with the config it
was saved with; one that is not complete, or holds no config, is a one-line error."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from helpers.configs import make_config
from helpers.models import with_own_code

from oncurve.errors import UserError
from oncurve.loop.trainer import train
from oncurve.run.checkpoint import COMPLETE, STATE_FILE
from oncurve.run.checkpoint_model import checkpoint_config, find_checkpoint, load_checkpoint_model


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def two_step_run(tiny_model_dir, data_file, tmp_path_factory):
    """A run of 2 steps with a checkpoint at each, sampling at temperature 0.7 and top_k 5."""
    run_dir = tmp_path_factory.mktemp("checkpointed") / "run"
    extra = ("run.steps=2", "run.save_every=1", "rollout.temperature=0.7", "rollout.top_k=5")
    train(make_config(tiny_model_dir, data_file, run_dir, *extra), quiet=True)
    return run_dir


def test_the_last_checkpoint_is_the_final_model_and_an_earlier_one_is_not(two_step_run):
    final = transformers.AutoModelForCausalLM.from_pretrained(two_step_run / "final")
    loaded = {}
    for step in (1, 2):
        path = two_step_run / "checkpoints" / f"step-{step:06d}"
        assert find_checkpoint(path) == path
        model, tokenizer = load_checkpoint_model(path, checkpoint_config(path), "float32", "cpu")
        assert not model.training and tokenizer("2+2=").input_ids
        loaded[step] = _weights(model)
    expected = _weights(final)
    assert loaded[2].keys() == expected.keys()
    assert all(torch.equal(loaded[2][name], expected[name]) for name in expected)
    assert any(not torch.equal(loaded[1][name], expected[name]) for name in expected)
    assert find_checkpoint(two_step_run / "final") is None
    assert find_checkpoint(two_step_run / "checkpoints" / "latest") == path


def test_a_damaged_optimizer_state_does_not_stop_the_policy_loading(two_step_run, tmp_path):
    """Sampling and evaluation read the weights and the config, never the optimizer's state."""
    path = tmp_path / "step-000002"
    shutil.copytree(two_step_run / "checkpoints" / "step-000002", path)
    (path / "optimizer.pt").write_bytes(b"PK\x03\x04 truncated")
    model, _ = load_checkpoint_model(path, checkpoint_config(path), "float32", "cpu")
    assert not model.training
    (path / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(UserError, match=r"model.safetensors is damaged \(its checksum differs\)"):
        load_checkpoint_model(path, checkpoint_config(path), "float32", "cpu")


def test_the_config_is_the_one_the_step_was_saved_with(two_step_run):
    config = checkpoint_config(two_step_run / "checkpoints" / "step-000001")
    assert (config.rollout.temperature, config.rollout.top_k) == (0.7, 5)
    assert (config.rollout.max_new_tokens, config.run.steps) == (8, 2)


def test_an_incomplete_checkpoint_or_one_without_a_config_is_a_one_line_error(
    two_step_run, tmp_path
):
    path = tmp_path / "step-000002"
    shutil.copytree(two_step_run / "checkpoints" / "step-000002", path)
    state = json.loads((path / STATE_FILE).read_text())
    del state["config"]
    (path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(UserError, match=r"state.json is damaged \(its checksum differs\)"):
        checkpoint_config(path)
    (path / "checksums.json").unlink()  # as a checkpoint saved before checksums were kept
    with pytest.raises(UserError, match=r"holds no run config; name the run with --run$"):
        checkpoint_config(path)
    (path / COMPLETE).unlink()
    with pytest.raises(UserError, match=r"is not complete \(no COMPLETE marker\); not loaded$"):
        checkpoint_config(path)


def test_a_lora_checkpoint_loads_merged_as_the_final_model(tiny_model_dir, data_file, tmp_path):
    """A LoRA run's checkpoint holds the adapter alone; loaded, it is the base model with the
    adapter merged, as final/ is."""
    pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    run_dir = tmp_path / "run"
    lora = ("model.lora.r=4", "model.lora.alpha=8", "optim.lr=5e-2", "run.steps=1")
    train(make_config(tiny_model_dir, data_file, run_dir, *lora), quiet=True)
    path = run_dir / "checkpoints" / "step-000001"
    model, _ = load_checkpoint_model(path, checkpoint_config(path), "float32", "cpu")
    final = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "final")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    got, expected, before = _weights(model), _weights(final), _weights(base)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=0)
    assert any(not torch.equal(got[name], before[name]) for name in before)


def test_the_base_models_code_runs_only_when_trusted_here_not_as_the_run_trusted_it(
    two_step_run, tiny_model_dir, tmp_path
):
    """A run's model.trust_remote_code was trust for its training: its checkpoint loads on
    transformers' own class of a base model that ships code, and that code does not run."""
    base, marker = tmp_path / "base", tmp_path / "ran"
    with_own_code(tiny_model_dir, base, marker)
    path = two_step_run / "checkpoints" / "step-000002"
    config = checkpoint_config(path)
    config.model.path, config.model.trust_remote_code = str(base), True
    model, _ = load_checkpoint_model(path, config, "float32", "cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not marker.exists()
