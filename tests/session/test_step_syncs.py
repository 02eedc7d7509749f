"""A training step reads from the device once: the loss, the gradient norm and the fp16 overflow flag come to the
host together, after the backward pass (baton/loop.py ``train_step``). Each further read would stall a GPU's queue
in the middle of a step, so the count is asserted exactly, for every path of the step: fp32, fp16 with its
GradScaler (fused AdamW and Muon, which the scaler steps differently), the chunked fused loss, accumulation, a
compiled step, and a step whose update is skipped. On a CPU the reads are counted as calls
(tests/support/syncs.py).

transformers' Llama reads one flag of its own in each eager forward (whether the position ids pack several
sequences: ``masking_utils.find_packed_sequence_indices``); a forward compiled whole skips that check
(``train.compile_scope = "model"``: one read a step in all). Compiled by blocks (the default), the model's outer
forward, where that check lives, runs eagerly around the compiled decoder blocks, so it still reads once per
micro-batch, at the forward's start, before any of its kernels are queued.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from baton.config import load_config
from baton.loop import train_step
from baton.runtime import compiled
from baton.session.core import Session
from support.syncs import counted_reads

STEP_READ = "cpu at session/core.py:"
MODEL_READ = "__bool__ at transformers/masking_utils.py:"  # one per eager forward


def reads_of_a_step(cfg) -> tuple[list[str], dict]:
    s = Session(cfg, resume="never", progress=False)
    try:
        train_step(s, 0)  # the first step builds lazy state (optimizer moments, the scaler's scale, the graph)
        with counted_reads() as reads:
            m = train_step(s, 1)
        return reads, m
    finally:
        s.close()


@pytest.mark.parametrize("overrides", [
    [],
    ["train.micro_batch=2"],  # four micro-batches a step
    ["train.precision=fp16"],
    ["train.precision=fp16", "optim.name=muon"],
    ["train.fused_ce=chunked"],
    ["train.precision=bf16", "train.fused_ce=chunked", "optim.name=muon"],
])
def test_a_step_reads_the_device_once(make_config, overrides):
    cfg = load_config(make_config(), ["train.steps=4", *overrides])
    reads, m = reads_of_a_step(cfg)
    forwards = cfg.train.global_batch // cfg.train.micro_batch
    assert [r.split(":")[0] + ":" for r in reads] == [MODEL_READ] * forwards + [STEP_READ], reads
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and not m["skipped"]


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_a_compiled_step_reads_the_device_once(make_config, monkeypatch, scope):
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")  # dynamo and AOTAutograd as on CUDA, no code generation
    cfg = load_config(make_config(), ["train.steps=4", "train.compile=true", "train.fused_ce=chunked",
                                      f"train.compile_scope={scope}"])
    reads, m = reads_of_a_step(cfg)
    forwards = cfg.train.global_batch // cfg.train.micro_batch if scope == "blocks" else 0
    assert [r.split(":")[0] + ":" for r in reads] == [MODEL_READ] * forwards + [STEP_READ], reads


def test_a_skipped_step_reads_the_device_once(make_config):
    """A non-finite loss skips the update on the values read with the loss: no second read decides it."""
    cfg = load_config(make_config(), ["train.steps=4", "train.micro_batch=8"])
    s = Session(cfg, resume="never", progress=False)
    try:
        train_step(s, 0)
        loss = s.parts.micro_loss
        s.parts = dataclasses.replace(s.parts, micro_loss=lambda *a: loss(*a) * math.inf)
        before = [p.detach().clone() for p in s.parts.model.parameters()]
        with counted_reads() as reads:
            m = train_step(s, 1)
        assert m["skipped"] and not math.isfinite(m["loss"])
        assert all(torch.equal(a, b) for a, b in zip(before, s.parts.model.parameters()))
    finally:
        s.close()
    assert [r.split(":")[0] + ":" for r in reads] == [MODEL_READ, STEP_READ], reads


def test_the_values_read_are_the_running_sums_a_device_would_make(make_config):
    """The loss of a step is the fp32 running sum of its micro-batches' losses, from zero, over their number, and
    the gradient norm clip_grad_norm_'s: bit for bit what summing on the device before the read gave."""
    cfg = load_config(make_config(), ["train.steps=4", "train.micro_batch=2"])
    s = Session(cfg, resume="never", progress=False)
    try:
        p = s.parts
        seen = []
        fn = p.micro_loss
        s.parts = dataclasses.replace(p, micro_loss=lambda *a: seen.append(fn(*a)) or seen[-1])
        norms = []
        clip = torch.nn.utils.clip_grad_norm_
        try:
            torch.nn.utils.clip_grad_norm_ = lambda *a, **k: norms.append(clip(*a, **k)) or norms[-1]
            m = train_step(s, 0)
        finally:
            torch.nn.utils.clip_grad_norm_ = clip
    finally:
        s.close()
    running = torch.zeros(())
    for loss in seen:
        running += loss.detach()
    assert len(seen) == 4 and m["loss"] == float(running) / 4 and m["grad_norm"] == float(norms[0])
