"""Figure 3: baton against the Hugging Face Trainer on the same model and data on CPU, steady tokens/s
ratio (target >= 1.0).

Both sides train configs/tiny.toml's model shape (4 layers, hidden 192, vocabulary 4096) from the same
initial weights on the same prepared standard-library corpus: 32 windows of 128 tokens per optimizer step
as 2 micro-batches of 16, fp32, AdamW (betas 0.9/0.95, weight decay 0.1, each side's default
implementation: fused on CPU for both), gradient clipping at 1.0, linear warmup, the progress bar on,
torch's default CPU threads.

- baton: ``Session`` + ``train()``, as ``baton train`` runs them (metrics.jsonl every step included).
- Trainer: ``transformers.Trainer`` with a map-style dataset over the same windows (its default sampler,
  collator and DataLoader), everything else at its defaults.

The two loops run in one process, each in a thread of its own, and take turns step by step (baton,
Trainer, baton, ...): the Trainer waits in its ``on_step_end`` callback until baton has finished a step,
and baton waits in ``record`` until the Trainer has finished one. Only one side runs at a time, so both see the
same machine load, however it drifts. A step's time covers the whole loop iteration on each side (baton:
``record`` to ``record``; Trainer: released to ``on_step_end``). tokens/s = 4,096 tokens per step / the
median step time after the warm-up steps.

Requirements: baton's own plus ``accelerate`` (the Trainer needs it): ``pip install -e ".[bench]"``.
Run: ``python benchmarks/bench_vs_hf_trainer.py [--steps 80]``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import threading
import time
from pathlib import Path

from _perf_common import default_work_dir, machine, median, prepare_data, spread, write_config

OPTIM = {"lr": 2e-3, "warmup": 10, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "clip": 1.0}


def make_trainer(cfg, out: Path, steps: int, callback):
    """The Trainer for ``cfg``'s model shape, batch geometry, device and precision, on the same windows."""
    import torch
    from transformers import Trainer, TrainingArguments

    from baton.data.reader import WindowDataset
    from baton.model.llama import build_model

    ds = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return ds.n_train

        def __getitem__(self, i):
            w = ds.rows([i])[0, :-1]  # the input tokens of window i (the model shifts labels itself)
            return {"input_ids": w, "labels": w}

    t, o = cfg.train, cfg.optim
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=t.micro_batch,
        gradient_accumulation_steps=t.global_batch // t.micro_batch, max_steps=steps,
        learning_rate=o.lr, weight_decay=o.weight_decay, adam_beta1=o.beta1, adam_beta2=o.beta2,
        max_grad_norm=o.grad_clip, warmup_steps=o.warmup_steps, lr_scheduler_type="constant_with_warmup",
        save_strategy="no", report_to="none", use_cpu=t.device == "cpu", bf16=t.precision == "bf16",
        fp16=t.precision == "fp16", seed=0)
    model = build_model(cfg.model, "cpu", seed=0)
    return Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[callback])


