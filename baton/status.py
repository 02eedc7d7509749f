"""`baton status` and `baton ledger`: what the store holds and what the run has cost, read from the store
alone (no local state), so any machine can answer."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from . import ledger as L
from .config import Config
from .errors import BatonError
from .plan import HOUR, PlanInput, iso, plan
from .store import RetryPolicy, open_store


def run_ledger(args, cfg: Config) -> int:
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    from .config import run_name_problems

    runs = args.run or [cfg.run.name]
    problems = [p for run in runs for p in run_name_problems(run, "--run")]
    if problems:
        raise BatonError(problems[0])
    records, problems = [], []
    for run in runs:
        r, p = L.read_ledger(store, run)
        records += r
        problems += p
    records.sort(key=lambda r: r["started_ts"])
    t = L.totals(records, L.quota_from(cfg.budget), cfg.budget.cap_hours)
    if args.json:
        print(json.dumps({"runs": runs, "sessions": [r | {"billed_hours": L.billed_hours(r)} for r in records],
                          "totals": t.to_dict(), "problems": problems}, indent=1))
        return 0
    print(f"ledger of {', '.join(runs)} in {store.describe()}")
    print(L.format_ledger(records, t))
    for p in problems:
        print(f"problem: {p}")
    return 0


def status(cfg: Config) -> dict[str, Any]:
    from .checkpoint.resume import read_pointer

    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    run = cfg.run.name
    out: dict[str, Any] = {"run": run, "store": store.describe(), "total_steps": cfg.total_steps,
                           "tokens_per_step": cfg.tokens_per_step}
    try:
        pointer = read_pointer(store, run)
        out["pointer_problem"] = None
    except BatonError as e:
        pointer, out["pointer_problem"] = None, str(e)
    step = pointer["step"] if pointer else 0
    out.update({"pointer_step": pointer["step"] if pointer else None,
                "pointer_path": pointer["path"] if pointer else None,
                "complete": bool(pointer and pointer.get("complete")), "tokens_done": step * cfg.tokens_per_step,
                "steps_left": max(0, cfg.total_steps - step)})
    # Stream ranges the run skips after loss-spike rollbacks: part of its data position (baton.rollback).
    out["skipped"] = list((pointer.get("cursor") or {}).get("skipped") or []) if pointer else []
    from .checkpoint.select import present_steps, verified_steps

    records, problems = L.read_ledger(store, run)
    # A checkpoint in the store is verified when the pointer names it or a session recorded its verification;
    # anything else under ckpt/ is an upload that never passed (kept for inspection, never resumed from).
    verified = verified_steps(store, run, pointer)
    present = present_steps(store, run)
    out["checkpoints"] = [{"step": s, "verified": s in verified, "pointer": bool(pointer and s == pointer["step"])}
                          for s in present]
    rate, rate_src = L.measured_rate(records)
    out["rate_tokens_per_s"], out["rate_source"] = rate, rate_src
    out["stepping_hours_left"] = (out["steps_left"] * cfg.tokens_per_step / rate / HOUR) if rate else None
    out["eta"] = None
    if rate and out["steps_left"] and cfg.budget.session_hours:
        b = cfg.budget
        quota = L.quota_from(b)
        now = datetime.now(timezone.utc)
        t = L.totals(records, quota, b.cap_hours, now)
        p = _plan_or_problem(out, PlanInput(
            total_steps=cfg.total_steps, tokens_per_step=cfg.tokens_per_step, rate=rate,
            session_hours=b.session_hours, margin_hours=b.margin_minutes / 60,
            startup_seconds=b.startup_minutes * 60 or L.startup_seconds(records)[0] or 0.0,
            ckpt_seconds=b.ckpt_seconds or L.checkpoint_seconds(records) or 0.0, ckpt_every=cfg.train.ckpt_every,
            start_step=step, quota_hours=b.quota_hours, quota_period_hours=b.quota_period_days * 24,
            quota_reset=quota.reset if quota else None, used_hours=t.period_hours or 0.0,
            cap_left_hours=t.cap_left, bill_factor=b.bill_factor or records[-1].get("bill_factor", 1.0), start=now))
        if p is not None:
            out["eta"] = iso(p.eta)
            out["sessions_left"] = len(p.sessions)
            out["billed_hours_left"] = round(p.billed_hours, 4)
            out["plan_warnings"] = p.warnings
    out["data"] = data_status(cfg, records)
    t = L.totals(records, L.quota_from(cfg.budget), cfg.budget.cap_hours)
    out["ledger"] = t.to_dict()
    out["ledger_problems"] = problems
    return out


def data_status(cfg: Config, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The dataset the next session trains on (data.url's manifest, else data.dir's) and the last pull."""
    from .data.manifest import MANIFEST, load_manifest, parse_manifest

    out: dict[str, Any] = {"url": cfg.data.url or None, "dir": cfg.data.dir, "problem": None}
    try:
        if cfg.data.url:
            from .data.remote import data_store

            store = data_store(cfg)
            out["location"] = store.describe()
            raw = store.read_text(MANIFEST)
            m = parse_manifest(raw, f"{MANIFEST} in {out['location']}") if raw is not None else None
            if m is None:
                out["problem"] = f"no {MANIFEST} in {out['location']} (run `baton publish-data`)"
        else:
            out["location"] = cfg.data.dir
            m = load_manifest(cfg.data.dir)
    except BatonError as e:
        m, out["problem"] = None, str(e)
    if m is not None:
        out.update(fingerprint=m["fingerprint"], shards=m["n_shards"], total_tokens=m["total_tokens"])
    pulled = [r for r in records if r.get("data")]
    out["last_pull"] = ({"session": pulled[-1]["session"], **pulled[-1]["data"]} if pulled else None)
    return out


