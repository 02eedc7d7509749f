"""train.compile never ends a session: a step that torch.compile cannot build runs eagerly (baton/runtime/compiled.py).

On CUDA, compile and the fused loss are both on by default; liger's kernel inside a compiled graph failed in
fake-tensor propagation after a minute of compiling. The same class of failure is made here on the CPU: a
loss built on an operator with no fake implementation (dynamo cannot trace it), and a backend that fails.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import baton
from baton.config import ModelConfig, load_config
from baton.guard import local_store_root
from baton.model.llama import build_model
from baton.runtime import compiled, regional
from baton.runtime.autotune import micro_loss_fn
from baton.runtime.compiled import CompiledOrEager, compiled_parts, fallbacks
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors


@torch.library.custom_op("batontest::opaque_cross_entropy", mutates_args=())
def opaque_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss with no fake (meta) implementation: runs eagerly, but fake-tensor tracing cannot follow it."""
    return F.cross_entropy(logits, targets)


def _backend_that_fails(gm, example_inputs):
    raise RuntimeError("the code generator gave up")


def tiny_batch():
    m = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, max_seq_len=64)
    x = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(0))
    return m, x[:, :-1], x[:, 1:]


def test_an_untraceable_loss_falls_back_to_eager_with_the_same_numbers(caplog):
    def loss(logits, y):
        return opaque_cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))

    logits = torch.randn(4, 8, 16, requires_grad=True)
    y = torch.randint(0, 16, (4, 8))
    fn = CompiledOrEager(loss, "the test loss", backend="eager")
    with caplog.at_level(logging.WARNING, logger="baton.runtime.compiled"):
        got = fn(logits, y)
    assert torch.equal(got, loss(logits, y))
    assert fn.fell_back is not None and fn.fell_back.startswith("TorchRuntimeError")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("train.compile: the test loss could not be compiled on torch ")
    assert line.endswith("this session runs it eagerly (set train.compile = false to skip the attempt)")
    assert fallbacks(fn) == [f"the test loss: eager ({fn.fell_back})"]


def test_after_a_failed_compile_every_call_is_eager_and_equal_to_eager():
    calls = []

    def counting_failure(gm, example_inputs):
        calls.append(1)
        return _backend_that_fails(gm, example_inputs)

    m, x, y = tiny_batch()
    results = []
    for backend in (None, counting_failure):
        model = build_model(m, "cpu", seed=0)
        fn = micro_loss_fn(None, compiled=backend is not None, backend=backend)
        losses = []
        for _ in range(3):
            loss = fn(model, x, y)
            loss.backward()
            losses.append(loss.detach())
        results.append((losses, [p.grad.clone() for p in model.parameters()]))
    assert calls == [1]  # one attempt, then straight to eager
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_a_backward_graph_that_fails_to_compile_falls_back_too():
    """AOTAutograd lowers the backward lazily, at the first ``.backward()``, outside the wrapper: a code generator
    failing there (an inductor or Triton error in the backward graph) would end the session. It is compiled with
    the forward instead, so the failure falls back like any other, with the eager numbers."""
    from torch._dynamo.backends.common import aot_autograd

    if not hasattr(torch._functorch.config, "force_non_lazy_backward_lowering"):
        pytest.skip(f"torch {torch.__version__} lowers the backward lazily, always")
    backend = aot_autograd(fw_compiler=lambda gm, example_inputs: gm, bw_compiler=_backend_that_fails)
    m, x, y = tiny_batch()
    grads = []
    for fn in (micro_loss_fn(None, compiled=False), micro_loss_fn(None, compiled=True, backend=backend)):
        model = build_model(m, "cpu", seed=0)
        fn(model, x, y).backward()
        grads.append([p.grad for p in model.parameters()])
    assert fallbacks(fn) and all(": eager (BackendCompilerFailed" in n for n in fallbacks(fn)), fallbacks(fn)
    assert_tensors_equal(dict(enumerate(grads[0])), dict(enumerate(grads[1])))


def test_an_error_of_the_computation_itself_is_not_taken_for_a_compile_failure():
    def broken(t):
        raise ValueError("a real bug in the step")

    fn = CompiledOrEager(broken, "the broken step", backend="eager")
    with pytest.raises(ValueError, match="a real bug in the step"):
        fn(torch.ones(2))
    assert fn.fell_back is None


@pytest.mark.parametrize(("scope", "parts"), [("model", ["the forward and loss"]),
                                               ("blocks", ["the loss", "the decoder block"])])
def test_a_session_whose_compile_fails_trains_exactly_the_eager_run(make_config, monkeypatch, scope, parts):
    """train.compile = true with a compiler that fails: the session completes, says so in its summary, and its
    checkpoint is bit-identical to a run with train.compile = false."""
    summaries, tensors = [], []
    for setting in ("false", "true"):
        monkeypatch.setattr(compiled, "BACKEND", _backend_that_fails)
        cfg = load_config(make_config(name=f"{setting}.toml", store=None, run_name=f"c{setting}"),
                          [f"train.compile={setting}", "train.steps=4", f"train.compile_scope={scope}"])
        summaries.append(baton.train(cfg, progress=False))
        tensors.append(store_checkpoint_tensors(local_store_root(cfg.store.url), cfg.run.name))
    assert summaries[0]["compile_fallbacks"] == []
    notes = summaries[1]["compile_fallbacks"]
    assert [n.split(":")[0] for n in notes] == parts
    assert all(": eager (BackendCompilerFailed" in n for n in notes)
    assert summaries[1]["compile"] is True and summaries[1]["compile_scope"] == scope
    # Nothing compiled, so nothing to carry: said, not pushed.
    assert summaries[1]["compile_cache"]["push_note"] == "compile cache: nothing pushed, the compile fell back to eager"
    assert_tensors_equal(tensors[0][0], tensors[1][0])
    assert_tensors_equal(tensors[0][1], tensors[1][1])


