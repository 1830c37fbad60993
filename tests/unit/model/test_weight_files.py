"""Weight files that do not hold the model their config describes: a missing tensor, a tensor of
another shape, a truncated or garbage file. Each is a one-line UserError naming the directory,
never a model with freshly initialised weights or a traceback."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from oncurve.errors import UserError
from oncurve.model.sources import load_model, resolve_model_path

DROPPED = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture
def model_dir(tmp_path):
    target = tmp_path / "model"
    shutil.copytree(resolve_model_path("default"), target)
    return target


def _rewrite(model_dir, change):
    tensors = load_file(model_dir / "model.safetensors")
    change(tensors)
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})


def test_the_bundled_model_loads(model_dir):
    assert load_model(model_dir).config.num_hidden_layers >= 1


def test_a_missing_tensor_is_an_error_not_a_random_weight(model_dir):
    _rewrite(model_dir, lambda tensors: tensors.pop(DROPPED))
    with pytest.raises(UserError, match=rf"{model_dir}.*missing.*{DROPPED}") as err:
        load_model(model_dir)
    assert "\n" not in str(err.value)


def test_a_tensor_of_another_shape_is_one_line(model_dir):
    def reshape(tensors):
        tensors[DROPPED] = tensors[DROPPED][:, :-1].contiguous()

    _rewrite(model_dir, reshape)
    with pytest.raises(UserError, match=rf"cannot load a model from {model_dir}") as err:
        load_model(model_dir)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_weights_file_is_one_line(model_dir, damage):
    file = model_dir / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\0" * 1000)
    with pytest.raises(UserError, match=rf"cannot load a model from {model_dir}") as err:
        load_model(model_dir)
    assert "\n" not in str(err.value)
