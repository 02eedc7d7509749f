"""Everything baton does on CUDA, proven in one short run on one GPU: correctness and speed in one table.

Each case runs in its own process, forked from a server that imported torch and transformers once
(multiprocessing's forkserver; CUDA is first touched in the case process), so an out-of-memory error or a
crash in one case costs that row, not the table, and no case pays the imports again. The model is the
reference shape of configs/ref-106m.toml (22 layers, hidden 576, 9 heads, 3 KV heads, FFN 1536, vocabulary
49,152, tied) unless a case says otherwise, trained through baton's own Session on synthetic tokens (uniform
below 256, so the loss has somewhere to fall: from ln 49,152 = 10.8 towards ln 256 = 5.5).

  precision   fp16 + GradScaler (the T4 path of configs/ref-106m.toml: its attention, "auto", and its activation
              checkpointing, seq 1024), bf16 autocast, fp32: 100 steps of 8 x 1024 tokens each; every loss
              finite, the loss falling (mean of the last quarter at least 1 nat under the first quarter's),
              the GradScaler live exactly when fp16 (enabled, and its scale is reported).
  fp16_fused  the fused losses under fp16 + GradScaler: the output head's gradient of one micro-batch of
              4 x 1024 tokens, unfused, chunked (baton's, which auto picks under fp16 too) and liger (where
              installed: why baton refuses train.fused_ce = "liger" under fp16), each against fp32, then 40
              steps of each from the same weights (loss traces).
  speed       seq 2048, 65,536 tokens per step, precision auto, micro_batch auto, no compile: base (sdpa),
              flash2 (flash_attention_2 where the package is installed and the GPU is sm80+; refused with
              baton's own one-line error otherwise), ckpt (activation checkpointing), eager, fused_ce
              (baton's chunked linear cross-entropy, eager), liger (liger-kernel's fused linear
              cross-entropy, where installed), muon (Muon for the block matrices, its Newton-Schulz batched):
              tokens/s (median step, each step ending in a device synchronize), MFU
              (baton/runtime/flops.py) and peak memory allocated.
  muon_step   derived: muon's median step time over base's (Muon / AdamW, the same settings otherwise).
  syncs       the device synchronisations of one training step, counted by torch.cuda.set_sync_debug_mode
              ("warn"), with the CUDA defaults but compile (fused_ce auto): baton's own step reads once;
              transformers' Llama adds one per eager forward (its packed-sequence check), which compile
              removes. Each warning's place is reported.
  micro_auto  the probe's choice in the base case (every micro-batch tried, its peak, the one kept) and
              that training at it did not run out of memory.
  eval_probe  the micro-batch the probe picks with the defaults on CUDA (fused_ce auto: the chunked loss,
              whose probe holds no logits of the whole micro-batch), two steps, then the session's evaluation
              at that micro-batch: it must not run out of memory (its windows per forward are bounded by a
              logits budget, baton/evaluate/heldout.py).
  trainer     the same shape (seq 2048, micro-batch 8, 65,536 tokens per step) under transformers.Trainer,
              taking strict turns with baton step by step in one process (benchmarks/bench_vs_hf_trainer.py's
              race): the same 12 steps on both sides, each step's time ending in a device synchronize on both,
              baton's checkpoint after its last timed step; bf16, no compile: tokens/s ratio baton / Trainer.
              trainer_defaults: the same race with baton's CUDA defaults (compiled blocks, the chunked loss)
              against the Trainer's own (no compile): what each gives a user who sets nothing.
  resume      a small model (4 layers, hidden 256, vocabulary 8,192: checkpoints of 60 MB, not 1.27 GB),
              12 steps of 8 x 512 tokens: stop at half the horizon, wipe the local run folder, resume from
              the store, finish; against the same run uninterrupted. resume_det with train.deterministic =
              true: weights, optimizer moments and every loss must be bit-identical. resume_nondet without
              it: every step's loss within a relative 1e-3 of the uninterrupted run's.
  fsdp_fp16   two processes (torchrun, NCCL) running baton's FSDP layout with fp16 + GradScaler
              (benchmarks/fsdp_fp16_ranks.py): an inf in one rank's gradient shard must skip the step on
              both. With one GPU both ranks share it, where NCCL allows that (it refuses duplicate GPUs in a
              communicator, said as a skip); with two GPUs, one each.
  cli         the commands as a person types them, each a process of its own, on configs/tiny.toml's model with
              every device setting at auto (device, precision, attention, compile, fused loss, micro-batch):
              prepare, bench (two cells), preflight --scale real (every stage), train stopped by SIGTERM after
              its first steps, train again on an emptied run folder (it must resume where the first stopped and
              finish), export, eval, sample. Each must exit 0 and the preflight verdict must be PASS.
  attn_kernel model.attn = auto (on Hopper: SDPA's cuDNN kernel first, then flash), timed like base, then one
              step under torch.profiler: the attention kernels that ran, by name, and which backend they are
              (cudnn, flash, efficient, math); on compute capability 9.0+ the check is that cuDNN's or flash's ran.
  compile     base + torch.compile with fused_ce auto: what the defaults give on CUDA (the decoder block
              compiled once, the chunked loss beside it): the MFU target's row. Right after base, so a short
              budget never cuts it; it starts only with 120 s left.
  compile_cache  the start-up of two compiled sessions of one run, each a fresh process on an empty machine
              (its own empty work folder and TORCHINDUCTOR_CACHE_DIR): the first compiles cold and pushes the
              compile cache to the store, the second pulls it beside the checkpoint and compiles warm
              (benchmarks/bench_compile_cache.py's relay); pull, build, compile and first step of each, from
              the ledger, and warm / cold start to first step.

Targets: MFU >= 45 % at seq 2048 on an H100/H200 with the defaults (the compile case); baton / Trainer >= 1.1
(trainer: both eager; trainer_defaults: each with its defaults); Muon's step <= 1.10 x AdamW's; the warm
session's start to first step <= 15 % of the cold one's (compile_cache). The best MFU of any case is
reported beside the defaults'.

The run is sized for 9 minutes on an H100/H200, start-up included, and guarded: ``--budget-seconds``
(default 540) counts from this script's start; a case starts only while the budget holds the time it is
known to need (compile: 120 s, others 15 to 45 s) and is otherwise reported as skipped for the budget, with
the command that runs it alone; a case still running when the budget ends is stopped and reported as cut by
the budget, with its wall time and the same command (not a failure: it measured nothing either way), and one
still running after six times what it needs (two minutes at least) is stopped as hung (a failure). Each row gives its wall time.

``--smoke`` runs the same flow on CPU with a 2-layer model and a few steps (part of the test suite, so the
script cannot rot): rows that need CUDA say "skipped: no CUDA", compile is skipped (minutes of CPU code
generation), nothing is measured. Run from the repository root:

    python benchmarks/gpu_check.py --out gpu_check.json            # on the GPU machine, at most 9 minutes
    python benchmarks/gpu_check.py --cases fp16,base,resume_det    # a subset
    python benchmarks/gpu_check.py --smoke --out /tmp/smoke.json   # the flow on CPU

Requirements on the GPU machine: baton's own (torch with CUDA, transformers), ``accelerate`` for the
Trainer case; optionally flash-attn and liger-kernel (``pip install -e ".[bench,liger]"``). Nothing is
downloaded: the tokens are synthetic. Exit status 1 when a case failed or a correctness check did not
hold; a missed speed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _perf_common import ROOT, default_work_dir, machine, prepare_data, synthetic_corpus, write_config

T0 = time.monotonic()  # the budget counts from here: the start-up is part of it

# Case -> (group, overrides on top of the group's settings), run in this order.
CASES = {
    # What the speed targets rest on first: a budget that runs short cuts the rows that were proven before.
    "base": ("speed", []),
    # What precision, compile and fused_ce "auto" give on CUDA: the compiled blocks and the chunked loss.
    "compile": ("speed", ["train.compile=true", "train.fused_ce=auto"]),
    "trainer": ("trainer", []),
    "trainer_defaults": ("trainer", ["train.compile=true", "train.fused_ce=auto"]),
    "muon": ("speed", ["optim.name=muon"]),  # Muon's Newton-Schulz matmuls: its step time beside base's
    # The attention auto picks, by the kernels' names in a profile.
    "attn_kernel": ("attn_kernel", ["model.attn=auto"]),
    "syncs": ("syncs", ["train.fused_ce=auto"]),
    # Cold, then warm from the run's compile cache: two processes, each on an empty machine. After the two
    # short rows above, so that its less predictable time cannot cut them.
    "compile_cache": ("compile_cache", ["train.fused_ce=auto"]),
    "fused_ce": ("speed", ["train.fused_ce=chunked"]),  # the chunked loss, eager: its memory and tokens/s
    "liger": ("speed", ["train.fused_ce=liger"]),
    # The commands a person types, as subprocesses, with every device setting left at auto.
    "cli": ("cli", []),
    "fp16": ("precision", ["train.precision=fp16"]),
    "bf16": ("precision", ["train.precision=bf16"]),
    "fp32": ("precision", ["train.precision=fp32"]),
    "fp16_fused": ("fused16", ["train.precision=fp16"]),
    "eval_probe": ("eval_probe", ["train.fused_ce=auto"]),
    "resume_det": ("resume", ["train.deterministic=true"]),
    "resume_nondet": ("resume", []),
    "fsdp_fp16": ("fsdp_fp16", []),
    "flash2": ("speed", ["model.attn=flash_attention_2"]),
    "ckpt": ("speed", ["model.grad_ckpt=true"]),
    "eager": ("speed", ["model.attn=eager"]),
}
NEEDS_CUDA = ("flash2", "liger", "syncs")
# Cases whose setting baton itself may refuse on this machine (its one-line error): reported as skipped.
MAY_REFUSE = ("flash2", "liger", "fsdp_fp16")
# Seconds a case is known to need on an H100/H200, start-up included: it does not start with less left.
NEEDS_SECONDS = {"compile": 120.0, "compile_cache": 150.0, "cli": 150.0, "trainer": 45.0, "trainer_defaults": 120.0,
                 "fsdp_fp16": 40.0, "fp16_fused": 40.0,
                 # 100 steps at the reference shape and a session's set-up
                 "fp16": 45.0, "bf16": 45.0, "fp32": 45.0}
NEEDS_SECONDS_DEFAULT = 15.0
# A case still running after this many times what it needs, and at least HANG_MIN_SECONDS, is hung (generous:
# a slow case taken for a hang costs its row, on a machine lent for minutes).
HANG_FACTOR, HANG_MIN_SECONDS = 6, 120.0

# Sizes per group: (GPU, smoke). steps: optimizer steps (precision, resume), measured steps after warmup
# (speed, trainer).
SIZES = {
    "precision": ({"seq_len": 1024, "micro_batch": 4, "global_batch": 8, "steps": 100},
                  {"seq_len": 32, "micro_batch": 2, "global_batch": 4, "steps": 8}),
    "fused16": ({"seq_len": 1024, "micro_batch": 4, "global_batch": 4, "steps": 40},
                {"seq_len": 32, "micro_batch": 2, "global_batch": 2, "steps": 4}),
    "speed": ({"seq_len": 2048, "micro_batch": "auto", "global_batch": 32, "steps": 5, "warmup": 2},
              {"seq_len": 64, "micro_batch": "auto", "global_batch": 8, "steps": 2, "warmup": 1}),
    "syncs": ({"seq_len": 2048, "micro_batch": 8, "global_batch": 32, "steps": 3},
              {"seq_len": 64, "micro_batch": 4, "global_batch": 8, "steps": 3}),
    "eval_probe": ({"seq_len": 2048, "micro_batch": "auto", "global_batch": 32, "steps": 2, "val_windows": 64},
                   {"seq_len": 64, "micro_batch": "auto", "global_batch": 8, "steps": 2, "val_windows": 16}),
    "resume": ({"seq_len": 512, "micro_batch": 4, "global_batch": 8, "steps": 12},
               {"seq_len": 32, "micro_batch": 2, "global_batch": 4, "steps": 4}),
    "trainer": ({"seq_len": 2048, "micro_batch": 8, "global_batch": 32, "steps": 9, "warmup": 3},
                {"seq_len": 64, "micro_batch": 2, "global_batch": 4, "steps": 3, "warmup": 1}),
    "attn_kernel": ({"seq_len": 2048, "micro_batch": "auto", "global_batch": 32, "steps": 3, "warmup": 2},
                    {"seq_len": 64, "micro_batch": "auto", "global_batch": 8, "steps": 1, "warmup": 1}),
    "compile_cache": ({"seq_len": 2048, "micro_batch": 8, "global_batch": 32, "steps": 4},
                      {"seq_len": 32, "micro_batch": 2, "global_batch": 4, "steps": 4}),
    "fsdp_fp16": ({"seq_len": 8, "micro_batch": 2, "global_batch": 2, "steps": 2},
                  {"seq_len": 8, "micro_batch": 2, "global_batch": 2, "steps": 2}),
    # steps: the horizon; a SIGTERM ends the first session after its first logged steps, far from it.
    "cli": ({"seq_len": 256, "micro_batch": "auto", "global_batch": 32, "steps": 600},
            {"seq_len": 32, "micro_batch": "auto", "global_batch": 8, "steps": 60}),
}
# The cli case's model: configs/tiny.toml's on the GPU (seconds to compile), the smoke model on CPU.
CLI_MODEL = {"n_layers": 4, "hidden": 192, "n_heads": 6, "n_kv_heads": 2, "ffn": 512, "vocab_size": 4096}
# The resume cases' model on the GPU: small enough that three sessions with checkpoints take seconds.
RESUME_MODEL = {"n_layers": 4, "hidden": 256, "n_heads": 4, "n_kv_heads": 2, "ffn": 768, "vocab_size": 8192}
SMOKE_MODEL = {"n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "ffn": 128, "vocab_size": 4096}
DATA_VOCAB = 256  # synthetic tokens are uniform below this
FALL_NATS = (1.0, 0.1)  # the loss must fall at least this much (GPU, smoke) from the first to the last quarter
RESUME_RTOL = 1e-3  # without train.deterministic, each step's loss within this relative difference
MFU_TARGET, TRAINER_TARGET, MUON_TARGET, WARM_START_TARGET = 0.45, 1.1, 1.10, 0.15


# ------------------------------------------------------------------------------------- in a case process


def case_config(args, name: str, extra: list[str] = ()):
    from baton.config import load_config

    sets, size, case_dir = case_sets(args, name, extra)
    return load_config(Path(args.work) / "check.toml", sets), size, case_dir


def case_sets(args, name: str, extra: list[str] = ()):
    """The --set overrides of a case on top of check.toml, its sizes and its folder."""
    from baton.config import load_config

    group, overrides = CASES[name]
    size = SIZES[group][1 if args.smoke else 0]
    ref = load_config(ROOT / "configs" / "ref-106m.toml").model
    settings = {"model.attn": "sdpa", "model.grad_ckpt": "false", "train.compile": "false",
                "train.fused_ce": "false", "train.precision": "auto"}
    if group == "precision":  # the T4 path of the reference config
        settings.update({"model.attn": ref.attn, "model.grad_ckpt": str(ref.grad_ckpt).lower()})
    if group == "trainer":  # the Trainer autocasts to bf16 or fp16 only when told which
        settings["train.precision"] = "fp32" if args.smoke else "bf16"
    if group == "resume" and not args.smoke:
        settings.update({f"model.{k}": str(v) for k, v in RESUME_MODEL.items()})
    if "val_windows" in size:
        settings["data.val_windows"] = str(size["val_windows"])
    case_dir = Path(args.work) / "cases" / name
    mb = size["micro_batch"]
    # Timed groups run far from their horizon: no final evaluation or export lands among their steps.
    horizon = 1000 if group in ("speed", "eval_probe", "trainer", "attn_kernel", "compile_cache", "syncs") \
        else size["steps"]
    sets = [f"{k}={v}" for k, v in settings.items()] + [
        f"run.name={name}", f"run.local_dir={case_dir / 'runs'}", f"store.url={case_dir / 'store'}",
        f"data.seq_len={size['seq_len']}", f"model.max_seq_len={max(256, size['seq_len'])}",
        f"train.micro_batch={mb if mb == 'auto' else int(mb)}", f"train.global_batch={size['global_batch']}",
        f"train.steps={horizon}", f"optim.warmup_steps={2 if args.smoke else 10}",
        f"train.device={'cpu' if args.smoke else 'cuda'}", f"train.threads={1 if args.smoke else 0}",
        *overrides, *extra]
    return sets, size, case_dir


def peak_memory(device) -> int | None:
    from baton.runtime import cuda

    return cuda.peak_allocated(device) if device.type == "cuda" else None


def synchronize(device) -> None:
    from baton.runtime import cuda

    if device.type == "cuda":
        cuda.synchronize(device)


def run_precision(args, name: str) -> dict:
    from baton.loop import train_step
    from baton.session.core import Session

    cfg, size, _ = case_config(args, name)
    s = Session(cfg, resume="never", progress=False)
    losses, skipped = [], 0
    try:
        for step in range(size["steps"]):
            m = train_step(s, step)
            s.record(step + 1, m)
            skipped += m["skipped"]
            if not m["skipped"]:
                losses.append(m["loss"])
        scaler = s.parts.scaler
        scaler_on, scale = scaler.is_enabled(), (scaler.get_scale() if scaler.is_enabled() else None)
    finally:
        s.close()
    q = max(1, len(losses) // 4)
    first, last = statistics.mean(losses[:q]), statistics.mean(losses[-q:])
    finite = all(math.isfinite(x) for x in losses) and len(losses) > 0
    fall = FALL_NATS[1 if args.smoke else 0]
    checks = {"finite": finite, "falling": finite and first - last >= fall,
              "scaler_live_exactly_when_fp16": scaler_on == (cfg.train.precision == "fp16")}
    return {"precision": cfg.train.precision, "attn": cfg.model.attn, "grad_ckpt": cfg.model.grad_ckpt,
            "steps": size["steps"], "skipped_steps": skipped, "loss_first_quarter": first,
            "loss_last_quarter": last, "scaler_enabled": scaler_on, "scaler_scale": scale,
            "peak_memory_allocated": peak_memory(s.parts.device), "checks": checks,
            "note": f"loss {first:.2f} -> {last:.2f}, {skipped} skipped, scaler "
                    f"{'on, scale ' + format(scale, 'g') if scaler_on else 'off'}"}


def head_gradient(model, loss_fn, x, y, scale: float):
    """The output head's weight gradient of one micro-batch, through the loss scaled as a GradScaler does."""
    model.zero_grad(set_to_none=True)
    (loss_fn(model, x, y) * scale).backward()
    g = model.lm_head.weight.grad.detach().float() / scale
    model.zero_grad(set_to_none=True)
    return g


