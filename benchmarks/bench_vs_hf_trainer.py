"""Figure 3: baton against the Hugging Face Trainer on the same model and data on CPU, steady tokens/s
ratio (target >= 1.0).

Both sides train configs/tiny.toml's model shape (4 layers, hidden 192, vocabulary 4096) on the same
prepared standard-library corpus: 32 windows of 128 tokens per optimizer step as 2 micro-batches of 16,
fp32, AdamW (betas 0.9/0.95, weight decay 0.1, each side's default implementation: fused on CPU for both),
gradient clipping at 1.0, linear warmup, the progress bar on, torch's default CPU threads.

- baton: ``Session`` + ``train()``, as ``baton train`` runs them (metrics.jsonl every step included).
- Trainer: ``transformers.Trainer`` with a map-style dataset over the same windows (its default sampler,
  collator and DataLoader), everything else at its defaults.

A step's time is the interval between two consecutive completed optimizer steps (baton: ``record``;
Trainer: ``on_step_end``), so it covers the whole loop on each side. Each side runs in its own process;
each round runs one process per side, the order alternating between rounds (baton first, then the Trainer
first), and the medians of all steady steps (after the warm-up steps) are compared: tokens/s = 4,096 tokens
per step / median step time. The ratio of each round (a pair run back to back) is printed too.

Requirements: baton's own plus ``accelerate`` (the Trainer needs it): ``pip install accelerate``.
Run: ``python benchmarks/bench_vs_hf_trainer.py [--rounds 4] [--steps 40]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _perf_common import ROOT, default_work_dir, machine, median, prepare_data, spread, write_config

OPTIM = {"lr": 2e-3, "warmup": 10, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "clip": 1.0}


def baton_worker(cfg_path: Path, run: str, steps: int) -> list[float]:
    from baton.config import load_config
    from baton.session import Session
    from baton.train import train

    logging.getLogger("baton").setLevel(logging.WARNING)
    cfg = load_config(cfg_path, [f"run.name={run}"])
    s = Session(cfg, resume="never", stop_after=steps, progress=True)
    stamps: list[float] = []
    orig = s.record

    def record(step, m):
        orig(step, m)
        stamps.append(time.perf_counter())

    s.record = record
    try:
        train(s)
    finally:
        s.close()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def hf_worker(cfg_path: Path, out: Path, steps: int) -> list[float]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from baton.config import load_config
    from baton.data.reader import WindowDataset
    from baton.model import build_model

    cfg = load_config(cfg_path)
    ds = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return ds.n_train

        def __getitem__(self, i):
            w = ds.rows([i])[0, :-1]  # the 128 input tokens of window i (the model shifts labels itself)
            return {"input_ids": w, "labels": w}

    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    t = cfg.train
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=t.micro_batch,
        gradient_accumulation_steps=t.global_batch // t.micro_batch, max_steps=steps,
        learning_rate=OPTIM["lr"], weight_decay=OPTIM["weight_decay"], adam_beta1=OPTIM["beta1"],
        adam_beta2=OPTIM["beta2"], max_grad_norm=OPTIM["clip"], warmup_steps=OPTIM["warmup"],
        lr_scheduler_type="constant_with_warmup", save_strategy="no", report_to="none", use_cpu=True, seed=0)
    model = build_model(cfg.model, "cpu", seed=0)
    Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[Stamp()]).train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run_side(side: str, cfg_path: Path, work: Path, steps: int, r: int) -> list[float]:
    cmd = [sys.executable, __file__, "--worker", side, "--config", str(cfg_path), "--steps", str(steps),
           "--run", f"vs-hf-{r}", "--work", str(work)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not lines:
        raise RuntimeError(f"{side} worker failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per process")
    ap.add_argument("--warmup", type=int, default=5, help="leading steps per process not measured")
    ap.add_argument("--work", default=None)
    ap.add_argument("--worker", choices=["baton", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work) if args.work else default_work_dir() / "vs-hf"
    if args.worker:
        cfg = Path(args.config)
        if args.worker == "baton":
            for d in (work / "runs" / args.run, work / "store" / args.run):
                shutil.rmtree(d, ignore_errors=True)
            dts = baton_worker(cfg, args.run, args.steps)
        else:
            dts = hf_worker(cfg, work / "hf-out", args.steps)
        print("RESULT " + json.dumps(dts))
        return

    o = OPTIM
    cfg_path = write_config(work, "vs-hf", shape="tiny", data_dir=default_work_dir() / "data")
    text = cfg_path.read_text().replace("lr = 2e-3\nwarmup_steps = 10",
                                        f"lr = {o['lr']}\nwarmup_steps = {o['warmup']}\nweight_decay = "
                                        f"{o['weight_decay']}\nbeta1 = {o['beta1']}\nbeta2 = {o['beta2']}\n"
                                        f"grad_clip = {o['clip']}")
    cfg_path.write_text(text)
    prepare_data(cfg_path)
    from baton.config import load_config

    cfg = load_config(cfg_path)
    tokens = cfg.train.global_batch * cfg.data.seq_len
    sides: dict[str, list[float]] = {"baton": [], "hf": []}
    paired = []
    for r in range(args.rounds):
        rate = {}
        for side in (["baton", "hf"] if r % 2 == 0 else ["hf", "baton"]):  # the order alternates too
            dts = run_side(side, cfg_path, work, args.steps, r)[args.warmup:]
            sides[side] += dts
            rate[side] = tokens / median(dts)
            print(f"round {r + 1} {side:5s}: {rate[side]:,.0f} tok/s", flush=True)
        paired.append(rate["baton"] / rate["hf"])
    b, h = tokens / median(sides["baton"]), tokens / median(sides["hf"])
    print(f"# baton vs Hugging Face Trainer, tiny shape, fp32: {machine()}")
    print(f"baton       {b:,.0f} tok/s, step {spread(sides['baton'])}")
    print(f"HF Trainer  {h:,.0f} tok/s, step {spread(sides['hf'])}")
    print(f"per-round ratios {', '.join(f'{x:.3f}' for x in paired)}; median {median(paired):.3f}")
    print(f"TOKENS/S RATIO (baton / HF Trainer, pooled medians) = {b / h:.3f}  target >= 1.0  "
          f"{'OK' if b >= h else 'MISSED'}")


if __name__ == "__main__":
    main()
