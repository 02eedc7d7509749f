"""The simulator against real relays: `baton train` sessions SIGKILLed at times drawn from a known Poisson rate,
machines wiped after each kill (the next session starts empty and resumes from the store), and the simulator
fed the same rate and the step, start-up and checkpoint times measured by an uninterrupted calibration session.
Prints, per real relay and for their mean, the billed time and the steps lost against the simulated P10-P90.

The model is the test suite's (steps of milliseconds), pushes are synchronous (the simulator's timeline: a
cycle holds the steps), sessions have no time limit (only kills end them before the horizon), so what is
compared is the simulator's cut-and-resume arithmetic: where a cut lands, what it loses, what it bills.

Run: ``python benchmarks/bench_simulate_vs_chaos.py [--relays 10] [--rate-per-min 6] [--seed 1]`` (5-10 min).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support.chaos import LocalView, read_metrics  # noqa: E402
from support.helpers import write_config  # noqa: E402
from support.zygote import Zygote  # noqa: E402


def ledger(store: Path, run: str) -> list[dict]:
    folder = store / run / "ledger"
    recs = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(recs, key=lambda r: r["started_ts"])


def relay(z: Zygote, argv: list[str], run: str, work: Path, store: Path, rate_per_s: float, rng: random.Random,
          wipe: Path) -> dict:
    """One relay to the horizon: each session killed at an exponential time from its start unless it ends first."""
    view = LocalView(store)
    billed, lost, kills, sessions, spawned = 0.0, 0, 0, 0, []
    while True:
        p = view.read(f"{run}/latest.json")
        if p is not None and json.loads(p).get("complete"):
            break
        sessions += 1
        kill_at = rng.expovariate(rate_per_s)
        t0 = time.monotonic()
        at = time.time()
        child = z.spawn([*argv, "--set", f"run.name={run}"], work / "out")
        spawned.append((child.pid, at))
        while child.alive() and time.monotonic() - t0 < kill_at:
            time.sleep(0.005)
        killed = child.alive()
        if killed:
            child.kill()
        try:
            res = child.wait(600)
            rc, err = res.returncode, res.stderr
        except FileNotFoundError:  # killed so early that it had not opened its output files
            rc, err = child.status, ""
        billed += time.monotonic() - t0
        if killed and rc == -9:
            kills += 1
            rows = read_metrics(wipe / run / "metrics.jsonl")
            reached = rows[-1]["step"] if rows else 0
            p = view.read(f"{run}/latest.json")
            resume = json.loads(p)["step"] if p is not None else 0
            lost += max(0, reached - resume)
        elif rc != 0:
            raise RuntimeError(f"session ended {rc}:\n{err[-2000:]}")
        shutil.rmtree(wipe / run, ignore_errors=True)  # the next machine starts empty
        if sessions > 500:
            raise RuntimeError("no completion after 500 sessions")
    return {"billed_s": billed, "lost": lost, "kills": kills, "sessions": sessions, "spawned": spawned}


def startups(recs: list[dict], spawned: list[tuple[int, float]]) -> list[float]:
    """Spawn to first step, per session that reached one (matched by pid: a session killed early has no record).
    The ledger's own start-up counts from the process's start as /proc gives it, in whole seconds of boot time
    (it errs early by up to a second); the harness's spawn time is the exact start here."""
    at = dict(spawned)
    return [r["started_ts"] + r["startup_seconds"] - at[r["pid"]] for r in recs
            if r.get("startup_seconds") is not None and r.get("pid") in at]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relays", type=int, default=10, help="real relays to run (default 10)")
    ap.add_argument("--steps", type=int, default=120, help="horizon (default 120)")
    ap.add_argument("--cadence", type=int, default=40, help="train.ckpt_every (default 40)")
    ap.add_argument("--rate-per-min", type=float, default=6.0, help="kills per minute of session (default 6)")
    ap.add_argument("--runs", type=int, default=4000, help="simulated runs (default 4000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rate_per_s = args.rate_per_min / 60
    work = Path(tempfile.mkdtemp(prefix="baton-simchaos-"))
    store, runs = work / "store", work / "runs"
    cfg = write_config(work / "small.toml", data_dir=work / "data", store=store, runs=runs, run_name="cal")
    sets = [f"train.steps={args.steps}", f"train.ckpt_every={args.cadence}", "store.async_push=false",
            "budget.heartbeat_minutes=0"]
    argv = ["train", "-c", str(cfg), "--no-progress", *[a for s in sets for a in ("--set", s)]]
    z = Zygote()
    try:
        r = z.run(["prepare", "-c", str(cfg), "--no-progress"], work / "out", timeout=1800)
        assert r.returncode == 0, r.stderr[-2000:]
        # Calibration: one uninterrupted session measures what the simulator is fed.
        walls, cal_spawn = [], []
        for i in range(2):
            t0 = time.monotonic()
            t_spawn = time.time()
            child = z.spawn([*argv, "--set", f"run.name=cal{i}"], work / "out")
            cal_spawn.append((child.pid, t_spawn))
            r = child.wait(1800)
            walls.append(time.monotonic() - t0)
            assert r.returncode == 0, r.stderr[-2000:]
        cal = ledger(store, "cal1")[0]
        tps = cal["tokens_per_step"]
        step_s = tps / cal["tokens_per_s"]
        cycles = [c["seconds"] for c in cal["checkpoints"] if c["verified"]]
        ckpt_s = float(np.mean(cycles))
        startup_s = startups([cal], cal_spawn)[0]
        n_cycles = len(cycles)
        from baton.planning.plan import PlanInput, session_seconds

        model = session_seconds(PlanInput(total_steps=args.steps, tokens_per_step=tps, rate=tps / step_s,
                                          session_hours=1e4, ckpt_seconds=ckpt_s, ckpt_every=args.cadence,
                                          startup_seconds=startup_s), 0, args.steps)
        tail = walls[1] - model  # the horizon's evaluation, export and process exit, outside the model
        print(f"calibration: {step_s * 1000:.1f} ms/step, {ckpt_s:.3f} s per cycle ({n_cycles} in the ledger), start-up "
              f"{startup_s:.2f} s; session {walls[1]:.2f} s measured, {model:.2f} s modelled (+{tail:.2f} s at the "
              "horizon: final evaluation, export, exit; billed once per simulated run)", flush=True)

        real = [relay(z, argv, f"relay{i}", work, store, rate_per_s, rng, runs) for i in range(args.relays)]
        for i, x in enumerate(real):
            print(f"relay {i}: {x['sessions']} sessions, {x['kills']} kills, {x['lost']} steps lost, "
                  f"{x['billed_s']:.1f} s billed", flush=True)
    finally:
        z.close()

    from datetime import datetime, timezone

    from baton.planning.simulate import Interruptions, SimInput, simulate

    # Each relay is simulated with the step, cycle and start-up times its own sessions measured (the ledger:
    # what `baton simulate` reads), since the load on a shared machine moves them between relays; the kill rate
    # is the known one. The horizon's tail (evaluation, export, exit) is billed once per run, outside the cuts.
    ranks, inside, rows = {"billed": [], "lost": []}, {"billed": 0, "lost": 0}, []
    for i, x in enumerate(real):
        recs = ledger(store, f"relay{i}")
        rates = [r["tokens_per_s"] for r in recs if r.get("tokens_per_s")]
        cyc = [c["seconds"] for r in recs for c in r["checkpoints"] if c["verified"]] or [ckpt_s]
        ups = startups(recs, x["spawned"]) or [startup_s]
        inp = PlanInput(total_steps=args.steps, tokens_per_step=tps, rate=float(np.median(rates)) if rates else
                        tps / step_s, session_hours=1e4, ckpt_seconds=float(np.mean(cyc)), ckpt_every=args.cadence,
                        startup_seconds=float(np.mean(ups)), start=datetime(2026, 1, 1, tzinfo=timezone.utc))
        sim = simulate(SimInput(inp, Interruptions(rate_per_hour=rate_per_s * 3600), runs=args.runs, seed=args.seed + i))
        billed = sim.billed_hours * 3600 + max(0.0, tail)
        for key, sim_v, real_v in (("billed", billed, x["billed_s"]), ("lost", sim.steps_lost, x["lost"])):
            lo, hi = np.percentile(sim_v, [10, 90])
            inside[key] += bool(lo <= real_v <= hi)
            # the real relay's rank among the simulated runs (ties split): uniform on [0, 1] if the model is right
            ranks[key].append(float((np.mean(sim_v < real_v) + np.mean(sim_v <= real_v)) / 2))
        q = {k: np.percentile(v, [10, 50, 90]) for k, v in (("billed", billed), ("lost", sim.steps_lost))}
        rows.append(f"| {i} | {x['sessions']} | {x['kills']} | {x['billed_s']:.1f} | {q['billed'][0]:.1f} / "
                    f"{q['billed'][1]:.1f} / {q['billed'][2]:.1f} | {x['lost']} | {q['lost'][0]:.0f} / "
                    f"{q['lost'][1]:.0f} / {q['lost'][2]:.0f} | {inp.step_seconds * 1000:.0f} ms, "
                    f"{inp.ckpt_seconds:.2f} s, {inp.startup_seconds:.2f} s |")
    print(f"\n{args.relays} relays, {args.steps} steps, a checkpoint every {args.cadence}, killed at {args.rate_per_min:g}"
          f"/min; each simulated with {args.runs} runs\n")
    print("| relay | sessions | kills | billed s | simulated P10 / P50 / P90 | steps lost | simulated P10 / P50 / P90 "
          "| fed: step, cycle, start-up |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    k = len(real)
    for key in ("billed", "lost"):
        print(f"{key}: {inside[key]} of {k} relays inside their simulated P10-P90 (80 % expected); ranks among the "
              f"simulated runs {', '.join(f'{r:.2f}' for r in ranks[key])} (mean {np.mean(ranks[key]):.2f}, "
              "0.50 expected)")
    means = {"billed": np.mean([x["billed_s"] for x in real])}
    shutil.rmtree(work, ignore_errors=True)
    return 0 if math.isfinite(means["billed"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