def run_fused16(args, name: str) -> dict:
    """fp16 + GradScaler with the unfused loss, the chunked one and liger's (where installed): the head's gradient
    against fp32, loss traces."""
    import dataclasses

    import torch

    from baton.loop import train_step
    from baton.runtime import autotune, fused_ce
    from baton.session.core import Session

    kinds = ["unfused", "chunked"] + (["liger"] if fused_ce.installed() else [])
    traces, rel = {}, {}
    for kind in kinds:
        cfg, size, _ = case_config(args, name, [f"run.name={name}-{kind}"])
        s = Session(cfg, resume="never", progress=False)
        try:
            if kind != "unfused":  # baton refuses liger under fp16; its loss is put in by hand to show why
                loss_fn = autotune.micro_loss_fn(torch.float16, False, fused=kind)
                s.parts = dataclasses.replace(s.parts, micro_loss=loss_fn)
            x, y = next(iter(s.micro_batches(0)))
            model = getattr(s.parts.model, "module", s.parts.model)
            ref = head_gradient(model, autotune.micro_loss_fn(None, False), x, y, 1.0)
            got = head_gradient(model, s.parts.micro_loss, x, y, 2.0**16)  # the GradScaler's initial scale
            rel[kind] = float((got - ref).norm() / ref.norm())
            losses = []
            for step in range(size["steps"]):
                m = train_step(s, step)
                s.record(step + 1, m)
                losses.append(m["loss"])
            traces[kind] = losses
        finally:
            s.close()
    q = max(1, size["steps"] // 4)
    last = {k: statistics.mean(v[-q:]) for k, v in traces.items()}
    out = {"precision": "fp16", "attn": cfg.model.attn, "fused_ce": "/".join(kinds)}
    for k in kinds:
        out.update({f"head_grad_rel_error_{k}": rel[k], f"loss_last_quarter_{k}": last[k], f"loss_trace_{k}": traces[k]})
    # The unfused and the chunked fp16 gradients must match fp32; liger's is what its refusal rests on (reported).
    out["checks"] = {"unfused_fp16_head_grad_within_5pct_of_fp32": rel["unfused"] <= 0.05,
                     "chunked_fp16_head_grad_within_5pct_of_fp32": rel["chunked"] <= 0.05}
    if "liger" in rel:
        out["refusal_supported"] = rel["liger"] > 10 * rel["unfused"]
    out["note"] = ("head grad rel. error vs fp32: " + ", ".join(f"{k} {rel[k]:.1e}" for k in kinds)
                   + f"; loss after {size['steps']} steps " + " / ".join(f"{last[k]:.2f}" for k in kinds))
    return out


def run_speed(args, name: str) -> dict:
    from baton.loop import train_step
    from baton.session.core import Session

    cfg, size, _ = case_config(args, name)
    t0 = time.perf_counter()
    s = Session(cfg, resume="never", progress=False)
    setup = time.perf_counter() - t0
    times, first = [], None
    try:
        for step in range(size["warmup"] + size["steps"]):
            synchronize(s.parts.device)
            t = time.perf_counter()
            m = train_step(s, step)
            synchronize(s.parts.device)  # the optimizer's kernels are queued after the host reads the loss
            dt = time.perf_counter() - t
            first = dt if first is None else first  # compilation happens in the first step
            s.record(step + 1, m)
            if step >= size["warmup"]:
                times.append(dt)
    finally:
        s.close()
    tok_s = cfg.tokens_per_step / statistics.median(times)
    probe = s.parts.perf_notes.get("micro_batch_probe")
    out = {"precision": cfg.train.precision, "attn": cfg.model.attn, "compile": cfg.train.compile,
           "grad_ckpt": cfg.model.grad_ckpt, "fused_ce": cfg.train.fused_ce, "micro_batch": cfg.train.micro_batch,
           "accumulation": s.parts.accum, "micro_batch_probe": probe, "tokens_per_step": cfg.tokens_per_step,
           "steps_measured": len(times), "step_seconds_median": statistics.median(times),
           "first_step_seconds": first, "setup_seconds": setup, "tokens_per_s": tok_s, "mfu": s.parts.flops.mfu(tok_s),
           "device": s.parts.flops.device_name, "peak_tflops": (s.parts.flops.peak_per_device or 0) / 1e12 or None,
           "peak_memory_allocated": peak_memory(s.parts.device)}
    out["note"] = f"first step {first:.1f} s"
    return out


# Attention kernels by name, as a profile lists them: which SDPA backend each belongs to.
ATTN_KERNEL_KINDS = (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "mem_eff", "efficient")),
                     ("math", ("_scaled_dot_product_attention_math",)))


