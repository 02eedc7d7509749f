"""Figure 2: time from process start to the first completed step, resuming at sample 0 and at sample 10^9
(target: ratio at most 1.10), beside the Hugging Face Trainer resuming a streaming corpus.

baton: a synthetic corpus of 1.5 x 10^9 windows (48 x 10^9 tokens) in one sparse shard file (a hole of
96 GB that takes no disk space and reads as zeros), so the window index space is real, not wrapped into a
small corpus. A checkpoint is written at step 0 and at step 125,000,000 (sample 10^9 at 8 samples per
step); each trial then runs ``baton train`` as a fresh process on a wiped run folder, which pulls and
verifies the checkpoint from the store, slices the permutation at the cursor and trains one step. The
clock runs from ``Popen`` until metrics.jsonl holds the resumed step.

Hugging Face Trainer: the same model, fed by a ``torch.utils.data.IterableDataset`` (the usual way to
stream a pretraining corpus) that yields windows from an in-memory token array. It resumes from its own
checkpoint whose ``global_step`` is set to each position; by default (``ignore_data_skip=False``) it pulls
and discards every earlier batch. Positions up to 2^16 samples are measured; the cost per skipped batch is
the slope of a least-squares line, and the time at 10^9 samples is extrapolated from it (it would take
hours to measure).

Both sides alternate trial by trial (baton 0, baton 10^9, baton 0, ...; then the Trainer positions
likewise) and report medians.

Requirements: baton's own plus ``accelerate`` (the Trainer needs it): ``pip install -e ".[bench]"``.
Run: ``python benchmarks/bench_resume_cost.py [--rounds 7] [--no-hf]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from _perf_common import ROOT, default_work_dir, machine, median, prepare_data, synthetic_corpus, write_config

SEQ = 32
GB = 8  # samples per step (micro-batch 4, accumulation 2)
N_WINDOWS = 1_500_000_000
FAR = 1_000_000_000  # the far position, in samples


# ----------------------------------------------------------------------------------------- baton side


def make_checkpoint(cfg_path: Path, run: str, step: int) -> None:
    """A verified checkpoint of ``run`` at ``step`` in the store, written by baton's own cycle."""
    import logging

    from baton.config import load_config
    from baton.session.core import Session

    logging.getLogger("baton").setLevel(logging.WARNING)
    cfg = load_config(cfg_path, [f"run.name={run}"])
    s = Session(cfg, resume="never", progress=False)
    try:
        s.state.step = step
        s.checkpointer.checkpoint(step)
    finally:
        s.close()


def time_to_first_step(cmd: list[str], marker: Path, until, timeout: float = 900) -> float:
    """Seconds from starting ``cmd`` until ``until(marker)`` holds; then the process is killed."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while True:
            if marker.is_file() and until(marker):
                return time.perf_counter() - t0
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} ended with {p.returncode} before its first step:\n"
                                   f"{p.stderr.read()[-3000:]}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"no first step within {timeout} s: {' '.join(cmd)}")
            time.sleep(0.005)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def baton_trial(cfg_path: Path, work: Path, run: str, step: int) -> float:
    shutil.rmtree(work / "runs" / run, ignore_errors=True)  # a fresh machine: only the store survives
    metrics = work / "runs" / run / "metrics.jsonl"

    def done(path: Path) -> bool:
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        hit = [r for r in rows if r["step"] == step + 1]
        if hit:
            assert hit[0]["samples_consumed"] == (step + 1) * GB  # resumed at the position, not from 0
        return bool(hit)

    cmd = [sys.executable, "-m", "baton.cli", "train", "-c", str(cfg_path), "--set", f"run.name={run}",
           "--stop-after-steps", str(step + 1), "--no-progress"]
    return time_to_first_step(cmd, metrics, done)


# -------------------------------------------------------------------------------------- Trainer side


def hf_worker(args) -> None:
    """One Hugging Face Trainer process: train one step (resuming from ``--ckpt`` if given)."""
    import numpy as np
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from baton.config import load_config
    from baton.data.reader import WindowDataset
    from baton.model.llama import build_model

    cfg = load_config(args.config)
    ds = WindowDataset(cfg.data.dir, SEQ, 0, 0)
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in ds.stream.shards])  # in memory

    class Stream(torch.utils.data.IterableDataset):
        """Consecutive windows, cycling over the corpus: a streaming pretraining dataset."""

        def __iter__(self):
            n = (len(tokens) - 1) // SEQ
            i = 0
            while True:
                w = torch.from_numpy(tokens[(i % n) * SEQ:(i % n) * SEQ + SEQ])
                yield {"input_ids": w, "labels": w}
                i += 1

    class Marker(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            Path(args.marker).write_text(str(state.global_step))
            control.should_training_stop = True

    model = build_model(cfg.model, "cpu", seed=0)
    targs = TrainingArguments(output_dir=args.out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                              max_steps=args.max_steps, learning_rate=1e-3, save_strategy=args.save,
                              save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                              logging_strategy="no", dataloader_num_workers=0, seed=0)
    Trainer(model=model, args=targs, train_dataset=Stream(), callbacks=[Marker()]).train(
        resume_from_checkpoint=args.ckpt)


def hf_checkpoint(cfg_path: Path, work: Path, samples: int) -> Path:
    """The Trainer's own checkpoint, with its global step set to ``samples`` / 8."""
    base = work / "hf" / "checkpoint-1"
    if not base.is_dir():
        subprocess.run([sys.executable, __file__, "--hf-worker", "--config", str(cfg_path), "--out",
                        str(work / "hf"), "--max-steps", "1", "--save", "steps", "--marker",
                        str(work / "hf-marker")], check=True, cwd=ROOT, capture_output=True)
    step = samples // GB
    ck = work / "hf" / f"at-{samples}"
    if not ck.is_dir():
        shutil.copytree(base, ck)
        st = json.loads((ck / "trainer_state.json").read_text())
        st["global_step"] = step
        (ck / "trainer_state.json").write_text(json.dumps(st))
    return ck


