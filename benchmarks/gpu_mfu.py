"""Figure 4: model FLOPs utilisation of the reference shape at seq 2048 on one GPU (target >= 40 % on an
H100/H200-class GPU), with the GPU options measured against each other in one go.

The reference shape (configs/ref-106m.toml: 22 layers, hidden 576, 9 heads, 3 KV heads, FFN 1536, vocab
49,152, tied) trains at seq 2048 with 128 samples (262,144 tokens) per optimizer step, as the reference
run's tokens per step, through baton's own Session and ``train_step``: ``precision = auto`` (bf16 on
Ampere and newer, fp16 + GradScaler before), fused AdamW, ``micro_batch = auto`` (the largest micro-batch
that fits, probed at start, accumulation making up the 128 samples). Each variant runs in its own process:

  base       sdpa attention, no torch.compile, no activation checkpointing
  compile    base + torch.compile of model and loss          -> compile speed-up = base time / this
  ckpt       base + activation checkpointing                  -> its cost = this time / base
  flash2     flash_attention_2 instead of sdpa (only if the flash-attn package imports)
  eager      eager attention (what configs/ref-106m.toml uses on Turing)

Per variant it prints and saves: micro-batch and accumulation chosen, steady tokens/s (median over the
measured steps), MFU = tokens/s x FLOPs per token / peak (baton/runtime/flops.py), peak memory allocated.

Requirements on the GPU machine: torch with CUDA, transformers >= 5, safetensors, tokenizers, numpy, tqdm
(no network: nothing is downloaded; the corpus is synthetic and baton is imported from this checkout).
Run from the repository root:

    python benchmarks/gpu_mfu.py                    # about 6 minutes on an H100
    python benchmarks/gpu_mfu.py --variants base,compile --steps 8
    python benchmarks/gpu_mfu.py --smoke            # the same flow on CPU with a tiny shape (no figures)

Results go to stdout (a Markdown table for benchmarks/RESULTS.md) and to ``$OUT/gpu_mfu.json`` when
``$OUT`` is set, else to ``<work>/gpu_mfu.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _perf_common import ROOT, default_work_dir, machine, prepare_data, synthetic_corpus, write_config

REF = {"n_layers": 22, "hidden": 576, "n_heads": 9, "n_kv_heads": 3, "ffn": 1536, "vocab_size": 49152,
       "seq_len": 2048, "micro_batch": 1, "global_batch": 128}
SMOKE = {"n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "ffn": 128, "vocab_size": 4096,
         "seq_len": 64, "micro_batch": 1, "global_batch": 8}
VARIANTS = {
    "base": [],
    "compile": ["train.compile=true"],
    "ckpt": ["model.grad_ckpt=true"],
    "flash2": ["model.attn=flash_attention_2"],
    "eager": ["model.attn=eager"],
}


def worker(args) -> dict:
    """One variant in this process: build the session, warm up, time steady steps."""
    import torch

    from baton.config import load_config
    from baton.session.core import Session
    from baton.train import train_step

    logging.getLogger("baton").setLevel(logging.INFO)
    cfg = load_config(args.config, [f"run.name=mfu-{args.worker}", *VARIANTS[args.worker],
                                    "train.micro_batch=auto", "train.precision=auto"])
    t0 = time.perf_counter()
    s = Session(cfg, resume="never", progress=False)
    setup = time.perf_counter() - t0
    times, first = [], None
    try:
        for step in range(args.warmup + args.steps):
            t = time.perf_counter()
            m = train_step(s, step)  # ends in a host sync (loss, gradient norm): the wall time is the step's
            dt = time.perf_counter() - t
            if first is None:
                first = dt  # includes compilation when compiling
            s.record(step + 1, m)
            if step >= args.warmup:
                times.append(dt)
            if time.perf_counter() - t0 > args.max_seconds:
                break
    finally:
        s.close()
    if not times:
        raise SystemExit(f"variant {args.worker}: no measured step within {args.max_seconds} s")
    tokens = cfg.train.global_batch * cfg.data.seq_len
    tok_s = tokens / statistics.median(times)
    peak = torch.cuda.max_memory_allocated(s.parts.device) if s.parts.device.type == "cuda" else None
    return {"variant": args.worker, "device": s.parts.flops.device_name, "precision": cfg.train.precision,
            "compile": cfg.train.compile, "attn": cfg.model.attn, "grad_ckpt": cfg.model.grad_ckpt,
            "micro_batch": cfg.train.micro_batch, "accumulation": s.parts.accum, "probe": s.parts.perf_notes.get("micro_batch_probe"),
            "tokens_per_step": tokens, "steps_measured": len(times), "step_seconds_median": statistics.median(times),
            "first_step_seconds": first, "setup_seconds": setup, "tokens_per_s": tok_s, "mfu": s.parts.flops.mfu(tok_s),
            "flops_per_token": s.parts.flops.flops_per_token, "peak_tflops": (s.parts.flops.peak_per_device or 0) / 1e12 or None,
            "peak_memory_allocated": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="base,compile,ckpt,flash2,eager")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=3, help="steps before measuring (compilation happens here)")
    ap.add_argument("--max-seconds", type=float, default=240, help="per variant, set-up included")
    ap.add_argument("--budget-seconds", type=float, default=540, help="no variant starts after this")
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU: checks the flow, measures nothing")
    ap.add_argument("--work", default=None)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return

    t_start = time.perf_counter()
    work = Path(args.work) if args.work else default_work_dir() / "gpu-mfu"
    shape = SMOKE if args.smoke else REF
    template = write_config(work, "template", shape="test", data_dir=work / "template-data", max_bytes=300_000)
    prepare_data(template)  # a real tokenizer and manifest layout; the tokens below are synthetic
    steps_needed = (args.warmup + args.steps) * shape["global_batch"]
    data = synthetic_corpus(work / "data", work / "template-data",
                            (steps_needed + 64) * shape["seq_len"] + 1, vocab=4096)
    cfg_path = write_config(work, "mfu", shape="test", data_dir=data, steps=1000, **shape)
    text = cfg_path.read_text().replace('device = "cpu"', f'device = "{"cpu" if args.smoke else "cuda"}"')
    text = text.replace("max_seq_len = 256", f"max_seq_len = {max(256, shape['seq_len'])}")
    cfg_path.write_text(text.replace("val_windows = 16", "val_windows = 8"))

    variants = args.variants.split(",")
    if "flash2" in variants:
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            print("flash2: skipped, the flash-attn package is not installed")
            variants.remove("flash2")
    if args.smoke:
        variants = [v for v in variants if v != "compile"]  # minutes of CPU code generation prove little here
    results = []
    for v in variants:
        if time.perf_counter() - t_start > args.budget_seconds:
            print(f"{v}: skipped, the budget of {args.budget_seconds:.0f} s is spent")
            continue
        shutil.rmtree(work / "runs", ignore_errors=True)
        shutil.rmtree(work / "store", ignore_errors=True)
        cmd = [sys.executable, __file__, "--worker", v, "--config", str(cfg_path), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--max-seconds", str(args.max_seconds), "--work", str(work)]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not lines:
            print(f"{v}: FAILED (exit {p.returncode})\n{p.stderr[-2500:]}", flush=True)
            results.append({"variant": v, "error": p.stderr[-2500:]})
            continue
        r = json.loads(lines[-1][7:])
        results.append(r)
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(f"{v}: micro-batch {r['micro_batch']} x {r['accumulation']}, {r['tokens_per_s']:,.0f} tok/s, MFU {mfu}, "
              f"first step {r['first_step_seconds']:.1f} s", flush=True)

    ok = {r["variant"]: r for r in results if "error" not in r}
    print(f"\n# GPU MFU, {'smoke' if args.smoke else 'reference'} shape at seq {shape['seq_len']}: {machine()}")
    if ok:
        print(f"device {next(iter(ok.values()))['device']}, peak {next(iter(ok.values()))['peak_tflops']} TFLOP/s\n")
        print("| variant | precision | attn | compile | act. ckpt | micro x accum | tok/s | MFU | peak memory |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in ok.values():
            mem = f"{r['peak_memory_allocated'] / 2**30:.1f} GiB" if r["peak_memory_allocated"] else "n/a"
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            print(f"| {r['variant']} | {r['precision']} | {r['attn']} | {r['compile']} | {r['grad_ckpt']} | "
                  f"{r['micro_batch']} x {r['accumulation']} | {r['tokens_per_s']:,.0f} | {mfu} | {mem} |")
    if "base" in ok and "compile" in ok:
        print(f"\ncompile speed-up (base step / compiled step) = "
              f"{ok['base']['step_seconds_median'] / ok['compile']['step_seconds_median']:.3f}")
    if "base" in ok and "ckpt" in ok:
        print(f"activation checkpointing cost (ckpt step / base step) = "
              f"{ok['ckpt']['step_seconds_median'] / ok['base']['step_seconds_median']:.3f}")
    best = max((r for r in ok.values() if r["mfu"] is not None), key=lambda r: r["mfu"], default=None)
    if best:
        print(f"BEST MFU = {best['mfu']:.1%} ({best['variant']})  target >= 40 %  "
              f"{'OK' if best['mfu'] >= 0.40 else 'MISSED'}")
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else work
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_mfu.json").write_text(json.dumps({"machine": machine(), "shape": shape, "results": results},
                                                 indent=1))
    print(f"wrote {out / 'gpu_mfu.json'}")


if __name__ == "__main__":
    main()