def attention_kernels(names) -> dict[str, list[str]]:
    """The attention kernels among a profile's event names, by backend (a name counts once)."""
    out: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        low = name.lower()
        if not any(w in low for w in ("attention", "attn", "sdpa", "fmha", "flash")):
            continue
        kind = next((k for k, words in ATTN_KERNEL_KINDS if any(w in low for w in words)), None)
        if kind is not None:
            out.setdefault(kind, []).append(name)
    return out


def run_attn_kernel(args, name: str) -> dict:
    """model.attn = auto: tokens/s like base, then one profiled step and the attention kernels it ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from baton.loop import train_step
    from baton.runtime import cuda
    from baton.session.core import Session

    cfg, size, _ = case_config(args, name)
    s = Session(cfg, resume="never", progress=False)
    times = []
    try:
        device = s.parts.device
        order = s.parts.perf_notes.get("sdpa_priority")
        for step in range(size["warmup"] + size["steps"]):
            synchronize(device)
            t = time.perf_counter()
            m = train_step(s, step)
            synchronize(device)
            if step >= size["warmup"]:
                times.append(time.perf_counter() - t)
            s.record(step + 1, m)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            step = size["warmup"] + size["steps"]
            s.record(step + 1, train_step(s, step))
            synchronize(device)
        events = prof.key_averages()
        on_device = [e.key for e in events if device.type == "cuda" and getattr(e, "device_type", None) ==
                     torch.autograd.DeviceType.CUDA]
        kernels = attention_kernels(on_device or [e.key for e in events])
        cap = cuda.capability(device) if device.type == "cuda" else None
    finally:
        s.close()
    tok_s = cfg.tokens_per_step / statistics.median(times)
    ran = sorted(kernels)
    checks = {"attention_kernel_found": bool(kernels)}
    if cap is not None and cap >= (9, 0) and order:
        # Hopper's fast kernels are cuDNN's and flash's (auto asks for cuDNN first; SDPA moves on to flash for a
        # shape cuDNN declines): the check is that one of them ran, and the row says which.
        checks["cudnn_or_flash_attention_ran"] = bool({"cudnn", "flash"} & set(kernels))
    return {"precision": cfg.train.precision, "attn": cfg.model.attn, "compile": cfg.train.compile,
            "micro_batch": cfg.train.micro_batch, "accumulation": s.parts.accum, "tokens_per_s": tok_s,
            "mfu": s.parts.flops.mfu(tok_s), "device": s.parts.flops.device_name, "sdpa_priority": order,
            "attention_kernels": kernels, "auto_settings": s.parts.perf_notes.get("attn"), "checks": checks,
            "peak_memory_allocated": peak_memory(s.parts.device),
            "note": f"attention ran {', '.join(ran) or 'no kernel found'}"
                    + (f" ({'; '.join(k[:60] for v in kernels.values() for k in v[:1])})" if kernels else "")
                    + (f"; order set: {', '.join(order)}" if order else "; torch's own SDPA order")}


def run_compile_cache(args, name: str) -> dict:
    """benchmarks/bench_compile_cache.py's relay on this case's shape: cold, then warm from the store's cache."""
    from bench_compile_cache import relay

    sets, size, case_dir = case_sets(args, name)
    r = relay(case_dir, Path(args.work) / "check.toml", name, sets)
    cold, warm = r["cold"], r["warm"]

    def said(x: dict) -> str:
        return (f"pull {x['pull']:.1f} + build {x['build']:.1f} + first step {x['first_step']:.1f} s (compile "
                f"{x['compile_seconds'] if x['compile_seconds'] is not None else float('nan'):.1f} s)")

    return {"compile": True, "cold": cold, "warm": warm, "ratio": r["ratio"],
            "checks": {"second_session_compiled_warm": warm["compile"] == "warm"},
            "note": f"warm / cold start to first step {r['ratio']:.3f}; cold {said(cold)}; warm {said(warm)}"}


