"""Start-up of a compiled session on an empty machine: cold, then warm from the compile cache the run carries
(target: warm / cold <= 0.35, start to first step, measured side by side in one run).

Two sessions of one run, each ``baton train`` as a fresh process with ``train.compile = true`` on a machine
that starts empty: its own empty work folder (``run.local_dir``) and its own empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR``), so nothing one compiled reaches the other except through the store. The first
finds no compile cache, compiles cold, and pushes the cache to the store after its first step; the second
resumes from the first's checkpoint, pulls the cache beside it, loads it, and compiles warm. Each session's
ledger record splits its start-up into pull, build, compile and first step; start to first step is pull +
build + first step (the compile happens inside the first step). ``--pairs N`` runs N such relays (each in a
fresh store) and reports the median ratio.

Beside each relay, a cold session compiled whole (``compile_scope = "model"``: what every session paid before
regional compilation and the cache), so the relay's start-up before and after is in the same run.

The model is the reference shape's depth (22 decoder blocks, configs/ref-106m.toml) at the test suite's width,
so a step takes milliseconds on a CPU and the start-up is the compile's. ``--layers`` and ``--scope`` change
the depth and ``train.compile_scope``.

Run: ``python benchmarks/bench_compile_cache.py [--pairs 1] [--layers 22] [--scope blocks] [--out result.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _perf_common import ROOT, default_work_dir, machine, prepare_data, write_config

TARGET = 0.35


def session(cfg: Path, machine_dir: Path, stop_after: int, extra: list[str]) -> dict[str, Any]:
    """One ``baton train`` on an empty machine; its ledger record's start-up split and its wall time."""
    shutil.rmtree(machine_dir, ignore_errors=True)
    (machine_dir / "inductor").mkdir(parents=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(machine_dir / "inductor"), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "baton.cli", "train", "-c", str(cfg), "--stop-after-steps", str(stop_after)]
    for s in [*extra, "train.compile=true", f"run.local_dir={machine_dir / 'work'}"]:  # the last of a key wins
        argv += ["--set", s]
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"`{' '.join(argv[2:])}` exited {p.returncode}: {p.stderr[-3000:]}")
    return {"wall_seconds": wall, "log": p.stderr}


def ledger_splits(store: Path, run: str) -> list[dict[str, Any]]:
    from baton.planning.ledger import read_ledger
    from baton.store.local import LocalStore

    records, problems = read_ledger(LocalStore(store), run)
    if problems:
        raise SystemExit(f"ledger problems: {problems}")
    out = []
    for r in records:
        if r.startup is None:
            raise SystemExit(f"session {r.session} recorded no start-up split")
        s = r.startup
        out.append({"session": r.session, "pull": s.pull, "build": s.build, "first_step": s.first_step,
                    "compile": s.compile, "compile_seconds": s.compile_seconds, "note": s.note,
                    "start_to_first_step": s.pull + s.build + s.first_step})
    return out


def relay(work: Path, cfg: Path, run: str, extra: list[str]) -> dict[str, Any]:
    """Cold session (steps 0-2), then warm session (2-4) of a fresh run in a fresh store."""
    store = work / f"store-{run}"
    shutil.rmtree(store, ignore_errors=True)
    sets = [*extra, f"store.url={store}", f"run.name={run}"]
    cold = session(cfg, work / "machine-1", 2, sets)
    warm = session(cfg, work / "machine-2", 4, sets)
    splits = ledger_splits(store, run)
    if [s["compile"] for s in splits] != ["cold", "warm"]:
        raise SystemExit(f"expected a cold then a warm session, the ledger says {[s['compile'] for s in splits]}: "
                         f"{[s['note'] for s in splits]}")
    c, w = splits
    return {"cold": {**c, "wall_seconds": cold["wall_seconds"]}, "warm": {**w, "wall_seconds": warm["wall_seconds"]},
            "ratio": w["start_to_first_step"] / c["start_to_first_step"]}


def cold_only(work: Path, cfg: Path, run: str, extra: list[str]) -> dict[str, Any]:
    """One cold session of a fresh run (the baseline: what every session paid before)."""
    store = work / f"store-{run}"
    shutil.rmtree(store, ignore_errors=True)
    wall = session(cfg, work / "machine-0", 2, [*extra, f"store.url={store}", f"run.name={run}"])["wall_seconds"]
    (split,) = ledger_splits(store, run)
    return {**split, "wall_seconds": wall}


def _row(name: str, s: dict[str, Any]) -> str:
    compile_s = s["compile_seconds"] if s["compile_seconds"] is not None else float("nan")
    return (f"| {name} | {s['pull']:.2f} | {s['build']:.2f} | {s['first_step']:.2f} | {compile_s:.2f} | "
            f"{s['start_to_first_step']:.2f} | {s['wall_seconds']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1, help="cold/warm relays to run (median ratio)")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--scope", default="blocks", choices=("blocks", "model"), help="train.compile_scope")
    ap.add_argument("--baseline", default="model", choices=("model", "none"),
                    help="also a cold session compiled whole (compile_scope = model), as every session compiled "
                         "before regional compilation and the cache: the before of the relay's start-up")
    ap.add_argument("--threads", type=int, default=0, help="train.threads (0: torch's default)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    work = Path(args.work or default_work_dir() / "compile-cache").resolve()
    cfg = write_config(work, "cc", shape="test", steps=100, threads=args.threads, n_layers=args.layers,
                       micro_batch=2, global_batch=2, max_bytes=200_000)
    prepare_data(cfg)
    print(f"# bench_compile_cache: {machine()}", flush=True)
    print(f"{args.layers} decoder blocks, train.compile_scope = {args.scope}; each session an empty machine "
          "(empty work folder, empty TORCHINDUCTOR_CACHE_DIR); seconds from the command's start\n", flush=True)
    results = []
    for i in range(args.pairs):
        before = cold_only(work, cfg, f"base{i}", ["train.compile_scope=model"]) if args.baseline == "model" else None
        r = relay(work, cfg, f"cc{i}", [f"train.compile_scope={args.scope}"])
        if before is not None:
            r["before"] = before
            r["ratio_to_before"] = r["warm"]["start_to_first_step"] / before["start_to_first_step"]
        results.append(r)
        print("| session | pull s | build s | first step s | of it compile s | start to first step s | process s |")
        print("|---|---|---|---|---|---|---|")
        if before is not None:
            print(_row("cold, compiled whole (before)", before))
        print(_row(f"cold, {args.scope}", r["cold"]))
        print(_row(f"warm, {args.scope}, from the store's cache", r["warm"]))
        print(f"\nwarm / cold, start to first step: {r['ratio']:.3f}"
              + (f"; warm / before: {r['ratio_to_before']:.3f}" if before is not None else "")
              + f"   ({r['warm']['note']})\n", flush=True)
    ratios = [r["ratio"] for r in results]
    med = statistics.median(ratios)
    print(f"median warm / cold over {len(ratios)} relay(s): {med:.3f} (target <= {TARGET}: "
          f"{'OK' if med <= TARGET else 'MISSED'})")
    if args.baseline == "model":
        print(f"median warm / cold compiled whole (before): "
              f"{statistics.median(r['ratio_to_before'] for r in results):.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "layers": args.layers, "scope": args.scope,
                                              "relays": results, "median_ratio": med, "target": TARGET}, indent=1))


if __name__ == "__main__":
    main()