def hf_trial(cfg_path: Path, work: Path, samples: int) -> float:
    ck = hf_checkpoint(cfg_path, work, samples)
    marker = work / f"hf-marker-{samples}"
    marker.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--hf-worker", "--config", str(cfg_path), "--out", str(work / "hf-out"),
           "--max-steps", str(samples // GB + 1), "--save", "no", "--marker", str(marker), "--ckpt", str(ck)]
    return time_to_first_step(cmd, marker, lambda p: p.read_text().strip() == str(samples // GB + 1))


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-hf", action="store_true", help="skip the Hugging Face Trainer side")
    ap.add_argument("--work", default=None)
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    for a in ("--config", "--out", "--marker", "--ckpt", "--save"):
        ap.add_argument(a, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--max-steps", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(args)

    work = Path(args.work) if args.work else default_work_dir() / "resume"
    small_cfg = write_config(work, "small", shape="test", data_dir=work / "data", global_batch=GB)
    prepare_data(small_cfg)
    big = synthetic_corpus(work / "bigdata", work / "data", N_WINDOWS * SEQ + 1, sparse=True)
    cfg_path = write_config(work, "resume", shape="test", data_dir=big, steps=200_000_000, global_batch=GB)
    positions = {"0": 0, "1e9": FAR // GB}
    for name, step in positions.items():
        run = f"at-{name}"
        shutil.rmtree(work / "store" / run, ignore_errors=True)
        make_checkpoint(cfg_path, run, step)
    times: dict[str, list[float]] = {k: [] for k in positions}
    for r in range(args.rounds):
        order = list(positions.items()) if r % 2 == 0 else list(positions.items())[::-1]  # alternate the order
        for name, step in order:
            times[name].append(baton_trial(cfg_path, work, f"at-{name}", step))
        print(f"round {r + 1}: " + ", ".join(f"baton@{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    ratio = median(times["1e9"]) / median(times["0"])
    paired = [a / b for a, b in zip(times["1e9"], times["0"])]
    print(f"# resume cost: {machine()}")
    print(f"disk used by the {N_WINDOWS * SEQ * 2 / 1e9:.0f} GB sparse shard: "
          f"{_disk_usage(big / 'shard-00000.bin') / 1e6:.1f} MB")
    for k, v in times.items():
        print(f"baton resume at sample {k:>4}: median {median(v):.2f} s  (trials {', '.join(f'{x:.2f}' for x in v)})")
    print(f"per-round ratios {', '.join(f'{x:.3f}' for x in paired)}; median {median(paired):.3f}")
    print(f"RESUME COST RATIO (sample 1e9 / sample 0, medians) = {ratio:.3f}  target <= 1.10  "
          f"{'OK' if ratio <= 1.10 else 'MISSED'}")

    if args.no_hf:
        return
    hf_positions = [0, 4096, 16384, 65536]  # samples; batches of 4 skipped = samples / 4
    hf_times: dict[int, list[float]] = {p: [] for p in hf_positions}
    for r in range(3):
        for p in hf_positions:
            hf_times[p].append(hf_trial(small_cfg, work, p))
        print(f"round {r + 1}: " + ", ".join(f"HF@{p} {v[-1]:.2f}s" for p, v in hf_times.items()), flush=True)
    xs = [p / 4 for p in hf_positions]
    ys = [median(hf_times[p]) for p in hf_positions]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    at_far = ys[0] + slope * FAR / 4
    for p, y in zip(hf_positions, ys):
        print(f"HF Trainer resume at sample {p:>6} ({p // 4:>6} batches skipped): median {y:.2f} s")
    print(f"HF Trainer: {slope * 1e3:.3f} ms per skipped batch of 4; at sample 1e9 (extrapolated): "
          f"{at_far / 3600:.1f} h, ratio to sample 0 = {at_far / ys[0]:,.0f}")


def _disk_usage(path: Path) -> int:
    return os.stat(path).st_blocks * 512


if __name__ == "__main__":
    main()
