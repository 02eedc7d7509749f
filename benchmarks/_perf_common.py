"""Shared set-up for the performance benchmarks: a prepared corpus, configs, timing statistics.

Every benchmark builds its configs here so that both sides of a comparison train the same model shape
on the same data with the same batch geometry and precision.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Model shapes the benchmarks can use. "tiny" is configs/tiny.toml (the CPU demo), "test" is the test
# suite's model (steps of a few milliseconds, where any per-step overhead shows most).
SHAPES = {
    "tiny": {"n_layers": 4, "hidden": 192, "n_heads": 6, "n_kv_heads": 2, "ffn": 512, "vocab_size": 4096,
             "seq_len": 128, "micro_batch": 16, "global_batch": 32},
    "test": {"n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "ffn": 128, "vocab_size": 4096,
             "seq_len": 32, "micro_batch": 4, "global_batch": 8},
}

TOML = """
[run]
name = "{run}"
local_dir = "{work}/runs"

[model]
n_layers = {n_layers}
hidden = {hidden}
n_heads = {n_heads}
n_kv_heads = {n_kv_heads}
ffn = {ffn}
vocab_size = {vocab_size}
max_seq_len = {max_seq_len}
attn = "sdpa"

[data]
dir = "{data_dir}"
tokenizer_vocab = 4096
seq_len = {seq_len}
shuffle_seed = 1234
val_windows = 16

[[data.sources]]
kind = "stdlib"
max_bytes = 3000000

[optim]
lr = 2e-3
warmup_steps = 10

[train]
steps = {steps}
micro_batch = {micro_batch}
global_batch = {global_batch}
precision = "fp32"
device = "cpu"
seed = 0
threads = {threads}
log_every = 10

[store]
url = "{work}/store"
keep_last = 1
"""


def default_work_dir() -> Path:
    return Path(os.environ.get("BATON_BENCH_DIR", Path(tempfile.gettempdir()) / "baton-bench"))


def write_config(work: Path, run: str, shape: str = "tiny", steps: int = 100_000, threads: int = 0,
                 data_dir: Path | None = None, **over) -> Path:
    params = {**SHAPES[shape], **over}
    params["max_seq_len"] = max(params["seq_len"], 256)
    path = work / f"{run}.toml"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(TOML.format(run=run, work=work, data_dir=data_dir or work / "data", steps=steps,
                                threads=threads, **params), encoding="utf-8")
    return path


def prepare_data(cfg_path: Path) -> None:
    """Tokenize ~3 MB of the standard library once; later calls reuse the folder."""
    import logging

    from baton.config import load_config
    from baton.data.prepare import prepare

    logging.getLogger("baton").setLevel(logging.WARNING)
    prepare(load_config(cfg_path), progress=False)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    """Median and interquartile range, for printing next to a ratio."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 4 else [min(xs), median(xs), max(xs)]
    return f"median {median(xs) * 1e3:.2f} ms (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f}, n={len(xs)})"


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}")