def run_syncs(args, name: str) -> dict:
    """The synchronising CUDA calls of one step (after two that build the lazy state), each with its place."""
    import traceback
    import warnings

    import torch

    from baton.loop import train_step
    from baton.session.core import Session

    cfg, size, _ = case_config(args, name)
    s = Session(cfg, resume="never", progress=False)
    try:
        for step in range(size["steps"] - 1):
            train_step(s, step)
        synchronize(s.parts.device)
        places: list[str] = []
        show = warnings.showwarning

        def seen(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):  # torch's sync debug mode says "synchronizing CUDA operation"
                show(message, category, filename, lineno, file, line)
                return
            frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
            where = frames[-1] if frames else None
            places.append(f"{'/'.join(Path(where.filename).parts[-2:])}:{where.lineno}" if where
                          else f"{filename}:{lineno}")

        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = seen
                train_step(s, size["steps"] - 1)
        finally:
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("default")
    finally:
        s.close()
    own = [w for w in places if "baton/" in w or w.startswith(("session/", "runtime/"))]
    forwards = s.parts.accum
    return {"precision": cfg.train.precision, "attn": cfg.model.attn, "compile": cfg.train.compile,
            "fused_ce": cfg.train.fused_ce, "micro_batch": s.parts.micro_batch, "accumulation": forwards,
            "syncs": len(places), "places": places,
            "checks": {"at_most_one_read_by_baton_and_one_per_forward": len(places) <= 1 + forwards},
            "note": f"{len(places)} synchronisations in one step of {forwards} micro-batches"
                    + (f" ({len(own)} in baton)" if own else "") + ": " + ", ".join(places)[:300]}


