"""`baton status` and `baton ledger`, printed: what the store holds (``views.status``) and what the run has
cost, read from the store alone (no local state), so any machine can answer."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Config
from ..errors import BatonError
from ..planning import ledger as L
from ..store import RetryPolicy, open_store
from ..views.status import status


def run_ledger(args, cfg: Config) -> int:
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    from ..config import run_name_problems

    # its cooldown branches bill it too; a run named twice is one run, billed once
    runs = list(dict.fromkeys(args.run)) if args.run else [cfg.run.name, *L.branch_runs(store, cfg.run.name)]
    problems = [p for run in runs for p in run_name_problems(run, "--run")]
    if problems:
        raise BatonError(problems[0])
    records, problems = [], []
    for run in runs:
        r, p = L.read_ledger(store, run)
        records += r
        problems += p
    records.sort(key=lambda r: r.started_ts)
    t = L.totals(records, L.quota_from(cfg.budget), cfg.budget.cap_hours)
    if args.json:
        print(json.dumps({"runs": runs, "sessions": [r.to_json() | {"billed_hours": L.billed_hours(r)} for r in records],
                          "totals": t.to_dict(), "problems": problems}, indent=1))
        return 0
    print(f"ledger of {', '.join(runs)} in {store.describe()}")
    print(L.format_ledger(records, t))
    for problem in problems:
        print(f"problem: {problem}")
    return 0


def run_status(args, cfg: Config) -> int:
    s = status(cfg)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"run {s['run']} in {s['store']}")
    if s["pointer_problem"]:
        print(f"pointer: PROBLEM: {s['pointer_problem']}")
    elif s["pointer_step"] is None and s.get("branch"):
        print(f"pointer: none: no verified checkpoint of the branch yet (the next `baton anneal` starts it from the main "
              f"run's step {s['branch']['step']:,}, to step {s['total_steps']:,})")
    elif s["pointer_step"] is None:
        print(f"pointer: none: no verified checkpoint in the store yet (the next `baton train` starts at step 0 of "
              f"{s['total_steps']:,})")
        if s.get("store_missing"):
            # A new run's store is made by its first session; a run that has trained is elsewhere.
            relative = not cfg.store.url.startswith("file://") and not Path(cfg.store.url).is_absolute()
            print("store: its folder does not exist yet; if this run has trained before, " + (
                f"its store is elsewhere: a relative store.url is read from the current directory ({Path.cwd()}), "
                "so run from the folder the run was started in, or give store.url as an absolute path" if relative
                else "is its disk mounted? check store.url"))
    else:
        print(f"pointer: step {s['pointer_step']:,} of {s['total_steps']:,} at {s['pointer_path']}"
              + (" (run complete)" if s["complete"] else ""))
    if s["shortened"]:
        cut = s["shortened"]
        print(f"horizon: {cut['horizon']:,} steps, shortened from the planned {cut['planned']:,} by anytime mode at "
              f"step {cut['step']:,} (docs/anytime-mode.md)")
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
    sim = s.get("simulated")
    if sim:
        print(f"simulated finish: {sim['problem']}" if sim.get("problem") else
              f"simulated finish: P50 {sim['p50']}, P90 {sim['p90']} ({sim['runs']} runs at "
              f"{sim['interrupt_rate_per_hour']:.3g} interruptions/h: {sim['why']})")
    cad = s.get("cadence")
    if cad and (cad["auto"] or cad["ckpt_minutes"]):
        print(f"checkpoint cadence: {cad['reason']}")
    for b in s.get("branches", []):
        state = ("complete" if b["complete"] else f"step {b['pointer_step']:,} of {b['total_steps']:,}"
                 if b["pointer_step"] is not None else "no checkpoint yet")
        print(f"cooldown branch {b['name']}: from step {b['step']:,} over {b['tokens']:,} tokens; {state}"
              + (f", val_loss {b['val_loss']:.4f}" if b["val_loss"] is not None else ""))
    print(f"lease: {_lease_line(s['lease'])}")
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
          + (" (the main run's and its branches')" if s.get("branches") or s.get("branch") else "")
          + (f"; this quota period {led['period_hours']:.4f} of {led['quota_hours']:g} h" if led["period_hours"]
             is not None else "") + (f"; cap {led['cap_hours']:g} h, {led['cap_left']:.4f} h left" if led["cap_left"]
                                      is not None else ""))
    for problem in s["ledger_problems"]:  # a damaged record is left out of the total above: said, not hidden
        print(f"ledger problem (left out of the billed total): {problem}")
    print("curves, sessions and plots: baton report -c CONFIG [--out DIR]")
    return 0


def _lease_line(lease) -> str:
    """Who may write the run now (docs/concurrency.md)."""
    if lease is None:
        return "none: no session holds the run"
    if lease.get("problem"):
        return f"PROBLEM: {lease['problem']}"
    who = f"session {lease['session']} on host {lease['host']} (pid {lease['pid']}), epoch {lease['epoch']}"
    if lease["released"]:
        return f"free: released by {who} at {lease['renewed']}"
    if lease.get("ended"):
        return (f"abandoned: {who} ended without releasing it (a kill or a crash on this machine); the next session "
                "takes the run without asking")
    if lease["expires_in_s"] is None:  # no age told: the Hub, or a stamp ahead of the store's clock
        return (f"held by {who} since {lease['since']}, last renewed {lease['renewed']}; it expires "
                f"{lease['ttl_s']:.0f} s after a renewal")
    if lease["expired"]:
        return (f"expired: {who} last renewed it {lease['age_s']:.0f} s ago (the next session takes the run without "
                "asking)")
    return (f"held by {who} since {lease['since']}, last renewed {lease['age_s']:.0f} s ago; expires in "
            f"{lease['expires_in_s']:.0f} s unless renewed (`baton train --take-over` takes the run over)")
