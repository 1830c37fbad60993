"""What a CUDA graph can hold, checked on the CPU.

A captured decode step must not read a device value on the host (a capture forbids the sync),
must not make a tensor whose shape depends on data, and must not make a CPU tensor (a graph
replays device kernels only). On the CPU none of these fail, so the step runs here under a
dispatch mode and a function mode that raise on each of them, and once more on the `meta`
device, where a CPU tensor made inside the step cannot meet the workspace's tensors.

The pool bookkeeping is checked with fakes of `torch.cuda.graph`, `CUDAGraph` and
`graph_pool_handle` that count live graphs per pool and raise, as PyTorch's allocator asserts,
when a capture goes into a pool whose graphs were all freed.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import yaml
from helpers.configs import make_config
from helpers.counting import OpCounter
from helpers.graph_sampler import FakePools, assert_fell_back_once, assert_same_samples
from helpers.host_reads import BANNED_METHODS, HOST_READS
from helpers.models import EOS, PROMPTS, TOKENIZER, lora_model, make_model, model_of
from helpers.runs import metric_rows
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from oncurve.loop.evaluate import evaluate
from oncurve.loop.trainer import train
from oncurve.rollout import SamplingParams, build_sampler, cuda_graph
from oncurve.rollout.cuda_graph import GraphSampler
from oncurve.rollout.cuda_graph import step as static_step

aten = torch.ops.aten


class HostReadError(RuntimeError):
    pass


class NoHostReads(TorchDispatchMode):
    """Raises on every op a captured step cannot hold (see `HOST_READS`), on indexing with a
    boolean mask (its output shape is the mask's count) and on copies to the CPU."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            raise HostReadError(f"{func} in a captured step")
        if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            masks = [i for i in args[1] if i is not None and i.dtype == torch.bool]
            if masks:
                raise HostReadError(f"{func} with a boolean mask in a captured step")
        if func is aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            to_cpu = args[0].device.type != "cpu"
        else:
            to_cpu = False
        if to_cpu:
            raise HostReadError("a copy to the CPU in a captured step")
        return func(*args, **kwargs)


class NoHostMethods(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in BANNED_METHODS:
            raise HostReadError(f"{func.__name__} in a captured step")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def as_captured():
    with NoHostMethods(), NoHostReads():
        yield


def test_the_guard_catches_each_kind_of_host_read():
    x = torch.arange(6.0)
    attempts = [
        lambda: x[x > 2],  # boolean mask
        lambda: int(x.sum()),
        lambda: x.tolist(),
        lambda: bool(x.any()),
        lambda: x.nonzero(),
        lambda: x + torch.tensor([1.0]),  # a tensor made from Python data
        lambda: x[torch.tensor(2)],  # a 0-dim index is read on the host
        lambda: torch.zeros(2, 6).scatter(1, torch.zeros(2, 6, dtype=torch.long), x.expand(2, 6)),
    ]
    for attempt in attempts:
        with pytest.raises(HostReadError), as_captured():
            attempt()
    with as_captured():  # what the step may do
        index = torch.zeros(1, dtype=torch.long)
        x.index_select(0, index).add_(1).masked_fill_(x[:1] > 0, 0.0)


SAMPLINGS = {
    "top_k": dict(temperature=0.8, top_k=5),
    "top_p": dict(temperature=1.0, top_p=0.9),
    "min_p": dict(temperature=1.0, min_p=0.1),
    "min_new_tokens": dict(temperature=1.0, min_new_tokens=4),
    "greedy": dict(temperature=0.0),
}


def ready_sampler(model: torch.nn.Module, params: SamplingParams) -> tuple[GraphSampler, object]:
    """A sampler and its workspace after the prefill, as a capture finds them."""
    sampler = GraphSampler(model, TOKENIZER, use_graphs=False)
    prompt_ids = TOKENIZER(PROMPTS)["input_ids"]
    ids, mask = sampler._pad_prompts(prompt_ids, 2, params)
    ws = sampler._workspace(ids.shape[0] * 2, ids.shape[1], params.max_new_tokens)
    sampler._eos_mask(model.get_output_embeddings().weight.shape[0], ids.device)
    logits = sampler._prefill(ws, ids, mask, 2, params)
    sampler._first_draw(ws, ws.rows, logits, params)
    return sampler, ws


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "lora"])
@torch.inference_mode()
def test_the_decode_step_reads_nothing_on_the_host(kind, sampling):
    model = lora_model() if kind == "lora" else model_of(kind)
    params = SamplingParams(max_new_tokens=8, seed=3, **SAMPLINGS[sampling])
    sampler, ws = ready_sampler(model, params)
    before = ws.completion.clone()
    with as_captured():
        for rows in (ws.rows, 4):  # the full bucket and a smaller one
            sampler._step(ws, rows, params)
    assert int(ws.t) == 3
    assert not torch.equal(ws.completion[:, 1:3], before[:, 1:3])  # the steps drew tokens


