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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Model shapes the benchmarks can use. "tiny" is configs/tiny.toml's model (the CPU demo) at 32 samples a step, "test" is the test
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
max_bytes = {max_bytes}

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
                 data_dir: Path | None = None, max_bytes: int = 3_000_000, **over) -> Path:
    params = {**SHAPES[shape], **over}
    params["max_seq_len"] = max(params["seq_len"], 256)
    path = work / f"{run}.toml"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(TOML.format(run=run, work=work, data_dir=data_dir or work / "data", steps=steps,
                                threads=threads, max_bytes=max_bytes, **params), encoding="utf-8")
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


def synthetic_corpus(out: Path, template: Path, n_tokens: int, sparse: bool = False, vocab: int = 4096,
                     seed: int = 0) -> Path:
    """A data folder of ``n_tokens`` synthetic tokens in one shard, with the tokenizer and manifest layout of
    the prepared folder ``template``; throughput does not depend on what the tokens say.

    ``sparse``: the shard is a hole in the file system (zeros that take no disk space), for corpora too large
    to write; its manifest sha256 is then a placeholder, since nothing on the training path rehashes shards.
    Otherwise the tokens are uniform random below ``vocab`` and hashed for real.
    """
    import hashlib
    import json
    import shutil

    import numpy as np

    from baton.data.manifest import corpus_fingerprint
    from baton.data.shards import HEADER, HEADER_SIZE, MAGIC, VERSION, write_shard

    shard = out / "shard-00000.bin"
    manifest = out / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text())["total_tokens"] == n_tokens:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if sparse:
        with open(shard, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, 2, n_tokens, 0))
            f.truncate(HEADER_SIZE + 2 * n_tokens)  # a hole: no blocks are written
        sha = hashlib.sha256(f"sparse zeros {n_tokens}".encode()).hexdigest()
    else:
        tokens = np.random.default_rng(seed).integers(0, vocab, size=n_tokens, dtype=np.uint16)
        sha = write_shard(shard, tokens)
    m = json.loads((template / "manifest.json").read_text())
    m["shards"] = [{**m["shards"][0], "file": shard.name, "sha256": sha, "tokens": n_tokens}]
    m["n_shards"], m["total_tokens"] = 1, n_tokens
    m["fingerprint"] = corpus_fingerprint(m["shards"], m["tokenizer"].get("sha256", ""), m["dtype"])
    for f in template.iterdir():
        if f.is_file() and f.name != "manifest.json" and not f.name.endswith(".bin"):
            shutil.copyfile(f, out / f.name)
    manifest.write_text(json.dumps(m, indent=1))
    return out


@contextmanager
def loss_figure(path: Path, title: str, size: tuple[float, float] = (7, 4.2), legend: int = 8) -> Iterator[Any]:
    """A validation-loss-against-tokens figure (matplotlib, Agg): yields the axes to draw on, then labels the axes,
    titles it, adds the legend and writes it to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        ax.set_xlabel("tokens")
        ax.set_ylabel("validation loss")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=legend)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
