"""Evaluation holds the logits of a bounded number of windows per forward, whatever micro-batch training uses.

The training micro-batch may come from the probe run with the fused loss, which never holds logits; scored at
that micro-batch, evaluation would build the logits (and their fp32 copy and log-softmax) of all its windows.
"""

from __future__ import annotations

import torch

from baton.config import load_config
from baton.evaluate import heldout
from baton.evaluate.heldout import EVAL_LOGITS_BUDGET, eval_micro_batch, scoring_bytes_per_token
from baton.session import finish
from baton.session.core import Session


def test_the_chosen_eval_micro_batch_keeps_the_reference_logits_under_the_budget():
    vocab, seq = 49_152, 1024
    assert scoring_bytes_per_token(vocab, torch.float16) == vocab * (2 + 4 + 4)  # fp16 logits, fp32 copy, log-softmax
    assert scoring_bytes_per_token(vocab, torch.bfloat16) == vocab * 10
    assert scoring_bytes_per_token(vocab, None) == vocab * (4 + 4)  # fp32 logits are their own fp32 copy
    # A fused-loss probe on a 16 GB GPU can pick 32 windows: 16.1 GB of logits. Evaluation takes 4 (2.0 GB).
    assert 32 * seq * scoring_bytes_per_token(vocab, torch.float16) == 16_106_127_360
    mb = eval_micro_batch(32, seq, vocab, torch.float16)
    assert mb == 4 and mb * seq * scoring_bytes_per_token(vocab, torch.float16) <= EVAL_LOGITS_BUDGET == 2 * 2**30
    assert eval_micro_batch(2, seq, vocab, torch.float16) == 2  # never more than training's micro-batch
    assert eval_micro_batch(32, 8192, 128_256, torch.float16) == 1  # at least one window


def test_the_sessions_evaluation_forwards_stay_under_the_budget(monkeypatch, make_config):
    cfg = load_config(make_config(), ["train.micro_batch=4"])
    s = Session(cfg, resume="never", progress=False)
    try:
        per_window = cfg.data.seq_len * scoring_bytes_per_token(cfg.model.vocab_size, None)
        full = finish.evaluate(s)
        rows: list[int] = []
        hook = s.parts.model.register_forward_hook(lambda m, args, kwargs, out: rows.append(kwargs["input_ids"].shape[0]),
                                                   with_kwargs=True)
        monkeypatch.setattr(heldout, "EVAL_LOGITS_BUDGET", 2 * per_window)  # room for the logits of 2 windows
        try:
            halved = finish.evaluate(s)
        finally:
            hook.remove()
    finally:
        s.close()
    assert s.parts.micro_batch == 4 and rows and max(rows) == 2
    assert sum(rows) == full["val_windows"] == halved["val_windows"]
    assert halved["val_loss"] == full["val_loss"]  # the same windows scored, in smaller forwards