@pytest.mark.parametrize("sampling", ["top_p", "min_new_tokens", "greedy"])
@torch.inference_mode()
def test_the_decode_step_runs_on_the_meta_device(sampling):
    """A CPU tensor made inside the step (a constant, a Python list turned into an index) fails
    beside the workspace's meta tensors, as it would beside CUDA ones in a graph."""
    with torch.device("meta"):
        model = model_of("qwen2")
    params = SamplingParams(max_new_tokens=6, seed=0, **SAMPLINGS[sampling])
    sampler = GraphSampler(model, TOKENIZER, use_graphs=False)
    ws = sampler._workspace(8, 16, params.max_new_tokens)
    sampler._eos_mask(model.get_output_embeddings().weight.shape[0], ws.tokens.device)
    assert ws.keys[0].device.type == "meta"
    sampler._step(ws, ws.rows, params)
    sampler._step(ws, 4, params)
    assert ws.completion.device.type == "meta"


def test_one_sampler_recaptures_through_a_runs_calls_without_reusing_a_freed_pool(monkeypatch):
    """Preflight, evaluation in two chunk sizes, training, another temperature, another prompt
    width: every change of shape or settings recaptures, and no capture may go into a pool
    whose graphs were freed."""
    pools = FakePools()
    pools.install(monkeypatch)
    model = make_model("qwen2")
    sampler = GraphSampler(model, TOKENIZER, use_graphs=True)
    train = SamplingParams(max_new_tokens=6, temperature=1.0, seed=1)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    calls = [
        (PROMPTS[:2], 4, train),  # preflight: 2 prompts x G
        (PROMPTS * 10, 1, greedy),  # evaluation, a full chunk
        (PROMPTS * 3, 1, greedy),  # its last, shorter chunk
        (PROMPTS * 2, 4, train),  # training
        (PROMPTS * 2, 4, SamplingParams(max_new_tokens=6, temperature=0.7, seed=2)),
        (["1+1=" * 30] + PROMPTS, 4, train),  # a wider prompt
        (PROMPTS * 10, 1, greedy),  # evaluation again
    ]
    for prompts, group, params in calls:
        batch = sampler.generate(prompts, group, params)
        assert batch.num_rows == len(prompts) * group
    assert pools.captures >= len(calls)
    assert sampler.use_graphs and sampler.graph_error is None


def test_a_failed_capture_decodes_eagerly_with_the_same_samples(capsys):
    """Graphs asked for on the CPU cannot be captured: the sampler says so once, samples what
    the eager sampler samples, and does not try again."""
    model = make_model("qwen2", eos_bias=1.0)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=4)
    eager = GraphSampler(model, TOKENIZER, use_graphs=False).generate(PROMPTS * 3, 4, params)
    failing = GraphSampler(model, TOKENIZER, use_graphs=True)
    first = failing.generate(PROMPTS * 3, 4, params)
    again = failing.generate(PROMPTS * 3, 4, params)
    assert_fell_back_once(capsys, "decoding eagerly", failing.graph_error, [first, again], eager)
    assert not failing.use_graphs and failing.turned_off() == {"cuda_graphs": False}


