"""What `load_model` refuses to run or unpickle: a model directory with only PyTorch `.bin`
weights (pickles) and custom model code without `model.trust_remote_code`. Each refusal is one
line naming the directory and the way out; nothing of the user's files executes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from oncurve.cli import main
from oncurve.errors import UserError
from oncurve.model.sources import load_model, load_tokenizer


class _Runs:
    """Unpickled, it creates the file `marker`: the proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def pickled_model(tiny_model_dir, tmp_path) -> tuple[Path, Path]:
    """(a copy of the tiny model whose weights are a pytorch_model.bin that runs code when
    unpickled, the file that code creates)."""
    target = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, target)
    weights = load_file(target / "model.safetensors")
    (target / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({**weights, "x": _Runs(marker)}, target / "pytorch_model.bin")
    return target, marker


def test_pytorch_bin_weights_are_refused_unread(pickled_model, monkeypatch):
    directory, marker = pickled_model

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load must not be called on a user's file")

    monkeypatch.setattr(torch, "load", no_unpickling)
    with pytest.raises(UserError) as err:
        load_model(directory)
    message = str(err.value)
    assert "\n" not in message
    assert str(directory) in message and "pytorch_model.bin" in message
    assert "save_pretrained(NEW_DIR, safe_serialization=True)" in message
    assert not marker.exists()


def test_a_crafted_pickle_is_one_line_from_the_cli_and_never_runs(pickled_model, capsys):
    directory, marker = pickled_model
    argv = ["sample", "--model", str(directory), "--prompt", "1+1=", "--device", "cpu"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(directory) in error and "safetensors" in error
    assert not marker.exists()


def test_a_directory_without_weights_says_safetensors(tiny_model_dir, tmp_path):
    target = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, target)
    (target / "model.safetensors").unlink()
    with pytest.raises(UserError, match=rf"^cannot load a model from {target}: .*safetensors"):
        load_model(target)
    # and says how to make them from weights one trusts
    with pytest.raises(UserError, match=r"save_pretrained\(NEW_DIR, safe_serialization=True\)"):
        load_model(target)


def _with_custom_code(source: Path, target: Path, model_type: str) -> Path:
    """A copy of model `source` whose config.json maps its classes to custom.py, code that
    creates the file `ran` beside `target` when it runs."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "custom.MyConfig",
        "AutoModelForCausalLM": "custom.MyModel",
    }
    (target / "config.json").write_text(json.dumps(config))
    (target / "custom.py").write_text(f"open({str(target.parent / 'ran')!r}, 'w').close()\n")
    return target


def test_custom_model_code_is_refused_naming_the_setting(tiny_model_dir, tmp_path):
    directory = _with_custom_code(tiny_model_dir, tmp_path / "custom", "mycustom")
    with pytest.raises(UserError) as err:
        load_model(directory)
    message = str(err.value)
    assert "\n" not in message and str(directory) in message
    assert "model.trust_remote_code=true" in message
    assert not (tmp_path / "ran").exists()


def test_custom_code_of_a_known_model_type_is_said_to_be_left_out(tiny_model_dir, tmp_path, capsys):
    directory = _with_custom_code(tiny_model_dir, tmp_path / "known", "qwen2")
    load_tokenizer(directory)
    model = load_model(directory)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not (tmp_path / "ran").exists()
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1
    assert str(directory) in notes[0] and "model.trust_remote_code=true" in notes[0]
    assert "Qwen2ForCausalLM" in notes[0]
    load_model(tiny_model_dir)  # no auto_map: no note
    assert "note:" not in capsys.readouterr().err


def test_custom_tokenizer_code_of_a_known_class_is_said_to_be_left_out(
    tiny_model_dir, tmp_path, capsys
):
    directory = tmp_path / "tokenizer_code"
    shutil.copytree(tiny_model_dir, directory)
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": [None, "custom.MyTokenizer"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    (directory / "custom.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    capsys.readouterr()
    tokenizer = load_tokenizer(directory)
    assert not (tmp_path / "ran").exists()
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: {directory} ships its own tokenizer code (auto_map in tokenizer_config.json), "
        f"which does not run: this is transformers' own {type(tokenizer).__name__} (to run that "
        "code, for code you trust: model.trust_remote_code=true (--trust-remote-code for oncurve "
        "sample/eval))"
    ]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda config: [config], "not a JSON object"),
        (lambda config: {**config, "vocab_size": "many"}, "vocab_size"),
        (lambda config: {**config, "dtype": "float99"}, "float99"),
    ],
)
def test_a_config_json_transformers_cannot_build_is_one_line_naming_it(
    tiny_model_dir, tmp_path, capsys, change, named
):
    target = tmp_path / "bad-config"
    shutil.copytree(tiny_model_dir, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(change(config)))
    for load in (load_tokenizer, load_model):
        with pytest.raises(UserError) as err:
            load(target)
        assert str(err.value).startswith(f"{target / 'config.json'}: ")
        assert named in str(err.value) and "\n" not in str(err.value)
    argv = ["sample", "--model", str(target), "--prompt", "1+1=", "--device", "cpu"]
    assert main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_tokenizer_with_ids_past_the_embedding_is_one_line(tmp_path, capsys):
    """A prompt token with no embedding row would fail deep in the first forward: the
    tokenizer's 102 ids against an embedding of 40 rows is refused where the model loads."""
    from helpers.models import tiny_qwen2

    from oncurve.model.char_tokenizer import char_tokenizer

    target = tmp_path / "small-embedding"
    tiny_qwen2(40).save_pretrained(target)
    char_tokenizer().save_pretrained(target)
    expected = (
        f"tokenizer in {target} has 102 tokens, more than the 40 rows of the model's embedding "
        "(vocab_size in config.json): a token past id 39 has none"
    )
    with pytest.raises(UserError) as err:
        load_tokenizer(target)
    assert str(err.value) == expected
    argv = ["sample", "--model", str(target), "--prompt", "1+1=", "--device", "cpu"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"oncurve: error: {expected}\n"


def test_the_pad_token_transformers_adds_past_the_embedding_is_a_missing_one(
    tiny_model_dir, tmp_path, capsys
):
    """Without a pad token in the tokenizer files transformers adds Qwen2's default one at the
    id past the embedding's last row: not a token a prompt holds, but a missing pad token,
    which EOS stands in for."""
    target = tmp_path / "no-pad"
    shutil.copytree(tiny_model_dir, target)
    settings = json.loads((target / "tokenizer_config.json").read_text())
    del settings["pad_token"]
    (target / "tokenizer_config.json").write_text(json.dumps(settings))
    tokenizer = load_tokenizer(target)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (2, 2)
    assert "has no pad token; using EOS for padding" in capsys.readouterr().err


def test_a_lora_adapter_directory_as_the_model_says_what_it_is(tmp_path):
    """A run's final/adapter (peft's files, no config.json) given as the model: the error says it
    is an adapter and where its merged model is."""
    from oncurve.model.sources import resolve_model_path

    adapter = tmp_path / "final" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as err:
        resolve_model_path(str(adapter))
    assert str(err.value) == (
        f"model.path {adapter} has no config.json (not a Hugging Face model dir); it is a LoRA "
        "adapter (adapter_config.json): give a model with the adapter merged in (a LoRA run's "
        "final/ is one)"
    )


@pytest.mark.parametrize(
    ("edit", "unused"),
    [
        # a config.json of fewer layers than the weights: the model would be cut short
        (lambda config: config.update(num_hidden_layers=1, layer_types=["full_attention"]), 12),
        # a head of another task (a value head, a classifier) is no part of the policy
        (lambda config: None, 0),
    ],
)
def test_weights_a_policy_has_no_place_for_are_refused_but_another_tasks_head(
    tiny_model_dir, tmp_path, edit, unused
):
    """Transformers drops what the weight files hold beyond the model its config.json builds,
    and only logs it: a weight of the network itself left out is another model than the one
    named, refused in one line; one outside it (TRL's `v_head`) is a head the policy lacks."""
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    weights = load_file(target / "model.safetensors")
    weights["v_head.summary.weight"] = torch.zeros(1, config["hidden_size"])
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    if not unused:
        assert load_model(target).config.num_hidden_layers == 2
        return
    with pytest.raises(UserError) as refused:
        load_model(target)
    assert str(refused.value).startswith(
        f"cannot load a model from {target}: its weight files hold {unused} tensors its "
        "config.json has no place for (model.layers.1."
    )
