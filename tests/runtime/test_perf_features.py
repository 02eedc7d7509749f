"""Performance features that can be proven on CPU: the MFU arithmetic, resolving the ``auto`` settings,
the micro-batch search, compile plumbing, the batch-building hot path, and what a run reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from baton.config import ModelConfig, load_config
from baton.data import reader as reader_mod
from baton.data.reader import WindowDataset, micro_batches
from baton.model.llama import build_model
from baton.runtime.autotune import choose_micro_batch, micro_batch_candidates, micro_loss_fn, resolve
from baton.runtime.compiled import CompiledOrEager, compiled_parts
from baton.runtime.flops import flops_per_token, matmul_params, mfu, peak_flops
from support.helpers import read_metrics

REF = ModelConfig(n_layers=22, hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab_size=49152,
                  tie_embeddings=True, max_seq_len=2048)


# ---------------------------------------------------------------------------------------------- FLOPs


def test_matmul_params_are_the_linear_weights_of_the_built_model():
    for m in (REF, ModelConfig(), ModelConfig(tie_embeddings=False, n_kv_heads=4)):
        model = build_model(m, "meta")
        linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
        assert matmul_params(m) == linear


def test_reference_flops_per_token_by_hand():
    # Blocks: 22 x (q,o 2*576^2 + k,v 2*576*192 + MLP 3*576*1536) = 77,856,768; head 49,152*576 = 28,311,552.
    n = 22 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 49152 * 576
    assert n == 106_168_320
    assert flops_per_token(REF, 2048) == 6 * n + 12 * 22 * 2048 * 576 == 948_436_992
    assert flops_per_token(REF, 2048, causal=True) == 6 * n + 6 * 22 * 2048 * 576


def test_peak_table_and_mfu():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756.5e12
    assert peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp32") == 156e12  # TF32 tensor cores
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp32", tf32=False) == 19.5e12
    assert peak_flops("Tesla T4", "fp16") == 65e12
    assert peak_flops("Tesla T4", "bf16") is None  # no bf16 tensor cores: no honest peak
    assert peak_flops("NVIDIA L40S", "bf16") == 362.05e12 and peak_flops("NVIDIA L4", "bf16") == 121e12
    assert peak_flops("Some Future GPU", "bf16") is None
    # 100k tok/s x 948.4 MFLOP/token on one H100 = 94.8 TFLOP/s = 9.59 % of 989.4.
    assert mfu(100_000, 948_436_992, 989.4e12) == pytest.approx(0.09586, abs=1e-5)
    assert mfu(200_000, 948_436_992, 989.4e12, devices=2) == pytest.approx(0.09586, abs=1e-5)
    assert mfu(100_000, 948_436_992, None) is None


# ----------------------------------------------------------------------------------- auto settings


def test_micro_batch_candidates_divide_the_rank_share():
    assert micro_batch_candidates(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert micro_batch_candidates(12) == [1, 2, 4, 12]
    assert micro_batch_candidates(6) == [1, 2, 6]
    assert micro_batch_candidates(1) == [1]


def test_micro_batch_search_stops_at_the_first_that_does_not_fit():
    # A memory model: 10 GiB of weights and moments plus 3 GiB per sample, on an 80 GiB card at 90 %.
    calls = []

    def attempt(mb):
        calls.append(mb)
        peak = (10 + 3 * mb) * 2**30
        return peak <= 0.9 * 80 * 2**30, peak

    chosen, tried = choose_micro_batch(micro_batch_candidates(128), attempt)
    assert chosen == 16 and calls == [1, 2, 4, 8, 16, 32]  # 32 needs 106 GiB: tried once, nothing after
    assert [t["fits"] for t in tried] == [True] * 5 + [False]
    assert choose_micro_batch([1, 2], lambda mb: (False, 0))[0] is None


def test_auto_settings_resolve_on_cpu(tmp_path):
    cfg = load_config(None, ["train.micro_batch=auto", "train.compile=auto", "train.precision=auto",
                             "train.global_batch=24"])
    notes = resolve(cfg, torch.device("cpu"), world=2)
    # 12 samples per rank: candidates 1, 2, 4, 12; without GPU memory to probe, the largest up to 4.
    assert (cfg.train.micro_batch, cfg.train.compile, cfg.train.precision) == (4, False, "fp32")
    assert "accumulation 3" in notes["micro_batch"]
    cfg = load_config(None, ["train.compile=true", "train.micro_batch=8", "train.global_batch=8",
                             "train.fused_ce=false"])
    assert resolve(cfg, torch.device("cpu"), world=1) == {"attn": "auto -> sdpa (cpu)"}  # the only auto left
    assert (cfg.train.micro_batch, cfg.train.compile) == (8, True)


def test_compiled_micro_loss_matches_eager():
    m = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=512, max_seq_len=64)
    x = torch.randint(0, 512, (4, 33), generator=torch.Generator().manual_seed(0))
    grads = []
    for compiled in (False, True):
        model = build_model(m, "cpu", seed=0)
        # The "eager" backend traces with dynamo exactly as train.compile does, without minutes of codegen.
        fn = micro_loss_fn(None, compiled=compiled, backend="eager")
        loss = fn(model, x[:, :-1], x[:, 1:])
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
        assert isinstance(fn, CompiledOrEager) == compiled
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_session_compiles_only_when_asked_and_fuses_adamw(make_config):
    from baton.session.core import Session

    for setting, compiled in (("auto", False), ("true", True)):
        cfg = load_config(make_config(), [f"train.compile={setting}"])
        s = Session(cfg, resume="never", progress=False)
        try:
            assert cfg.train.compile is compiled
            assert bool(compiled_parts(s.parts.micro_loss)) == compiled
            assert s.parts.optimizer.defaults["fused"] is True  # fused AdamW on CPU as on CUDA
        finally:
            s.close()


# ---------------------------------------------------------------------------------- batch hot path


def test_rows_match_per_window_reads_across_shard_joins(prepared_data):
    ds = WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)
    assert len(ds.stream.shards) > 1
    L = ds.seq_len
    joins = [i for i in range(ds.n_windows) for o in ds.stream.offsets[1:-1] if i * L < o < i * L + L + 1]
    assert joins, "the test corpus should have windows that span two shards"
    ids = np.concatenate([joins, ds.train_window_ids(0, 300), [0, ds.n_windows - 1]])
    expected = np.stack([ds.stream.read(int(i) * L, L + 1) for i in ids]).astype(np.int64)
    assert np.array_equal(ds.rows(ids).numpy(), expected)


def test_rank_micro_batches_equal_the_global_order(prepared_data, monkeypatch):
    monkeypatch.setattr(reader_mod, "ID_BLOCK", 40)  # blocks that end inside steps and across epochs
    ds = WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)
    ref = WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)
    gb = 12
    steps = range(0, ds.n_train // gb + 3)  # past the end of epoch 0
    for world, mb in ((1, 4), (2, 2), (3, 4)):
        per_rank = gb // world
        for step in steps:
            for rank in range(world):
                got = list(micro_batches(ds.rank_rows(step, gb, rank, world), mb))
                for j, (x, y) in enumerate(got):
                    ex, ey = ref.train_batch(step * gb + rank * per_rank + j * mb, mb)
                    assert torch.equal(x, ex) and torch.equal(y, ey)


# ------------------------------------------------------------------------------------ a real run


def test_run_reports_settings_flops_and_memory(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    p = baton_cli("train", "-c", cfg, "--micro-batch", "auto", "--set", "train.steps=3",
                  "--set", "train.precision=auto", "--no-progress", check=True)
    assert "micro_batch auto probes GPU memory; on cpu it uses 4" in p.stderr
    summary = json.loads((tmp_path / "runs" / "test" / "run_summary.json").read_text())
    assert summary["micro_batch"] == 4 and summary["accumulation"] == 2
    assert summary["compile"] is False and summary["precision"] == "fp32"
    assert summary["config"]["train"]["micro_batch"] == 4  # the saved config says what ran
    assert summary["mfu"] is None and summary["peak_tflops_per_device"] is None  # no honest CPU peak
    m = summary["config"]["model"]
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert summary["model_flops_per_token"] == 6 * (2 * per_layer + m["vocab_size"] * 64) + 12 * 2 * 32 * 64
    assert summary["achieved_tflops"] == pytest.approx(
        summary["tokens_per_s"] * summary["model_flops_per_token"] / 1e12, abs=1e-3)
    assert summary["peak_memory_train_bytes"] > 0
    rows = read_metrics(tmp_path / "runs" / "test")
    assert [r["step"] for r in rows] == [1, 2, 3] and not any("mfu" in r for r in rows)


def test_micro_batch_flag_is_validated(make_config, baton_cli):
    p = baton_cli("train", "-c", str(make_config()), "--micro-batch", "most")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == \
        'baton: error: invalid config: train.micro_batch=\'most\' is neither a number nor auto'


@pytest.mark.parametrize("setting, tf32", [("tf32", True), ("ieee", False)])
def test_session_flops_reads_the_new_tf32_switch(monkeypatch, setting, tf32):
    # Once fp32_precision is set (transformers does on torch >= 2.9), reading allow_tf32 raises.
    from baton.runtime.flops import session_flops

    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    try:
        matmul.fp32_precision = setting
        info = session_flops(ModelConfig(), 1024, torch.device("cuda", 0), "fp32", 1)
    finally:
        matmul.fp32_precision = before  # process-wide: the tests after this one see it as it was
    assert info.peak_per_device == (494.7 * 1e12 if tf32 else 66.9 * 1e12) and info.device_name == "NVIDIA H100 80GB HBM3"


def test_the_micro_batch_probe_takes_every_kind_of_out_of_memory_as_does_not_fit(monkeypatch):
    # cuBLAS failing to allocate its workspace is a RuntimeError, not torch's OutOfMemoryError: still no fit.
    from baton.runtime import autotune, cuda
    from baton.runtime.memory import is_oom

    # The GPU's counters, as baton reads them (baton.runtime.cuda); the model runs on the CPU.
    for name in ("empty_cache", "synchronize", "reset_peak"):
        monkeypatch.setattr(cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(cuda, "peak_reserved", lambda *a, **k: 7 * 2**30)
    model = torch.nn.Linear(2, 2)

    def failing(message: str):
        def loss(model, x, y):
            raise RuntimeError(message)
        return loss

    cublas = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    for message in (cublas, "CUDA error: out of memory", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"):
        assert is_oom(RuntimeError(message))
        got = autotune._try_micro_batch(model, failing(message), 8, 16, torch.device("cpu"), 16 * 2**30)
        assert got == (False, 7 * 2**30)
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    with pytest.raises(RuntimeError, match="an unrelated kernel failure"):  # not memory: it rises, not "no fit"
        autotune._try_micro_batch(model, failing("an unrelated kernel failure"), 8, 16, torch.device("cpu"), 2**34)
