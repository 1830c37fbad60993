"""Where `model.path` finds a model: a local directory, a Hugging Face Hub id (a snapshot in the
Hugging Face cache, downloaded through `snapshot_download`, which these tests replace or serve
from a cache made here: nothing touches the network) and a GGUF file, written here by the gguf
package from a tiny Llama; `oncurve models import`; the final directory of a run from a GGUF."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers
from huggingface_hub import errors as hub_errors

from oncurve.cli import main
from oncurve.config import load_config
from oncurve.errors import UserError
from oncurve.model import sources as model_sources
from oncurve.model.sources import (
    hub_commit,
    import_gguf,
    is_hub_id,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

gguf = pytest.importorskip("gguf")
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # pad, bos, eos
MERGES = ["h e", "Ġ t", "Ġt he"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# --- a tiny GGUF, written as llama.cpp's converter writes a Llama --------------------------------


def gguf_vocab() -> list[str]:
    """Byte-level BPE: the special tokens, the 256 byte symbols, then one token per merge."""
    alphabet = sorted(set(bytes_to_unicode().values()))
    return SPECIAL + alphabet + [m.replace(" ", "") for m in MERGES]


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(gguf_vocab()),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped: q and k are permuted with different head counts
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norm weights away from 1, so that swapping two of them shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def permute(weight, heads: int):
    """llama.cpp's order of a q or k projection's rows (rotary halves interleaved per head),
    which transformers' GGUF loader undoes."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model: transformers.LlamaForCausalLM, path: Path) -> Path:
    c = model.config
    tokens = gguf_vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])  # 3: control
    writer.add_token_merges(MERGES)
    writer.add_pad_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        layer = f"model.layers.{i}."
        q = weights[layer + "self_attn.q_proj.weight"]
        k = weights[layer + "self_attn.k_proj.weight"]
        named = {
            "attn_norm": weights[layer + "input_layernorm.weight"],
            "attn_q": permute(q, c.num_attention_heads),
            "attn_k": permute(k, c.num_key_value_heads),
            "attn_v": weights[layer + "self_attn.v_proj.weight"],
            "attn_output": weights[layer + "self_attn.o_proj.weight"],
            "ffn_norm": weights[layer + "post_attention_layernorm.weight"],
            "ffn_gate": weights[layer + "mlp.gate_proj.weight"],
            "ffn_up": weights[layer + "mlp.up_proj.weight"],
            "ffn_down": weights[layer + "mlp.down_proj.weight"],
        }
        for name, tensor in named.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def llama() -> transformers.LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def gguf_file(llama, tmp_path_factory) -> Path:
    return write_gguf(llama, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def check_gguf_tokenizer(tokenizer) -> None:
    """The GGUF's vocabulary, merges, special tokens and chat template."""
    ids = tokenizer("he the 1+2=", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["he", "Ġthe", "Ġ", "1", "+", "2", "="]
    assert tokenizer.decode(ids) == "he the 1+2="
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert tokenizer.decode(chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert list(chat).count(1) == 2 and list(chat).count(2) == 1  # special tokens stay whole


# --- GGUF --------------------------------------------------------------------------------------


def test_a_gguf_file_loads_with_the_original_weights_logits_and_its_tokenizer(llama, gguf_file):
    assert resolve_model_path(str(gguf_file)) == gguf_file
    model = load_model(gguf_file)
    original, loaded = llama.state_dict(), model.state_dict()
    assert set(loaded) == set(original)
    for name, tensor in original.items():  # q and k un-permuted, norms in their places
        assert torch.equal(loaded[name], tensor), name
    ids = [1, 70, 71, 259, 261, 19, 13, 20, 31]
    torch.testing.assert_close(logits(model, ids), logits(llama, ids), rtol=0, atol=0)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert getattr(model, "hf_quantizer", None) is None  # trainable and savable
    check_gguf_tokenizer(load_tokenizer(gguf_file))
    assert load_model(gguf_file, "bfloat16").dtype == torch.bfloat16


def test_gguf_without_the_gguf_package_is_one_line_naming_the_extra(gguf_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    for call in (
        lambda: resolve_model_path(str(gguf_file)),
        lambda: import_gguf(gguf_file, gguf_file.parent / "never"),
    ):
        with pytest.raises(UserError) as err:
            call()
        message = str(err.value)
        assert "\n" not in message
        assert "pip install 'oncurve[gguf]'" in message
        assert str(gguf_file) in message
    assert not (gguf_file.parent / "never").exists()


@pytest.mark.parametrize("release,refused", [("5.17.0", True), ("5.18.0", False)])
def test_gguf_with_a_transformers_that_misreads_its_special_tokens_is_one_line(
    gguf_file, monkeypatch, release, refused
):
    """transformers before 5.18 loads the GGUF tokenizer with its BOS as the EOS too, so a run
    would never see a completion end: refused with what to install."""
    # the module oncurve imported: a test elsewhere may have put another in sys.modules since
    monkeypatch.setattr(model_sources.transformers, "__version__", release)
    if not refused:
        assert resolve_model_path(str(gguf_file)) == gguf_file
        return
    with pytest.raises(UserError) as err:
        resolve_model_path(str(gguf_file))
    message = str(err.value)
    assert "\n" not in message and str(gguf_file) in message
    assert "needs transformers 5.18 or later" in message and "(this is 5.17.0)" in message


@pytest.mark.parametrize("keep", [10, 30, 2000, -100], ids=lambda n: f"cut at {n}")
def test_a_truncated_gguf_file_is_one_line_naming_it(gguf_file, tmp_path, keep, capsys):
    """Cut in its header (the gguf reader's struct.error) or in its tensors."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf_file.read_bytes()[:keep])
    for load in (load_tokenizer, load_model):
        with pytest.raises(UserError) as err:
            load(cut)
        message = str(err.value)
        assert "\n" not in message and str(cut) in message
        assert "truncated or damaged" in message
    out = tmp_path / "imported"
    assert main(["models", "import", str(cut), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(cut) in error and "truncated" in error
    assert not out.exists()


def test_a_missing_gguf_file_is_an_error_not_a_hub_lookup(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_download)
    with pytest.raises(UserError, match="no such GGUF file"):
        resolve_model_path("models/missing.gguf")


def test_models_import_writes_a_directory_transformers_loads_with_the_same_logits(
    llama, gguf_file, tmp_path, capsys
):
    out = tmp_path / "imported"
    assert main(["models", "import", str(gguf_file), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= files
    assert "tokenizer.json" in files and "tokenizer_config.json" in files
    assert not list(tmp_path.glob(".*partial"))  # no leftover of the atomic write
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.model_type == "llama"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    ids = [1, 259, 261, 19, 13, 20, 31]
    torch.testing.assert_close(logits(model, ids), logits(llama, ids), rtol=0, atol=0)
    check_gguf_tokenizer(transformers.AutoTokenizer.from_pretrained(out))
    check_gguf_tokenizer(load_tokenizer(resolve_model_path(str(out))))
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2

    half = tmp_path / "half"
    argv = ["models", "import", str(gguf_file), "--out", str(half), "--dtype", "bfloat16"]
    assert main(argv) == 0
    assert transformers.AutoModelForCausalLM.from_pretrained(half).dtype == torch.bfloat16


def test_models_import_never_writes_into_a_non_empty_directory(gguf_file, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["models", "import", str(gguf_file), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not empty" in error and str(out) in error
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["models", "import", str(gguf_file), "--out", str(empty)]) == 0
    assert (empty / "model.safetensors").is_file()


def test_models_import_writes_where_a_link_to_an_empty_directory_points(gguf_file, tmp_path):
    """`--out` a symbolic link to an empty directory (on a larger disk): the model is written
    into that directory, and the link stays."""
    disk = tmp_path / "disk" / "model"
    disk.mkdir(parents=True)
    link = tmp_path / "model"
    link.symlink_to(disk)
    assert main(["models", "import", str(gguf_file), "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == disk
    assert (disk / "model.safetensors").is_file() and (disk / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".*partial")) and not list(disk.parent.glob(".*partial"))


def test_a_run_from_a_gguf_saves_a_final_directory_that_loads_and_generates(
    gguf_file, data_file, tmp_path
):
    from oncurve.loop.trainer import train

    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            f"model.path={gguf_file}",
            f"data.path={data_file}",
            "data.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "reward.timeout=null",
            "run.steps=1",
            f"run.dir={run_dir}",
            "run.device=cpu",
        ],
    )
    train(config, quiet=True)
    final = run_dir / "final"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (final / name).is_file(), name
    model = transformers.AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(final)
    check_gguf_tokenizer(tokenizer)
    ids = tokenizer("1+2=", return_tensors="pt")["input_ids"]
    out = model.generate(ids, do_sample=False, max_new_tokens=5, pad_token_id=0)
    assert out.shape[1] > ids.shape[1]
    assert tokenizer.decode(out[0, : ids.shape[1]]) == "1+2="


def test_sample_takes_a_gguf_model(gguf_file, capsys):
    argv = ["sample", "--model", str(gguf_file), "--prompt", "he", "-n", "2", "--device", "cpu"]
    assert main([*argv, "--max-new-tokens", "3", "--temperature", "0.5"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all("completion" in row for row in rows)


# --- Hugging Face Hub --------------------------------------------------------------------------


def _no_download(*args, **kwargs):
    raise AssertionError("snapshot_download must not be called")


def fake_cache(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """`model_dir` as the Hugging Face cache keeps a snapshot of `repo_id` at main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline_cache(tiny_model_dir, tmp_path, monkeypatch) -> Path:
    """An offline Hugging Face cache holding `acme/tiny` (the tiny Qwen2 and char tokenizer)."""
    cache = tmp_path / "hf-cache"
    snapshot = fake_cache(cache, "acme/tiny", tiny_model_dir)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_a_cached_hub_model_loads_offline(offline_cache, tiny_model_dir):
    path = resolve_model_path("acme/tiny")
    assert path == offline_cache
    assert resolve_model_path("acme/tiny", revision=COMMIT) == offline_cache
    assert hub_commit(path) == COMMIT and hub_commit(tiny_model_dir) is None
    model, reference = load_model(path), load_model(tiny_model_dir)
    ids = load_tokenizer(path)("12+3=")["input_ids"]
    assert ids == load_tokenizer(tiny_model_dir)("12+3=")["input_ids"]
    torch.testing.assert_close(logits(model, ids), logits(reference, ids), rtol=0, atol=0)


def test_sample_takes_a_hub_id(offline_cache, capsys):
    argv = ["sample", "--model", "acme/tiny", "--prompt", "1+1=", "-n", "2", "--device", "cpu"]
    assert main([*argv, "--max-new-tokens", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_hub_id_revision_and_file_patterns_reach_snapshot_download(tiny_model_dir, monkeypatch):
    calls = []

    def fake(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tiny_model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", revision="v1.2") == tiny_model_dir
    ((repo_id, kwargs),) = calls  # safetensors found: no second call for .bin weights
    assert repo_id == "Qwen/Qwen2.5-0.5B-Instruct"
    assert kwargs["revision"] == "v1.2"
    assert "*.safetensors" in kwargs["allow_patterns"]
    assert "*.gguf" not in kwargs["allow_patterns"] and "*.bin" not in kwargs["allow_patterns"]
    calls.clear()
    resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    assert calls[0][1]["revision"] is None


def test_a_hub_model_without_safetensors_is_refused_and_no_bin_is_fetched(tmp_path, monkeypatch):
    """PyTorch `.bin` weights are pickles: never downloaded, never loaded."""
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    patterns = []

    def fake(repo_id, **kwargs):
        patterns.append(kwargs["allow_patterns"])
        (folder / "pytorch_model.bin").write_bytes(b"pickle")  # what a *.bin pattern would fetch
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    with pytest.raises(UserError) as err:
        resolve_model_path("old/model")
    message = str(err.value)
    assert "\n" not in message and "model.path old/model" in message
    assert "no safetensors weights" in message and "safe_serialization=True" in message
    assert len(patterns) == 1 and not any(".bin" in p for p in patterns[0])


@pytest.mark.parametrize(
    "error",
    [
        hub_errors.LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder"),
        OSError("Network is unreachable"),
    ],
)
def test_an_uncached_hub_model_offline_is_one_line_naming_the_id(error, monkeypatch):
    def fail(repo_id, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(UserError) as err:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", revision="abc")
    message = str(err.value)
    assert "\n" not in message
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct --revision abc" in message
    assert "local model directory" in message


def test_hub_offline_mode_with_nothing_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"acme/absent is not in the local .* offline mode"):
        resolve_model_path("acme/absent")


def test_cli_reports_a_missing_hub_model_on_one_line(monkeypatch, capsys):
    def fail(repo_id, **kwargs):
        raise hub_errors.LocalEntryNotFoundError("no\nnetwork")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    argv = ["sample", "--model", "acme/tiny", "--prompt", "1", "--device", "cpu"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "--model acme/tiny" in error


def test_a_local_directory_wins_over_a_hub_id(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _no_download)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "acme" / "tiny")
    assert is_hub_id("acme/other") and not is_hub_id("acme/tiny")
    assert resolve_model_path("acme/tiny") == Path("acme/tiny")
    assert not is_hub_id("default") and not is_hub_id("x/y.gguf") and not is_hub_id("a/b/c")
    with pytest.raises(UserError, match="model.revision applies to a Hugging Face Hub id only"):
        resolve_model_path("acme/tiny", revision="main")
    with pytest.raises(UserError, match="nor a Hugging Face Hub id|not a directory"):
        resolve_model_path("no-such-dir")


def test_a_run_records_the_commit_of_its_hub_model(offline_cache, data_file, tmp_path):
    from oncurve.loop.trainer import setup

    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            "model.path=acme/tiny",
            f"data.path={data_file}",
            "reward.functions=[helpers.rewards_for_tests:count_digits]",
            "rollout.max_new_tokens=16",
            "reward.timeout=null",
            f"run.dir={run_dir}",
            "run.device=cpu",
        ],
    )
    session = setup(config)
    assert session.config.model.revision == COMMIT
    saved = load_config(run_dir / "config.yaml")
    assert (saved.model.path, saved.model.revision) == ("acme/tiny", COMMIT)


def test_model_path_help_names_every_source():
    from oncurve.config import ModelConfig

    fields = {f.name: f for f in ModelConfig.__dataclass_fields__.values()}
    help_text = fields["path"].metadata["help"]
    assert "Hub id" in help_text and ".gguf" in help_text
    assert fields["revision"].default is None
    assert model_sources.HUB_FILES  # what a snapshot downloads is one list, shared by every caller