# ------------------------------------------------------------------------------ train.compile_scope = blocks


class Graphs:
    """A backend that counts the graphs it is given and runs each as traced (no code generation)."""

    def __init__(self):
        self.nodes: list[int] = []

    def __call__(self, gm, example_inputs):
        self.nodes.append(len(gm.graph.nodes))
        return gm.forward


def _steps(fn, model, x, y, n=2):
    for _ in range(n):
        model.zero_grad(set_to_none=True)
        loss = fn(model, x, y)
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_one_compiled_block_serves_every_layer_with_the_eager_numbers(grad_ckpt):
    m, x, y = tiny_batch()
    m.n_layers, m.grad_ckpt = 3, grad_ckpt
    want = _steps(micro_loss_fn(None, compiled=False), build_model(m, "cpu", seed=0), x, y)
    graphs = Graphs()
    fn = micro_loss_fn(None, compiled=True, backend=graphs, scope="blocks")
    model = build_model(m, "cpu", seed=0)
    got = _steps(fn, model, x, y)
    # The block, traced once for three layers, and the loss. Under activation checkpointing the block is traced
    # only where dynamo can follow the checkpoint (transformers' hub-kernel attention wrapper, where installed,
    # has a side effect it cannot replay: the block then runs eagerly, as a whole-model compile's layers do).
    assert len(graphs.nodes) == 2 if not grad_ckpt else 1 <= len(graphs.nodes) <= 2
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    # A model built again (a rollback's) runs the same compiled block; an evaluation (no gradients) runs eagerly,
    # so its other batch shape compiles nothing.
    compiled_so_far = len(graphs.nodes)
    _steps(fn, build_model(m, "cpu", seed=0), x, y, n=1)
    with torch.no_grad():
        model(input_ids=x[:1, :5])
    assert len(graphs.nodes) == compiled_so_far
    assert [p.what for p in compiled_parts(fn)] == ["the loss", "the decoder block"]


def test_a_block_that_cannot_compile_runs_every_layer_eagerly_said_once(caplog):
    m, x, y = tiny_batch()
    want = _steps(micro_loss_fn(None, compiled=False), build_model(m, "cpu", seed=0), x, y)
    fn = micro_loss_fn(None, compiled=True, backend=_backend_that_fails, scope="blocks")
    with caplog.at_level(logging.WARNING, logger="baton.runtime.compiled"):
        got = _steps(fn, build_model(m, "cpu", seed=0), x, y)
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    said = sorted(r.getMessage().split(" could not")[0] for r in caplog.records)
    assert said == ["train.compile: the decoder block", "train.compile: the loss"]  # once each, not once a layer
    assert len(fallbacks(fn)) == 2


def test_blocks_need_a_torch_that_shares_one_compiled_block():
    assert regional.supported("2.5.0") and regional.supported("2.14.1+cu130")
    assert not regional.supported("2.4.1+cpu") and not regional.supported("nonsense")
    cfg = load_config(None, ["train.compile=true", "train.micro_batch=4"])
    notes = {}
    import unittest.mock

    with unittest.mock.patch.object(torch, "__version__", "2.4.1"):
        from baton.runtime.autotune import resolve

        notes = resolve(cfg, torch.device("cpu"), 1)
    assert cfg.train.compile_scope == "model"
    assert notes["compile_scope"] == ("blocks -> model (torch 2.4.1 would compile every layer anew; torch 2.5 and newer "
                                      "share one compiled block)")


def test_a_compiled_session_with_the_chunked_loss_trains_as_the_eager_one(make_config, monkeypatch):
    """train.fused_ce = "chunked" with train.compile = true: the model and the loss compile as one graph (no
    fallback) and four steps give the eager run's losses and gradient norms within 1e-5 relative (fp32; the
    compiled graph may order its sums differently). aot_eager is dynamo and AOTAutograd as on CUDA, without the
    code generation."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    rows, summaries = [], []
    for setting in ("false", "true"):
        cfg = load_config(make_config(name=f"{setting}.toml", store=None, run_name=f"k{setting}"),
                          [f"train.compile={setting}", "train.fused_ce=chunked", "train.steps=4"])
        summaries.append(baton.train(cfg, progress=False))
        rows.append(read_metrics(cfg.run_dir))
    assert [s["fused_ce"] for s in summaries] == ["chunked", "chunked"] and summaries[1]["compile"] is True
    assert summaries[1]["compile_fallbacks"] == []
    assert [r["batch_sha"] for r in rows[0]] == [r["batch_sha"] for r in rows[1]]
    for eager, comp in zip(rows[0], rows[1]):
        assert comp["loss"] == pytest.approx(eager["loss"], rel=1e-5)
        assert comp["grad_norm"] == pytest.approx(eager["grad_norm"], rel=1e-5)