@pytest.mark.parametrize("check_every", [3, 8])
def test_reading_endings_every_few_steps_samples_what_reading_every_step_does(check_every):
    """On an accelerator the decode reads which rows ended only every few steps; rows keep
    decoding past an EOS or a stop string in between, and must end where they ended."""
    model = make_model("qwen2", eos_bias=1.5)
    sampler = GraphSampler(model, TOKENIZER, use_graphs=False)
    stop = (" ", "4")
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=6, stop=stop)
    every = sampler.generate(PROMPTS * 4, 4, params)
    assert {"eos", "stop", "length"} <= set(every.finish_reasons)
    sampler.check_every = check_every
    sparse = sampler.generate(PROMPTS * 4, 4, params)
    assert sparse.finish_reasons == every.finish_reasons
    assert sparse.texts == every.texts
    assert torch.equal(sparse.completion_ids, every.completion_ids)
    # other buckets at other steps: the same tokens, logprobs to float rounding
    torch.testing.assert_close(sparse.logprobs, every.logprobs, atol=1e-5, rtol=0)


def test_a_run_whose_capture_fails_trains_on_and_records_it(
    tiny_model_dir, data_file, tmp_path, capsys
):
    """The first capture (the preflight's) fails on the CPU: the run trains on, eagerly, with
    what a run without graphs samples, and says so in config.yaml and its metrics."""
    runs = {}
    for graphs in ("true", "false"):
        run_dir = tmp_path / graphs
        config = make_config(
            tiny_model_dir,
            data_file,
            run_dir,
            "rollout.backend=cuda_graph",
            f"rollout.cuda_graphs={graphs}",
            "run.steps=2",
        )
        train(config, quiet=True)
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        runs[graphs] = (saved["rollout"]["cuda_graphs"], metric_rows(run_dir))
    err = capsys.readouterr().err
    assert err.count("capturing the decode step failed") == 1
    assert runs["true"][0] is False and runs["false"][0] is False
    fell_back, eager = runs["true"][1], runs["false"][1]
    assert [row["rollout/graphs"] for row in fell_back if "rollout/graphs" in row] == [0.0, 0.0]
    for key in ("reward/mean", "length/mean", "loss"):
        assert [r[key] for r in fell_back if key in r] == [r[key] for r in eager if key in r]


def test_evaluation_chunks_are_equal_and_share_one_workspace():
    sampler = GraphSampler(make_model("qwen2"), TOKENIZER, use_graphs=False)
    sizes = []
    real = sampler.generate_ids

    def recording(prompt_ids, group_size, params):
        sizes.append(len(prompt_ids))
        return real(prompt_ids, group_size, params)

    sampler.generate_ids = recording
    prompts = (PROMPTS * 7)[:20]
    rows = [{"prompt": p, "prompt_ids": TOKENIZER(p)["input_ids"], "answer": "1"} for p in prompts]

    def never(prompts, completions, **_):
        return [0.0] * len(completions)

    evaluate(sampler, rows, never, SamplingParams(4), batch_size=16)
    assert sizes == [10, 10]
    assert len(sampler._workspaces) == 1


@pytest.mark.parametrize("backend", ["hf", "cpu_llama"])
def test_the_shared_decode_loop_reading_endings_every_few_steps_ends_rows_where_they_end(backend):
    """With endings read every 5 steps (as on an accelerator) rows that finished keep decoding
    until the read; each must still end at its first EOS or stop string, or run to the limit."""
    sampler = build_sampler(backend, make_model("qwen2", eos_bias=1.5), TOKENIZER)
    sampler.check_every = 5
    stops = (" ", "4")
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=6, stop=stops)
    batch = sampler.generate(PROMPTS * 4, 4, params)
    assert {"eos", "stop", "length"} <= set(batch.finish_reasons)
    lengths = batch.completion_mask.sum(1).tolist()
    for row, (reason, length) in enumerate(zip(batch.finish_reasons, lengths, strict=True)):
        ids = batch.completion_ids[row, :length].tolist()
        shorter = TOKENIZER.decode(ids[:-1], skip_special_tokens=True)
        assert not any(s in shorter for s in stops)  # no stop string before the end
        assert EOS not in ids[:-1]
        if reason == "eos":
            assert ids[-1] == EOS
        elif reason == "stop":
            assert batch.texts[row].endswith(stops) and ids[-1] != EOS
        else:
            assert length == 20 and ids[-1] != EOS


