"""The tokenizer (load, train, end-of-text) and batch encoding, in this process or a pool of processes.

Encoding a batch returns one flat token array with the end-of-text id after every kept document, the
token count of every document (end-of-text included) and which documents decontamination dropped. The
result depends only on the documents, never on where it was computed, so any worker count writes the
same bytes.

Parallelism: ``encode_batch`` already runs on all cores in Rust, but turning its output into arrays is
Python work that holds one core. A pool of single-threaded worker processes does that part in parallel
too; benchmarks/bench_prepare.py measures both on the machine at hand.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..errors import DataError
from .decontam import Decontaminator

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_TRAIN_BYTES = 256 << 20  # enough text for a good BPE; training on more only costs time


def find_eos(tok: Tokenizer) -> tuple[str, int]:
    for name in EOS_CANDIDATES:
        tid = tok.token_to_id(name)
        if tid is not None:
            return name, tid
    raise DataError(
        f"the tokenizer has no end-of-text token (looked for {', '.join(EOS_CANDIDATES)}); "
        "add one as a special token"
    )


def tokenizer_path(spec: str) -> Path:
    if spec.startswith("hf://"):  # a Hub repository's tokenizer.json, fetched at the commit its revision names
        from .hub import hub_tokenizer

        return hub_tokenizer(spec)[0]
    p = Path(spec)
    return p / TOKENIZER_FILE if p.is_dir() else p


def load_tokenizer(spec: str | Path) -> Tokenizer:
    p = tokenizer_path(str(spec))
    if not p.is_file():
        raise DataError(
            f"tokenizer {str(spec)!r} not found (give a tokenizer.json, a folder holding one, or \"\" to train one)"
        )
    from ..reads import reading

    # tokenizers raises a bare Exception on malformed files
    with reading(p, "tokenizer", "give a tokenizer.json saved by the tokenizers library, or \"\" to train one",
                 also=(Exception,)):
        return Tokenizer.from_file(str(p))


def data_tokenizer(data_dir: str | Path) -> Tokenizer:
    return load_tokenizer(Path(data_dir) / TOKENIZER_FILE)


def train_tokenizer(texts: Iterator[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE trained on the first TOKENIZER_TRAIN_BYTES of ``texts`` (deterministic)."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def capped() -> Iterator[str]:
        budget = TOKENIZER_TRAIN_BYTES
        for text in texts:
            yield text
            budget -= len(text)
            if budget <= 0:
                return

    tok.train_from_iterator(capped(), trainer=trainer)
    return tok


# ------------------------------------------------------------------------------------------- encoding

_STATE: dict = {}


def _init(tok_file: str, eos_id: int, dtype: str, decon: tuple[list[np.ndarray], int] | None,
          single_thread: bool, parent: int | None = None) -> None:
    if single_thread:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core: no nested thread pools
    tok = Tokenizer.from_file(tok_file)
    _STATE.update(tok=tok, eos=eos_id, dtype=np.dtype(dtype),
                  encode=getattr(tok, "encode_batch_fast", tok.encode_batch),
                  decon=Decontaminator(*decon) if decon else None)
    if parent is not None:
        # A worker whose parent was killed (SIGKILL gives it no chance to clean up) must not linger.
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()


def _encode(docs: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = _STATE
    dtype, decon = s["dtype"], s["decon"]
    encs = s["encode"](docs, add_special_tokens=False)
    lens = np.empty(len(docs), dtype=np.int64)
    dropped = np.zeros(len(docs), dtype=bool)
    pieces: list[np.ndarray] = []
    eos = np.array([s["eos"]], dtype=dtype)
    for k, e in enumerate(encs):
        ids = np.array(e.ids, dtype=dtype)
        lens[k] = ids.size + 1
        if decon is not None and decon.hit(ids):
            dropped[k] = True
            continue
        pieces += (ids, eos)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    return tokens, lens, dropped


class Encoder:
    """Encodes batches in order; at most ``depth`` batches are in flight, so memory stays bounded."""

    def __init__(self, tok_file: Path, eos_id: int, dtype: np.dtype, decon: Decontaminator | None, workers: int):
        payload = (decon.texts, decon.n) if decon else None
        self.workers = workers
        if workers <= 1:
            _init(str(tok_file), eos_id, dtype.name, payload, single_thread=False)
            # One thread: encode_batch releases the GIL, so reading the next batch overlaps encoding.
            self.pool: ThreadPoolExecutor | ProcessPoolExecutor = ThreadPoolExecutor(1)
            self.depth = 2
        else:
            import multiprocessing as mp

            self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init,
                                            initargs=(str(tok_file), eos_id, dtype.name, payload, True, os.getpid()))
            self.depth = 2 * workers

    def submit(self, docs: list[str]) -> Future:
        return self.pool.submit(_encode, docs)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


POOL_FROM_BYTES = 16 << 20  # below this, starting worker processes costs more than they save


def auto_workers(setting: int, est_bytes: int) -> int:
    """0 means: one process per core for a large corpus, this process alone for a small one."""
    if setting > 0:
        return setting
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores if est_bytes >= POOL_FROM_BYTES else 1
