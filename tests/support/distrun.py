"""Running `baton train` in a real subprocess (the launcher, torchrun and its ranks) and reading what it left."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from baton.data.reader import WindowDataset
from support.helpers import read_metrics, write_config

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    """A finished `baton train` invocation and what it left behind."""

    base: Path
    config: Path
    store: Path
    run_dir: Path
    proc: subprocess.CompletedProcess
    seconds: float

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.run_dir)

    @property
    def pointer(self) -> dict:
        return json.loads((self.store / "test" / "latest.json").read_text())

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "run_summary.json").read_text())

    def log(self, rank: int) -> str:
        return (self.run_dir / "logs" / f"rank-{rank}.log").read_text()

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr


def rank_env(extra: dict | None = None) -> dict:
    # One thread per rank: two ranks on a two-core machine must not oversubscribe it.
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra or {})}


# A ceiling that only catches a hang: a few-step run takes seconds on a quiet machine, minutes under load.
RUN_TIMEOUT_S = 900


def baton_train(cfg: Path, *args: str, env: dict | None = None,
                timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "baton.cli", "train", "--config", str(cfg), "--no-progress", *args],
                          cwd=ROOT, env=rank_env(env), capture_output=True, text=True, timeout=timeout)


class Runs:
    """Makes run folders (config + store + runs dir) under one temporary root."""

    def __init__(self, root: Path, data: Path):
        self.root, self.data = root, data

    def new(self, name: str, store_from: Path | None = None) -> tuple[Path, Path, Path]:
        base = self.root / name
        store = base / "store"
        if store_from is not None:
            shutil.copytree(store_from, store)
        cfg = write_config(base / "cfg.toml", data_dir=self.data, store=store, runs=base / "runs")
        return base, cfg, store

    def train(self, name: str, *args: str, store_from: Path | None = None, env: dict | None = None,
              expect_ok: bool = True) -> Run:
        base, cfg, store = self.new(name, store_from)
        t0 = time.monotonic()
        p = baton_train(cfg, *args, env=env)
        run = Run(base, cfg, store, base / "runs" / "test", p, time.monotonic() - t0)
        if expect_ok and p.returncode != 0:
            raise AssertionError(f"baton train {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        return run

    def train_nodes(self, name: str, nodes: int, *args: str) -> list[Run]:
        """``nodes`` launchers of one process each, meeting at a c10d rendezvous on 127.0.0.1, as on a cluster
        (each node starts its own torchrun agent); here the "nodes" share the machine and the run folder.

        The rendezvous port is picked free, then bound by the first node's agent: another process may take it
        in between, so a launch that finds it taken is retried on a new port (a fresh run folder)."""
        for attempt in range(3):
            runs = self._train_nodes(name if attempt == 0 else f"{name}-retry{attempt}", nodes, *args)
            if not any(r.proc.returncode and "address already in use" in r.proc.stderr.lower() for r in runs):
                break
        for r in runs:
            if r.proc.returncode != 0:
                raise AssertionError(f"node exited {r.proc.returncode}\n{r.proc.stdout}\n{r.proc.stderr}")
        return runs

    def _train_nodes(self, name: str, nodes: int, *args: str) -> list[Run]:
        base, cfg, store = self.new(name)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
        cmd = [sys.executable, "-m", "baton.cli", "train", "--config", str(cfg), "--no-progress", "--nproc", "1",
               "--nnodes", str(nodes), "--rdzv-endpoint", endpoint, *args]
        t0 = time.monotonic()
        procs = [subprocess.Popen(cmd, cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(nodes)]
        try:
            outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return [Run(base, cfg, store, base / "runs" / "test",
                    subprocess.CompletedProcess(cmd, p.returncode, out, err), time.monotonic() - t0)
                for p, (out, err) in zip(procs, outs)]


# ------------------------------------------------------------------ comparing runs (tolerances: test_dist_runs)

LOSS_ATOL = 1e-5
GRAD_RTOL = 1e-5
GLOBAL_BATCH = 8  # tests/support/helpers.py TEST_TOML
# Micro-batches of 2: two per rank per step on 2 ranks, so the no-sync micro-step is exercised for real.
ACCUM2 = ("--set", "train.micro_batch=2")


def expected_batch_shas(data_dir, steps: int, skipped: tuple[tuple[int, int], ...] = ()) -> list[str]:
    """What each step must have read, computed here from the global order alone (stepping over the
    ``skipped`` stream ranges), without any rank."""
    ds = WindowDataset(data_dir, seq_len=32, shuffle_seed=7, val_windows=16)
    ds.set_skipped(skipped)
    out = []
    for step in range(steps):
        x, _ = ds.train_batch(step * GLOBAL_BATCH, GLOBAL_BATCH)
        rows = [int.from_bytes(hashlib.blake2b(r.numpy().tobytes(), digest_size=4).digest(), "little") >> 1 for r in x]
        out.append(hashlib.sha256(np.array(rows, dtype=np.int64).tobytes()).hexdigest()[:16])
    return out


def assert_close_trace(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, len(a) + 1))
    for ra, rb in zip(a, b):
        assert ra["batch_sha"] == rb["batch_sha"], f"step {ra['step']} read different samples"
        assert abs(ra["loss"] - rb["loss"]) <= LOSS_ATOL, (ra["step"], ra["loss"], rb["loss"])
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=GRAD_RTOL), ra["step"]


def assert_exact_trace(a: list[dict], b: list[dict]) -> None:
    keys = ("step", "loss", "grad_norm", "lr", "batch_sha", "samples_consumed")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]


def assert_complete_and_verified(run) -> None:
    p = run.pointer
    assert p["step"] == 20 and p["complete"] is True
    assert all(c["verified"] for c in run.summary["checkpoints"])
    assert (run.store / "test" / p["path"] / "model.safetensors").is_file()