def test_the_parts_of_a_split_call_sample_what_the_whole_call_samples():
    """Split to fit memory, each part says which rows it samples (first_row): the graph
    sampler's draws are per output row, so the parts together are the whole call."""
    sampler = GraphSampler(make_model("qwen2", eos_bias=1.0), TOKENIZER, use_graphs=False)
    prompts = PROMPTS * 4
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=30, seed=9)
    whole = sampler.generate(prompts, 4, params)
    parts = [
        sampler.generate(prompts[:6], 4, params),
        sampler.generate(prompts[6:], 4, dataclasses.replace(params, first_row=6 * 4)),
    ]
    assert [t for part in parts for t in part.texts] == whole.texts
    assert [r for part in parts for r in part.finish_reasons] == whole.finish_reasons
    logprobs = [
        row[mask.bool()]
        for part in parts
        for row, mask in zip(part.logprobs, part.completion_mask, strict=True)
    ]
    want = [
        row[mask.bool()] for row, mask in zip(whole.logprobs, whole.completion_mask, strict=True)
    ]
    for got_row, want_row in zip(logprobs, want, strict=True):
        torch.testing.assert_close(got_row, want_row, atol=1e-5, rtol=0)
    # without first_row the second part would redraw the first part's numbers
    unmarked = sampler.generate(prompts[6:], 4, params)
    assert unmarked.texts != parts[1].texts