def race(cfg, work: Path, steps: int, warmup: int, progress: bool = True) -> dict:
    """baton and the Trainer on ``cfg`` in one process, taking strict turns step by step; steady tokens/s.

    ``cfg`` must be a fresh run (its run folder and store prefix are wiped first) with concrete settings:
    both sides train the same shape from the same seed on the same windows with the same optimizer.
    """
    import torch
    from transformers import TrainerCallback

    from baton.loop import train
    from baton.session.core import Session

    for d in (Path(cfg.run_dir), Path(cfg.store.url) / cfg.run.name):
        shutil.rmtree(d, ignore_errors=True)
    if cfg.total_steps <= steps:
        # At the horizon baton evaluates and exports after its last step; the race times steps only.
        raise SystemExit(f"race: the config's horizon ({cfg.total_steps} steps) must lie beyond the {steps} raced")
    tokens = cfg.train.global_batch * cfg.data.seq_len
    # On a GPU either side's step can end with kernels still queued (the Trainer reads no loss back; baton's
    # optimizer step follows its last read of the loss): each step's time ends in a synchronize, on both
    # sides, so neither leaves its kernels to the other's clock.
    sync = torch.cuda.synchronize if cfg.train.device.startswith("cuda") else (lambda: None)

    hf_go, hf_done = threading.Semaphore(0), threading.Semaphore(0)
    hf_times: list[float] = []
    baton_times: list[float] = []
    released = [0.0]
    finished, hf_exited = threading.Event(), threading.Event()

    class Handoff(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            hf_go.acquire()
            released[0] = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            sync()
            hf_times.append(time.perf_counter() - released[0])
            hf_done.release()
            if not finished.is_set():
                hf_go.acquire()
            released[0] = time.perf_counter()

    trainer = make_trainer(cfg, work / "hf-out", steps, Handoff())
    s = Session(cfg, resume="never", stop_after=steps, progress=progress)
    mark = [0.0]
    orig = s.record

    def record(step, m):
        orig(step, m)
        sync()
        baton_times.append(time.perf_counter() - mark[0])
        if not hf_exited.is_set():
            hf_go.release()  # the Trainer's turn: one step
            hf_done.acquire()
        mark[0] = time.perf_counter()

    s.record = record
    errors: list[BaseException] = []

    def run_hf():
        try:
            trainer.train()
        except BaseException as e:  # noqa: BLE001 - reported below, after the join
            errors.append(e)
        finally:  # never leave baton waiting for a step that will not come
            hf_exited.set()
            hf_done.release()

    def run_baton():
        try:
            mark[0] = time.perf_counter()
            train(s)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            finished.set()
            hf_go.release()

    # Both loops in threads of their own, so neither gets the main thread's memory arena or thread pool.
    threads = [threading.Thread(target=run_hf, name="hf-trainer"), threading.Thread(target=run_baton, name="baton")]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    finally:
        s.close()
    if errors:
        raise errors[0]
    if len(hf_times) != steps or len(baton_times) != steps:
        raise SystemExit(f"the race ran {len(baton_times)} baton and {len(hf_times)} Trainer steps, not {steps} each")
    b_dt, h_dt = baton_times[warmup:], hf_times[warmup:]
    return {"tokens_per_step": tokens, "baton_step_seconds": b_dt, "hf_step_seconds": h_dt,
            "baton_tokens_per_s": tokens / median(b_dt), "hf_tokens_per_s": tokens / median(h_dt),
            "ratio": median(h_dt) / median(b_dt),
            # Trainer step / baton step = baton rate / Trainer rate, pair by pair
            "pair_ratio_median": median([x / y for x, y in zip(h_dt, b_dt)])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80, help="optimizer steps per side")
    ap.add_argument("--warmup", type=int, default=5, help="leading steps per side not measured")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = Path(args.work) if args.work else default_work_dir() / "vs-hf"

    o = OPTIM
    cfg_path = write_config(work, "vs-hf", shape="tiny", data_dir=default_work_dir() / "data")
    text = cfg_path.read_text().replace("lr = 2e-3\nwarmup_steps = 10",
                                        f"lr = {o['lr']}\nwarmup_steps = {o['warmup']}\nweight_decay = "
                                        f"{o['weight_decay']}\nbeta1 = {o['beta1']}\nbeta2 = {o['beta2']}\n"
                                        f"grad_clip = {o['clip']}")
    cfg_path.write_text(text)
    prepare_data(cfg_path)

    from baton.config import load_config

    logging.getLogger("baton").setLevel(logging.WARNING)
    r = race(load_config(cfg_path), work, args.steps, args.warmup)
    b, h = r["baton_tokens_per_s"], r["hf_tokens_per_s"]
    print(f"# baton vs Hugging Face Trainer, tiny shape, fp32: {machine()}")
    print(f"baton       {b:,.0f} tok/s, step {spread(r['baton_step_seconds'])}")
    print(f"HF Trainer  {h:,.0f} tok/s, step {spread(r['hf_step_seconds'])}")
    print(f"median of per-pair ratios {r['pair_ratio_median']:.4f}")
    print(f"TOKENS/S RATIO (baton / HF Trainer, medians) = {b / h:.4f}  target >= 1.0  "
          f"{'OK' if b >= h else 'MISSED'}")


if __name__ == "__main__":
    main()
