"""Loss and bits per byte of a model over token windows: the run's held-out windows and extra text files.

``window_losses`` is the one forward-and-score the training run's final evaluation uses too, so `baton
eval` on a checkpoint reproduces the number the run reported. Bits per byte divide the summed loss (in
bits) by the UTF-8 bytes the predicted tokens stand for, so models with different tokenizers compare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from ..errors import BatonError

# The logits of one evaluation forward, with their fp32 copy and log-softmax, stay under this many bytes,
# whatever micro-batch training uses: that micro-batch may have been sized by the probe for the fused loss,
# which never holds logits (baton.runtime.fused_ce), and at the reference shape its logits would be tens of GB.
EVAL_LOGITS_BUDGET = 2 * 2**30


def scoring_bytes_per_token(vocab: int, dtype: torch.dtype | None) -> int:
    """Peak bytes per token while ``window_losses`` scores: the logits in the forward's dtype, their fp32 copy
    (none when they are fp32 already) and the fp32 log-softmax inside the cross-entropy."""
    size = torch.empty((), dtype=dtype or torch.float32).element_size()
    return vocab * (size + (4 if size != 4 else 0) + 4)


def eval_micro_batch(micro_batch: int, seq_len: int, vocab: int, dtype: torch.dtype | None,
                     budget: int | None = None) -> int:
    """Windows per evaluation forward: the training micro-batch, or fewer where their logits would pass the
    budget (``EVAL_LOGITS_BUDGET``); at least one window."""
    budget = EVAL_LOGITS_BUDGET if budget is None else budget
    return max(1, min(micro_batch, budget // (seq_len * scoring_bytes_per_token(vocab, dtype))))


def window_losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                  autocast: Callable[[], AbstractContextManager]) -> torch.Tensor:
    """The mean next-token cross-entropy of each window (one value per row of ``x``)."""
    with autocast():
        logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").mean(1)


def token_bytes(tok: Tokenizer) -> np.ndarray:
    """UTF-8 bytes each token id stands for; special tokens (end-of-text) stand for none.

    A byte-level BPE token's characters are one byte each (its alphabet maps the 256 bytes to printable
    characters); any other tokenizer's tokens are measured by decoding them alone.
    """
    from tokenizers.pre_tokenizers import ByteLevel

    byte_level = "ByteLevel" in json.dumps(json.loads(tok.to_str()).get("decoder") or {})
    alphabet = set(ByteLevel.alphabet())
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    out = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    for piece, i in tok.get_vocab().items():
        if piece in special:
            continue
        if byte_level and all(c in alphabet for c in piece):
            out[i] = len(piece)
        else:
            out[i] = len(tok.decode([i], skip_special_tokens=True).encode("utf-8"))
    return out


class Scorer:
    """Sums loss (nats per window mean, and per token) and bytes over batches of (L+1)-token rows."""

    def __init__(self, model: torch.nn.Module, device: torch.device, micro_batch: int,
                 autocast: Callable[[], AbstractContextManager], nbytes: np.ndarray):
        self.model, self.device, self.mb, self.autocast, self.nbytes = model, device, micro_batch, autocast, nbytes

    @torch.no_grad()
    def score(self, batches) -> dict[str, Any]:
        """``batches`` yields (x, y) pairs; the held-out loss is the mean of the windows' mean losses."""
        window_sum, windows, nats, tokens, nbytes = 0.0, 0, 0.0, 0, 0
        for x, y in batches:
            losses = window_losses(self.model, x.to(self.device), y.to(self.device), self.autocast).double().cpu()
            window_sum += float(losses.sum())
            windows += len(losses)
            nats += float((losses * y.shape[1]).sum())
            tokens += y.numel()
            nbytes += int(self.nbytes[y.numpy()].sum())
        if windows == 0:
            return {}
        loss = window_sum / windows
        return {"loss": loss, "ppl": math.exp(min(loss, 700)), "bits_per_byte": nats / math.log(2) / max(nbytes, 1),
                "windows": windows, "tokens": tokens, "bytes": nbytes}

    def chunks(self, rows: torch.Tensor):
        for a in range(0, len(rows), self.mb):
            r = rows[a : a + self.mb]
            yield r[:, :-1], r[:, 1:]


def file_rows(path: Path, tok: Tokenizer, eos_id: int, seq_len: int, field: str) -> torch.Tensor:
    """The (L+1)-token windows of a text or JSONL file, tokenized like the training data (end-of-text after
    each document), cut with stride L like the run's own windows; a file shorter than one window is one row."""
    if not path.is_file():
        raise BatonError(f"eval file {path} not found (fix eval.files or --files)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as bad:
        # Decoded with replacement characters it would be scored all the same, as a number that means nothing.
        raise BatonError(f"eval file {path} is not UTF-8 text (byte {bad.start:,} is not UTF-8): give text or JSONL "
                         "files (fix eval.files or --files)") from None
    if path.suffix in (".jsonl", ".json"):
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(str(json.loads(line)[field]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise BatonError(f"{path} line {n} is not a JSON object with a {field!r} field "
                                 "(set eval.field)") from None
    else:
        docs = [text]
    ids: list[int] = []
    for e in tok.encode_batch(docs, add_special_tokens=False):
        ids += [*e.ids, eos_id]
    t = torch.tensor(ids, dtype=torch.int64)
    if len(t) < 2:
        raise BatonError(f"eval file {path} holds no text to score")
    n = (len(t) - 1) // seq_len
    if n == 0:
        return t[None, :]
    return torch.stack([t[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])