def test_a_capture_that_runs_out_of_memory_is_left_to_the_out_of_memory_recovery(monkeypatch):
    """Running out of memory while capturing is not a reason to give up graphs for the run:
    the error reaches the caller, which redoes the call smaller, and graphs stay on."""
    pools = FakePools()
    pools.install(monkeypatch)

    def no_room(graph, pool=None, **_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(torch.cuda, "graph", no_room)
    sampler = GraphSampler(make_model("qwen2"), TOKENIZER, use_graphs=True)
    with pytest.raises(torch.OutOfMemoryError):
        sampler.generate(PROMPTS, 4, SamplingParams(max_new_tokens=6, seed=1))
    assert sampler.use_graphs and sampler.graph_error is None


# a product is seen once: as the composite op, or (outside inference mode) as what it becomes
MATMULS = {aten.linear.default, aten.matmul.default, aten.mm.default, aten.addmm.default}


def matmuls_of_a_step(sampler: GraphSampler, ws, params: SamplingParams) -> int:
    """Matrix products one decode step of all of `ws`'s rows runs."""
    with OpCounter(MATMULS) as matmuls:
        sampler._step(ws, ws.rows, params)
    return matmuls.count


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
@torch.inference_mode()
def test_the_decode_step_reads_q_k_v_with_one_matmul_and_gate_up_with_another(kind):
    """Four matmuls a layer (q/k/v, o, gate/up, down) and the head's: on a GPU each kernel of
    the step is worth a few microseconds, whatever its size. The samples are those of the
    training forward (`test_cuda_graph`)."""
    model = model_of(kind)
    params = SamplingParams(max_new_tokens=8, seed=3)
    sampler, ws = ready_sampler(model, params)
    layers = len(model.model.layers)
    assert matmuls_of_a_step(sampler, ws, params) == 4 * layers + 1


def test_laying_projections_out_keeps_the_parameters_their_values_and_the_forward():
    model = make_model("qwen2")  # q, k and v have biases
    before = {name: (p, p.detach().clone()) for name, p in model.named_parameters()}
    ids = torch.randint(3, 60, (2, 7))
    with torch.no_grad():
        logits = model(ids).logits
    assert cuda_graph.lay_out_projections(model) == 2 * len(model.model.layers)
    assert cuda_graph.lay_out_projections(model) == 2 * len(model.model.layers)  # idempotent
    for name, param in model.named_parameters():
        assert param is before[name][0] and torch.equal(param, before[name][1]), name
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    start = attention.q_proj.weight.data_ptr()
    assert attention.v_proj.bias.untyped_storage().data_ptr() == attention.q_proj.bias.data_ptr()
    assert attention.k_proj.weight.data_ptr() == start + attention.q_proj.weight.nbytes
    assert (
        mlp.up_proj.weight.data_ptr()
        == mlp.gate_proj.weight.data_ptr() + mlp.gate_proj.weight.nbytes
    )
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


@torch.inference_mode()
def test_projections_no_longer_back_to_back_run_one_by_one_and_sample_the_same():
    """A weight moved after the layout (a `.to()`, a sharded refill) is not read past its own
    end: its group runs as separate matmuls, on the weights as they are now."""
    params = SamplingParams(max_new_tokens=8, seed=3)
    model = model_of("qwen2")
    sampler, ws = ready_sampler(model, params)
    laid_out = sampler.generate(PROMPTS, 2, params)
    for layer in model.model.layers:
        layer.self_attn.k_proj.weight.data = layer.self_attn.k_proj.weight.data.clone()
    assert matmuls_of_a_step(sampler, ws, params) == 6 * len(model.model.layers) + 1
    assert_same_samples(sampler.generate(PROMPTS, 2, params), laid_out, atol=1e-6)


@torch.inference_mode()
def test_lora_wrapped_projections_stay_as_they_are():
    model = lora_model()  # adapters on q, v and up
    sampler, ws = ready_sampler(model, SamplingParams(max_new_tokens=8, seed=3))
    for layer in model.model.layers:
        assert type(layer.self_attn.q_proj) is not torch.nn.Linear
        assert [static_step._together(g) for g in static_step._projection_groups(layer)] == [
            None,
            None,
        ]


@torch.inference_mode()
def test_every_layer_attends_with_one_aligned_bias_in_the_queries_dtype(monkeypatch):
    """The memory-efficient attention kernel converts a boolean mask, and pads a bias whose
    rows are not 16-aligned, at every call: a step makes the bias once, aligned by its
    cache's columns, for all layers."""
    model = model_of("qwen2").to(torch.bfloat16)
    params = SamplingParams(max_new_tokens=7, seed=3)
    sampler, ws = ready_sampler(model, params)
    # 12 prompt columns + 7 - 1 tokens fed back = 18 filled, 32 allocated
    assert ws.width == 12 and ws.keys[0].shape[2] == 32
    biases = []
    attention = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        biases.append(attn_mask)
        return attention(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(static_step.F, "scaled_dot_product_attention", recording)
    sampler._step(ws, ws.rows, params)
    assert len(biases) == len(model.model.layers)
    assert all(bias is biases[0] for bias in biases)
    bias = biases[0]
    assert bias.dtype == torch.bfloat16 and bias.stride(-2) % 16 == 0
    assert set(bias.unique().tolist()) == {0.0, float("-inf")}


def test_the_decode_runs_without_deterministic_algorithms_and_restores_them(monkeypatch):
    """CUDA's deterministic `index_put_` and `index_copy_` sort their indices (several kernels
    each), and inductor compiles such a write, in deterministic mode, as a call of that op
    (`aten.index_put_`, twice a layer); the step writes each index once, so the usual kernels
    sample the same."""
    model = model_of("qwen2")
    params = SamplingParams(max_new_tokens=6, seed=3)
    want = GraphSampler(model, TOKENIZER, use_graphs=False).generate(PROMPTS, 2, params)
    seen = []
    step = GraphSampler._run_step

    def recording(self, *args):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return step(self, *args)

    monkeypatch.setattr(GraphSampler, "_run_step", recording)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        got = GraphSampler(model, TOKENIZER, use_graphs=False).generate(PROMPTS, 2, params)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert seen and not any(seen)
    assert_same_samples(got, want, atol=0)