def run_eval_probe(args, name: str) -> dict:
    """The probe's micro-batch with the CUDA defaults, two steps, then the session's evaluation at it."""
    from baton.evaluate.heldout import eval_micro_batch
    from baton.loop import train_step
    from baton.runtime import cuda
    from baton.session import finish
    from baton.session.core import Session

    cfg, size, _ = case_config(args, name)
    s = Session(cfg, resume="never", progress=False)
    try:
        for step in range(size["steps"]):
            s.record(step + 1, train_step(s, step))
        val = finish.evaluate(s)
    finally:
        s.close()
    p, st = s.parts, s.state
    eval_mb = eval_micro_batch(p.micro_batch, cfg.data.seq_len, cfg.model.vocab_size, p.autocast_dtype)
    total = cuda.total_memory(p.device) if p.device.type == "cuda" else None
    evaluated = bool(val) and math.isfinite(val.get("val_loss", math.nan))
    return {"precision": cfg.train.precision, "attn": cfg.model.attn, "fused_ce": cfg.train.fused_ce,
            "micro_batch": p.micro_batch, "accumulation": p.accum, "eval_micro_batch": eval_mb,
            "micro_batch_probe": p.perf_notes.get("micro_batch_probe"), "val_windows": val.get("val_windows"),
            "peak_memory_train": st.peak_train, "peak_memory_eval": st.peak_eval, "gpu_memory": total,
            "peak_memory_allocated": st.peak_eval if total else None,
            "checks": {"evaluated_without_running_out_of_memory": evaluated},
            "note": f"trained at micro-batch {p.micro_batch} (fused CE {cfg.train.fused_ce}); evaluated "
                    f"{val.get('val_windows', 0)} windows, {eval_mb} per forward"}


def final_state(store: Path, run: str) -> dict:
    from safetensors.torch import load_file

    pointer = json.loads((store / run / "latest.json").read_text())
    folder = store / run / pointer["path"]
    return {**{f"model.{k}": v for k, v in load_file(str(folder / "model.safetensors")).items()},
            **{f"optim.{k}": v for k, v in load_file(str(folder / "optimizer.safetensors")).items()},
            "step": pointer["step"]}


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["step"])]


def run_resume(args, name: str) -> dict:
    """Uninterrupted, then stopped at half, wiped, resumed from the store and finished; compared."""
    import torch

    from baton.loop import run

    straight, size, case_dir = case_config(args, name, ["run.name=straight"])
    run(straight, resume="never", progress=False)
    halted, *_ = case_config(args, name, ["run.name=halted"])
    run(halted, resume="never", stop_after=size["steps"] // 2, progress=False)
    shutil.rmtree(halted.run_dir)  # the session's machine is gone: only the store remains
    resumed, *_ = case_config(args, name, ["run.name=halted"])  # run() resolves "auto" in place: a fresh config
    run(resumed, resume="auto", progress=False)

    a, b = final_state(case_dir / "store", "straight"), final_state(case_dir / "store", "halted")
    la, lb = losses(straight.run_dir), losses(resumed.run_dir)
    same_tensors = a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
    same_losses = la == lb  # exact float equality: bit-identical traces
    rel = max((abs(x - y) / abs(x) for x, y in zip(la, lb)), default=math.inf) if len(la) == len(lb) else math.inf
    identical = same_tensors and same_losses and a["step"] == size["steps"]
    deterministic = bool(resumed.train.deterministic)
    checks = {"bit_identical": identical} if deterministic else {"loss_within_rtol": rel <= RESUME_RTOL}
    return {"precision": resumed.train.precision, "attn": resumed.model.attn, "deterministic": deterministic,
            "steps": size["steps"], "stopped_at": size["steps"] // 2, "bit_identical": identical,
            "loss_max_rel_diff": rel, "rtol": None if deterministic else RESUME_RTOL, "checks": checks,
            "note": ("bit-identical" if identical else "NOT bit-identical") + f", max rel. loss diff {rel:.1e}"
                    + ("" if deterministic else f" (tolerance {RESUME_RTOL:g})")}


def run_trainer(args, name: str) -> dict:
    from bench_vs_hf_trainer import race

    cfg, size, case_dir = case_config(args, name)
    steps = size["warmup"] + size["steps"]  # asked of both sides alike; baton's horizon lies beyond them
    r = race(cfg, case_dir, steps, size["warmup"], progress=False)
    return {"precision": cfg.train.precision, "attn": cfg.model.attn, "compile": cfg.train.compile,
            "micro_batch": cfg.train.micro_batch, "accumulation": cfg.train.global_batch // cfg.train.micro_batch,
            "steps_each": steps, "steps_measured": size["steps"],
            "tokens_per_s": r["baton_tokens_per_s"], "hf_tokens_per_s": r["hf_tokens_per_s"],
            "ratio": r["ratio"], "pair_ratio_median": r["pair_ratio_median"],
            "note": f"Trainer {r['hf_tokens_per_s']:,.0f} tok/s; baton / Trainer = {r['ratio']:.3f} over "
                    f"{size['steps']} steps each after {size['warmup']}"}


def run_fsdp_fp16(args, name: str) -> dict:
    """benchmarks/fsdp_fp16_ranks.py on two processes: NCCL on the GPU(s), gloo on CPU (smoke)."""
    from baton.errors import ConfigError

    out = Path(args.work) / "cases" / name
    out.mkdir(parents=True, exist_ok=True)
    kind = "cpu" if args.smoke else "cuda"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "benchmarks" / "fsdp_fp16_ranks.py"), str(out), kind]
    # Its own limit: a case stopped by the budget must not leave two ranks holding the GPU behind it.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600 if args.smoke else 90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks: none may hold the GPU after this row
        proc.communicate()
        raise
    p = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if p.returncode:
        raise RuntimeError(f"the 2-process FSDP run exited {p.returncode}: {(p.stderr or p.stdout)[-2000:]}")
    r0, r1 = (json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1))
    if isinstance(r0, dict) and "refused" in r0:
        raise ConfigError(r0["refused"])
    both_skipped = all(r[0]["weights_unchanged"] and r[0]["scale_after"] == r[0]["scale_before"] / 2 for r in (r0, r1))
    clean_stepped = all(not r[1]["weights_unchanged"] and r[1]["scale_after"] == r[1]["scale_before"] for r in (r0, r1))
    checks = {"overflow_on_one_shard_skips_every_rank": both_skipped and r0[0]["own_grads_finite"]
              and not r1[0]["own_grads_finite"], "clean_step_updates": clean_stepped}
    return {"precision": "fp16", "parallel": "fsdp", "ranks": 2, "checks": checks,
            "note": f"{'NCCL' if kind == 'cuda' else 'gloo'}: inf on rank 1's shard -> "
                    f"{'both ranks skipped' if both_skipped else 'NOT skipped on both'}, scale "
                    f"{r0[0]['scale_before']:g} -> {r0[0]['scale_after']:g}"}


