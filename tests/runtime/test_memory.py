"""The training state is sized before the model is built: a model that cannot fit is refused in one line."""

from __future__ import annotations

import torch

from baton.config import ModelConfig
from baton.model.llama import param_count
from baton.runtime.memory import free_bytes, shortfall, state_bytes

CPU = torch.device("cpu")


def test_state_is_sixteen_bytes_a_parameter_per_replica_and_sharded_under_fsdp():
    n = 1_000_000
    assert state_bytes(n, "ddp", 1) == state_bytes(n, "ddp", 8) == 16 * n
    assert state_bytes(n, "fsdp", 2) == 8 * n
    # Sharding cannot go below the whole fp32 model each rank builds before it is sharded.
    assert state_bytes(n, "fsdp", 8) == state_bytes(n, "fsdp", 64) == 4 * n


def test_free_memory_on_cpu_is_shared_by_the_ranks_of_one_machine(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert free_bytes(CPU, info) == 20_000_000 * 1024
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert free_bytes(CPU, info) == 5_000_000 * 1024
    assert free_bytes(CPU, tmp_path / "absent") is None


def test_a_state_over_the_free_memory_is_refused_with_the_numbers_and_the_fixes():
    n = 100 * 2**20
    assert shortfall(n, "ddp", 1, CPU, free=16 * n) is None
    assert shortfall(n, "ddp", 1, CPU, free=16 * n - 1) == (
        "the model has 104,857,600 parameters: its weights, gradients and AdamW moments alone need 1.6 GiB per "
        "rank, but cpu has 1.6 GiB free per rank (use a smaller model (model.hidden, model.n_layers), "
        "train.parallel=fsdp across several GPUs, or a machine with more memory)")
    assert "train.parallel=fsdp" not in shortfall(n, "fsdp", 2, CPU, free=2**20)


def test_baton_train_refuses_a_model_far_beyond_the_machine_before_building_it(make_config, baton_cli):
    cfg = make_config()
    # 64 layers of width 16384: about 206 billion parameters, 3 TB of training state.
    big = ["--set", "model.n_layers=64", "--set", "model.hidden=16384", "--set", "model.ffn=65536",
           "--set", "model.n_heads=128", "--set", "model.n_kv_heads=8"]
    r = baton_cli("train", "-c", str(cfg), "--no-progress", *big, timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    n = param_count(ModelConfig(n_layers=64, hidden=16384, ffn=65536, n_heads=128, n_kv_heads=8, vocab_size=512,
                                max_seq_len=64, attn="sdpa"))
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("baton: error:")]
    assert lines and lines[0].startswith(f"baton: error: the model has {n:,} parameters: its weights, gradients "
                                         f"and AdamW moments alone need {16 * n / 2**30:.1f} GiB per rank"), r.stderr
