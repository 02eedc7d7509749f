"""Test helpers: a small config and utilities to read what a run left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

# A model small enough that a step takes milliseconds on one CPU core; everything else as in tiny.toml.
TEST_TOML = """
[run]
name = "{run_name}"
local_dir = "{runs}"

[model]
n_layers = 2
hidden = 64
n_heads = 4
n_kv_heads = 2
ffn = 128
vocab_size = 512
max_seq_len = 64
attn = "sdpa"

[data]
dir = "{data_dir}"
tokenizer_vocab = 512
seq_len = 32
shuffle_seed = 7
val_windows = 16
shard_tokens = 40000

[[data.sources]]
kind = "stdlib"
max_bytes = 400000

[optim]
lr = 3e-3
warmup_steps = 4
decay_start = 0.8

[train]
steps = 20
micro_batch = 4
global_batch = 8
precision = "fp32"
device = "cpu"
threads = 1
seed = 0
ckpt_every = 0
log_every = 5

[store]
url = "{store}"
keep_last = 2
"""


def write_config(path: Path, data_dir: Path, store: str | Path, runs: Path, run_name: str = "test") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEST_TOML.format(run_name=run_name, runs=runs, data_dir=data_dir, store=store),
                    encoding="utf-8")
    return path


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def store_checkpoint_tensors(store: Path, run: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:
    """(model tensors, optimizer tensors, pointer) of the checkpoint the run's pointer names."""
    pointer = json.loads((store / run / "latest.json").read_text())
    folder = store / run / pointer["path"]
    return load_file(str(folder / "model.safetensors")), load_file(str(folder / "optimizer.safetensors")), pointer


def assert_tensors_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"tensor {k} differs"