def _plan_or_problem(out: dict[str, Any], inp: PlanInput):
    try:
        return plan(inp)
    except BatonError as e:  # a budget that cannot plan is worth reporting, not a reason to hide the status
        out["plan_problem"] = str(e)
        return None


def run_status(args, cfg: Config) -> int:
    s = status(cfg)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"run {s['run']} in {s['store']}")
    if s["pointer_problem"]:
        print(f"pointer: PROBLEM: {s['pointer_problem']}")
    elif s["pointer_step"] is None:
        print("pointer: none (the next `baton train` starts at step 0)")
    else:
        print(f"pointer: step {s['pointer_step']:,} of {s['total_steps']:,} at {s['pointer_path']}"
              + (" (run complete)" if s["complete"] else ""))
    print(f"tokens done: {s['tokens_done']:,} of {s['total_steps'] * s['tokens_per_step']:,}")
    if s["skipped"]:
        print(f"skipped after loss spikes: {len(s['skipped'])} stream range(s) "
              + ", ".join(f"[{a:,}, {b:,})" for a, b in s["skipped"])
              + f", {sum(b - a for a, b in s['skipped']):,} windows")
    ck = ", ".join(f"{c['step']}{'' if c['verified'] else ' (NOT verified)'}{' <- pointer' if c['pointer'] else ''}"
                   for c in s["checkpoints"]) or "none"
    print(f"checkpoints in the store: {ck}")
    if s["rate_tokens_per_s"]:
        print(f"measured rate: {s['rate_tokens_per_s']:,.0f} tok/s ({s['rate_source']}); {s['steps_left']:,} steps "
              f"left = {s['stepping_hours_left']:.2f} h of stepping")
    else:
        print(f"measured rate: none ({s['rate_source']})")
    if s["eta"]:
        print(f"ETA: {s['eta']} in {s['sessions_left']} more session(s), {s['billed_hours_left']:.2f} h billed"
              + "".join(f"\nwarning: {w}" for w in s.get("plan_warnings", [])))
    elif s.get("plan_problem"):
        print(f"ETA: {s['plan_problem']}")
    elif s["steps_left"] and s["rate_tokens_per_s"]:
        print("ETA: set budget.session_hours for a calendar (baton plan shows the sessions)")
    d = s["data"]
    if d["problem"]:
        print(f"data: PROBLEM: {d['problem']}")
    else:
        print(f"data: {d['location']}: {d['shards']} shards, {d['total_tokens']:,} tokens, fingerprint "
              f"{d['fingerprint']}" + (f" (pulled into {d['dir']} before training)" if d["url"] else ""))
    if d["last_pull"]:
        lp = d["last_pull"]
        print(f"last data pull: {lp['seconds']:.1f} s, {lp['pulled_files']} files ({lp['pulled_bytes'] / 1e6:,.1f} MB) "
              f"pulled, {lp['reused_files']} reused (session {lp['session']}, fingerprint {lp['fingerprint']})")
    led = s["ledger"]
    print(f"billed: {led['billed_hours']:.4f} h over {led['sessions']} session(s)"
          + (f"; this quota period {led['period_hours']:.4f} of {led['quota_hours']:g} h" if led["period_hours"]
             is not None else "") + (f"; cap {led['cap_hours']:g} h, {led['cap_left']:.4f} h left" if led["cap_left"]
                                      is not None else ""))
    print("curves, sessions and plots: baton report -c CONFIG [--out DIR]")
    return 0