CLI_TOML = """
[run]
name = "cli"
local_dir = "{work}/runs"

[model]
n_layers = {n_layers}
hidden = {hidden}
n_heads = {n_heads}
n_kv_heads = {n_kv_heads}
ffn = {ffn}
vocab_size = {vocab_size}
max_seq_len = {max_seq_len}

[data]
dir = "{work}/data"
tokenizer_vocab = 4096
seq_len = {seq_len}
val_windows = 16

[[data.sources]]
kind = "stdlib"
max_bytes = 400000

[optim]
warmup_steps = 10

[train]
steps = {steps}
global_batch = {global_batch}
threads = {threads}
log_every = 1

[store]
url = "{work}/store"
"""


def run_cli(args, name: str) -> dict:
    """The commands as a person types them, each a process of its own, with the device settings (device,
    precision, attention, compile, fused loss, micro-batch) all left at auto: prepare, a bench of two cells,
    preflight at the configured shape (every stage), a training session stopped by SIGTERM, a second one in
    an emptied run folder that resumes from the store and finishes, export, eval and sample."""

    size = SIZES["cli"][1 if args.smoke else 0]
    model = SMOKE_MODEL if args.smoke else CLI_MODEL
    work = Path(args.work) / "cases" / name
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "cli.toml"
    cfg.write_text(CLI_TOML.format(work=work, max_seq_len=max(256, size["seq_len"]), seq_len=size["seq_len"],
                                   steps=size["steps"], global_batch=size["global_batch"], threads=1 if args.smoke else 0,
                                   **model), encoding="utf-8")
    # The checkout's package whether or not it is installed (the commands run from the case's folder).
    pythonpath = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath}
    timings: dict[str, float] = {}

    def baton(label: str, *argv: str) -> subprocess.CompletedProcess:
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "baton.cli", *argv], cwd=work, capture_output=True, text=True,
                           env=env, timeout=900, check=False)
        timings[label] = round(time.perf_counter() - t, 1)
        if p.returncode:
            raise RuntimeError(f"`baton {' '.join(argv)}` exited {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
        return p

    baton("prepare", "prepare", "-c", str(cfg))
    micros = "1,2"
    baton("bench", "bench", "-c", str(cfg), "--attn", "sdpa", "--seq", str(size["seq_len"]), "--micro", micros,
          "--grad-ckpt", "off", "--warmup", "1", "--steps", "2", "--out", str(work / "bench"))
    cells = json.loads((work / "bench" / "bench.json").read_text())["cells"]
    baton("preflight", "preflight", "-c", str(cfg), "--scale", "real", "--leg-steps", "2", "--out", str(work / "pf"))
    pf = json.loads((work / "pf" / "preflight.json").read_text())

    # A session ended the way a platform ends one: SIGTERM once it has logged its first steps.
    t = time.perf_counter()
    metrics = work / "runs" / "cli" / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "train", "-c", str(cfg)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (metrics.exists() and metrics.read_text().strip()):
        if proc.poll() is not None or time.perf_counter() - t > 600:
            proc.kill()
            raise RuntimeError(f"the first session logged no step: {proc.communicate()[1][-1500:]}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err1 = proc.communicate(timeout=600)
    timings["train (SIGTERM)"] = round(time.perf_counter() - t, 1)
    if proc.returncode:
        raise RuntimeError(f"the SIGTERM'd session exited {proc.returncode}: {err1[-1500:]}")
    stopped = json.loads((work / "store" / "cli" / "latest.json").read_text())["step"]
    shutil.rmtree(work / "runs")  # the next session's machine starts empty
    second = baton("train (resume)", "train", "-c", str(cfg))
    final = json.loads((work / "store" / "cli" / "latest.json").read_text())
    baton("export", "export", "-c", str(cfg), "--out", str(work / "exported"))
    baton("eval", "eval", "-c", str(cfg))
    sample = baton("sample", "sample", "--from", str(work / "exported"), "--prompt", "def ", "--max-new-tokens", "16")
    summary = json.loads((work / "runs" / "cli" / "run_summary.json").read_text())
    checks = {"bench_two_cells_ok": [c["status"] for c in cells] == ["ok", "ok"],
              "preflight_pass": pf["verdict"] == "PASS",
              "sigterm_stopped_mid_run": 0 < stopped < size["steps"],
              "resumed_where_it_stopped": f"resumed at step {stopped}" in second.stdout + second.stderr,
              "run_complete": final["step"] == size["steps"] and bool(final.get("complete")),
              "sample_printed": bool(sample.stdout.strip())}
    return {"checks": checks, "commands_seconds": timings, "stopped_at": stopped, "preflight": pf["verdict"],
            "auto_settings": summary.get("auto_settings"),
            "note": f"preflight {pf['verdict']}; SIGTERM at step {stopped}, resumed to {final['step']}; "
                    + ", ".join(f"{k} {v:g} s" for k, v in timings.items())}


RUNNERS = {"precision": run_precision, "fused16": run_fused16, "speed": run_speed, "eval_probe": run_eval_probe,
           "resume": run_resume, "trainer": run_trainer, "fsdp_fp16": run_fsdp_fp16, "cli": run_cli,
           "attn_kernel": run_attn_kernel, "compile_cache": run_compile_cache, "syncs": run_syncs}


def case_main(args) -> None:
    logging.getLogger("baton").setLevel(logging.WARNING)
    shutil.rmtree(Path(args.work) / "cases" / args.case, ignore_errors=True)
    from baton.errors import ConfigError

    try:
        result = RUNNERS[CASES[args.case][0]](args, args.case)
    except ConfigError as e:
        if args.case not in MAY_REFUSE:
            raise
        result = {"refused": str(e)}
    print("RESULT " + json.dumps(result), flush=True)


def forked_case(argv: list[str], out: str, err: str) -> None:
    """A case process forked from the pre-imported server: this script's own entry point with its output in
    files, as a subprocess's would be. The server never touches CUDA, so each case initialises its own."""
    os.setsid()  # its own process group: a timeout stops what it started too (a relay's sessions, torchrun's ranks)
    os.chdir(ROOT)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [__file__, *argv]
    main()


# What every case imports, loaded once by the forkserver that --smoke forks its case processes from.
FORK_PRELOAD = ["__main__", "torch", "transformers.models.llama.modeling_llama", "baton.loop", "baton.session.core"]


def run_forked(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run's result for ``argv`` run by forked_case: its exit status and its output."""
    ctx = multiprocessing.get_context("forkserver")
    with tempfile.TemporaryDirectory() as d:
        out, err = os.path.join(d, "out"), os.path.join(d, "err")
        proc = ctx.Process(target=forked_case, args=(argv, out, err))
        proc.start()
        try:
            proc.join(timeout)
        finally:  # a timeout, or this script stopped (Ctrl-C): the case's whole group goes, GPU memory with it
            if proc.exitcode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.kill()
                proc.join()
                timed_out = True
            else:
                timed_out = False
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout)
        with open(out, errors="replace") as fo, open(err, errors="replace") as fe:
            return subprocess.CompletedProcess(argv, proc.exitcode, fo.read(), fe.read())


# ----------------------------------------------------------------------------------------- the parent


def skip_reason(name: str, smoke: bool) -> str | None:
    """Why a case cannot run here, decided before its process starts (None: it runs)."""
    if smoke and name in NEEDS_CUDA:
        return "no CUDA"
    if smoke and name in ("compile", "compile_cache", "trainer_defaults"):
        return "smoke (CPU code generation takes minutes; measured on the GPU)"
    if CASES[name][0] == "trainer" and importlib.util.find_spec("accelerate") is None:
        return 'accelerate not installed (pip install -e ".[bench]")'
    return None  # flash2 and liger are decided by baton itself in the case's process (MAY_REFUSE)


def run_case(args, name: str, deadline: float) -> dict:
    group = CASES[name][0]
    row = {"case": name, "group": group}
    why = skip_reason(name, args.smoke)
    if why:
        return {**row, "status": f"skipped: {why}", "wall_seconds": 0.0}
    left = deadline - time.monotonic()
    need = 5.0 if args.smoke else NEEDS_SECONDS.get(name, NEEDS_SECONDS_DEFAULT)
    if left < need:
        return {**row, "status": f"skipped: budget: {left:.0f} of {args.budget_seconds:g} s left, it needs {need:g} "
                                 f"(run it alone: --cases {name})", "wall_seconds": 0.0}
    argv = ["--case", name, "--work", str(args.work)] + (["--smoke"] if args.smoke else [])
    # A case far over what it is known to need is hung: stopped and failed, so it neither takes the rest of the
    # budget nor passes for a case the budget cut. (On CPU, smoke times vary too much to tell.)
    hang = None if args.smoke else max(HANG_MIN_SECONDS, HANG_FACTOR * need)
    t0 = time.monotonic()
    try:
        p = run_forked(argv, left if hang is None else min(left, hang))
    except subprocess.TimeoutExpired:
        wall = time.monotonic() - t0
        if hang is not None and hang <= left:
            return {**row, "status": "FAILED", "wall_seconds": wall,
                    "note": f"hung: no result after {wall:.0f} s, where it needs about {need:g} s"}
        # Over its estimate when the budget ran out: what it would measure is unknown, not failed.
        return {**row, "status": f"skipped: cut by the budget of {args.budget_seconds:g} s after {wall:.0f} s, over "
                                 f"the {need:g} s it was expected to need (run it alone: --cases {name})",
                "wall_seconds": wall}
    wall = time.monotonic() - t0
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {**row, "status": "FAILED", "wall_seconds": wall, "error": "\n".join(tail[-30:]),
                "note": tail[-1][:200] if tail else f"exit {p.returncode}"}
    r = json.loads(lines[-1][len("RESULT "):])
    if "refused" in r:
        return {**row, "status": f"skipped: baton refuses it here: {r['refused']}", "wall_seconds": wall}
    ok = all(r.get("checks", {}).values())
    return {**row, "status": "ok" if ok else "CHECK FAILED", "wall_seconds": wall, **r}


def derived(rows: dict[str, dict], smoke: bool) -> list[dict]:
    """Rows that read another case's result: the micro-batch probe (from base) and Muon's step against AdamW's
    (muon over base)."""
    out = []
    base = rows.get("base", {})
    if base.get("status") == "ok":
        probe = base.get("micro_batch_probe")
        tried = ", ".join(f"{t['micro_batch']}{'' if t['fits'] else ' no'}" for t in probe) if probe else \
            "no probe on CPU (auto = 4 or the largest candidate below)"
        out.append({"case": "micro_auto", "group": "micro_auto", "status": "ok", "wall_seconds": 0.0,
                    "micro_batch": base["micro_batch"], "accumulation": base["accumulation"],
                    "note": f"probe: {tried}; trained {base['steps_measured'] + SIZES['speed'][smoke]['warmup']} "
                            f"steps at {base['micro_batch']} without running out of memory"})
    else:
        out.append({"case": "micro_auto", "group": "micro_auto", "wall_seconds": 0.0,
                    "status": f"skipped: base {base.get('status', 'not run')}"})
    base, muon = rows.get("base", {}), rows.get("muon", {})
    if base.get("status") == "ok" and muon.get("status") == "ok":
        ratio = muon["step_seconds_median"] / base["step_seconds_median"]
        out.append({"case": "muon_step", "group": "muon_step", "status": "ok", "wall_seconds": 0.0, "ratio": ratio,
                    "micro_batch": muon["micro_batch"], "accumulation": muon["accumulation"],
                    "note": f"Muon / AdamW step time {ratio:.3f} ({muon['step_seconds_median'] * 1e3:.0f} ms / "
                            f"{base['step_seconds_median'] * 1e3:.0f} ms), target <= {MUON_TARGET}"})
    else:
        out.append({"case": "muon_step", "group": "muon_step", "wall_seconds": 0.0,
                    "status": f"skipped: base {base.get('status', 'not run')}, muon {muon.get('status', 'not run')}"})
    return out


def fmt(x, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = ("| case | status | wall s | precision | attn | compile | act. ckpt | fused CE | micro x accum | "
            "tok/s | MFU | peak memory | result |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        mem = r.get("peak_memory_allocated")
        mxa = f"{r['micro_batch']} x {r['accumulation']}" if "accumulation" in r else ""
        lines.append("| " + " | ".join([
            r["case"], r["status"], f"{r['wall_seconds']:.0f}", str(r.get("precision", "")), str(r.get("attn", "")),
            str(r.get("compile", "")), str(r.get("grad_ckpt", "")), str(r.get("fused_ce", "")), mxa,
            fmt(r.get("tokens_per_s"), ",.0f", ""), fmt(r.get("mfu"), ".1%", "n/a" if "tokens_per_s" in r else ""),
            f"{mem / 2**30:.1f} GiB" if mem else "", r.get("note", "").replace("|", "/")]) + " |")
    return "\n".join(lines)


def verdicts(rows: dict[str, dict], smoke: bool, derived_rows: list[dict] = ()) -> dict:
    speed = [r for r in rows.values() if r["group"] == "speed" and r["status"] == "ok" and r.get("mfu") is not None]
    best = max(speed, key=lambda r: r["mfu"], default=None)
    defaults = rows.get("compile", {})
    defaults_mfu = defaults.get("mfu") if defaults.get("status") == "ok" else None

    def ratio(name: str) -> float | None:
        r = rows.get(name, {})
        return r.get("ratio") if r.get("status") == "ok" else None

    trainer, trainer_defaults, warm = ratio("trainer"), ratio("trainer_defaults"), ratio("compile_cache")
    muon = next((r for r in derived_rows if r["case"] == "muon_step" and r["status"] == "ok"), None)
    v = {"best_mfu": best["mfu"] if best else None, "best_mfu_case": best["case"] if best else None,
         "defaults_mfu": defaults_mfu, "mfu_target": MFU_TARGET,
         "mfu_target_met": defaults_mfu >= MFU_TARGET if defaults_mfu is not None else None,
         "trainer_ratio": trainer, "trainer_defaults_ratio": trainer_defaults, "trainer_target": TRAINER_TARGET,
         "trainer_target_met": trainer >= TRAINER_TARGET if trainer is not None else None,
         "trainer_defaults_target_met": trainer_defaults >= TRAINER_TARGET if trainer_defaults is not None else None,
         "muon_step_ratio": muon["ratio"] if muon else None, "muon_target": MUON_TARGET,
         "muon_target_met": muon["ratio"] <= MUON_TARGET if muon else None,
         "warm_start_ratio": warm, "warm_start_target": WARM_START_TARGET,
         "warm_start_target_met": warm <= WARM_START_TARGET if warm is not None else None}
    if smoke:  # nothing is measured on CPU: the targets are for the GPU
        for k in [k for k in v if k.endswith("_met")]:
            v[k] = None
    return v


def parent_main(args) -> int:
    t_start = T0
    deadline = t_start + args.budget_seconds
    work = Path(args.work)
    names = args.cases.split(",") if args.cases else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)} (known: {', '.join(CASES)})")
    template = write_config(work, "template", shape="test", data_dir=work / "template-data", max_bytes=120_000)
    prepare_data(template)  # a real tokenizer and manifest layout; the tokens below are synthetic
    need = max(s[1 if args.smoke else 0]["global_batch"] * s[1 if args.smoke else 0]["seq_len"] *
               (s[1 if args.smoke else 0]["steps"] + s[1 if args.smoke else 0].get("warmup", 0) + 2)
               for s in SIZES.values())
    data = synthetic_corpus(work / "data", work / "template-data", 2 * need + 65_536, vocab=DATA_VOCAB)
    from baton.config import load_config

    ref = load_config(ROOT / "configs" / "ref-106m.toml").model
    model = SMOKE_MODEL if args.smoke else {k: getattr(ref, k) for k in SMOKE_MODEL}
    write_config(work, "check", shape="test", data_dir=data, **model)
    print(f"# gpu_check{' --smoke' if args.smoke else ''}: {machine()}", flush=True)

    rows: dict[str, dict] = {}
    # The server must never initialise CUDA, or no case forked from it can: should an import ask whether a
    # GPU is there, NVML answers instead of the CUDA runtime.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    multiprocessing.set_forkserver_preload(FORK_PRELOAD)

    out = Path(args.out) if args.out else Path(os.environ.get("OUT") or work) / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict] = {}
    lock = threading.Lock()

    def one(name: str) -> dict:
        r = run_case(args, name, deadline)
        figures = ", ".join(f"{k} {fmt(r.get(k), spec)}" for k, spec in
                            (("tokens_per_s", ",.0f"), ("mfu", ".1%"), ("ratio", ".3f")) if r.get(k) is not None)
        print(f"{name}: {r['status']} ({r['wall_seconds']:.0f} s) {figures + '; ' if figures else ''}"
              f"{r.get('note', '')}", flush=True)
        with lock:  # each row on disk as it ends: a run cut short keeps what it measured
            done[name] = r
            out.write_text(json.dumps({"machine": machine(), "smoke": args.smoke, "partial": True,
                                       "cases": list(done.values())}, indent=1, default=str))
        return r

    # One GPU: one case at a time. On CPU (smoke) the cases may share the cores.
    with ThreadPoolExecutor(max_workers=args.jobs if args.smoke else 1) as pool:
        for name, r in zip(names, pool.map(one, names)):
            rows[name] = r
    more = derived(rows, args.smoke)
    all_rows = list(rows.values()) + more
    wall = time.monotonic() - t_start
    v = verdicts(rows, args.smoke, more)
    device = next((r["device"] for r in rows.values() if r.get("device")), "cpu" if args.smoke else "cuda")
    print(f"\n## gpu_check: {device}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, total {wall:.0f} s\n")
    print(table(all_rows))
    def said(met: bool | None) -> str:
        return "n/a" if met is None else "OK" if met else "MISSED"

    print(f"\nMFU with the defaults {fmt(v['defaults_mfu'], '.1%')} (compile), target >= {MFU_TARGET:.0%}: "
          f"{said(v['mfu_target_met'])}; best of any case {fmt(v['best_mfu'], '.1%')} ({v['best_mfu_case'] or 'none'})")
    print(f"baton / Trainer tokens/s, both eager {fmt(v['trainer_ratio'], '.3f')}: {said(v['trainer_target_met'])}; "
          f"each with its defaults {fmt(v['trainer_defaults_ratio'], '.3f')}: "
          f"{said(v['trainer_defaults_target_met'])} (target >= {TRAINER_TARGET})")
    print(f"Muon / AdamW step time {fmt(v['muon_step_ratio'], '.3f')}, target <= {MUON_TARGET}: "
          f"{said(v['muon_target_met'])}")
    print(f"warm / cold start to first step {fmt(v['warm_start_ratio'], '.3f')}, target <= {WARM_START_TARGET}: "
          f"{said(v['warm_start_target_met'])}")
    failed = [r["case"] for r in all_rows if r["status"] in ("FAILED", "CHECK FAILED")]
    out.write_text(json.dumps({"machine": machine(), "device": device, "smoke": args.smoke,
                               "command": " ".join([Path(sys.executable).name, *sys.argv]),
                               "budget_seconds": args.budget_seconds, "wall_seconds": wall, "verdicts": v,
                               "failed": failed, "cases": all_rows}, indent=1))
    print(f"wrote {out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny shape on CPU: checks the flow, measures nothing")
    ap.add_argument("--out", help="JSON results file (default $OUT/gpu_check.json, else <work>/gpu_check.json)")
    ap.add_argument("--cases", help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--budget-seconds", type=float, default=None,
                    help="seconds from the start: no case starts without the time it needs, a running case is "
                         "stopped at the end (default 540, smoke 600)")
    ap.add_argument("--jobs", type=int, default=2, help="smoke only: cases run side by side on the CPU")
    ap.add_argument("--work", default=None, help="working folder (default $BATON_BENCH_DIR/gpu-check)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work = Path(args.work or default_work_dir() / ("gpu-check-smoke" if args.smoke else "gpu-check")).resolve()
    if args.budget_seconds is None:
        args.budget_seconds = 600.0 if args.smoke else 540.0
    if args.case:
        case_main(args)
        return
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA GPU is visible (run with --smoke to check the flow on CPU)")
    sys.exit(parent_main(args))


if __name__ == "__main__":
    main()
