"""What the store holds for a run, read from the store alone (no local state), so any machine can answer:
pointer, verified checkpoints, tokens, skipped ranges, measured rate, ETA, the dataset, the ledger's totals.
``baton status`` prints it; ``baton.status`` returns it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import BatonError
from ..planning import ledger as L
from ..planning.plan import HOUR, PlanInput, iso_by, plan
from ..runs import parse_anneal, split_run
from ..store import RetryPolicy, open_store


def status(cfg: Config, forecast_curve: bool = False) -> dict[str, Any]:
    from ..checkpoint.history import read_history

    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    run = cfg.run.name
    out: dict[str, Any] = {"run": run, "store": store.describe(), "total_steps": cfg.total_steps,
                           "tokens_per_step": cfg.tokens_per_step}
    # A folder store that is not there holds no run, and most often is the wrong folder: a relative store.url
    # is read from the current directory, not from the config's.
    root = getattr(store, "root", None)
    out["store_missing"] = isinstance(root, Path) and not root.is_dir()
    history = read_history(store, run, strict=False)
    pointer, records, problems = history.pointer, history.sessions, history.ledger_problems
    # The quota and the cap count every session billed to the run: the main run's and its branches'.
    family, family_problems = L.read_run_ledgers(store, run, (records, problems))
    out["pointer_problem"] = history.pointer_problem
    step = pointer.step if pointer else 0
    out["planned_steps"], out["shortened"] = cfg.total_steps, None
    if pointer is not None:
        from ..checkpoint.pull import stored_state

        # Anytime mode's shorter horizon, kept in the checkpoint (session.anytime), is the run's from then on.
        state = stored_state(store, pointer)
        if state is not None and state.horizon(cfg.total_steps) != cfg.total_steps:
            out["total_steps"] = state.horizon(cfg.total_steps)
            out["shortened"] = state.shortened.to_json() if state.shortened else None
    if pointer and pointer.complete:
        # A complete run's horizon is where it completed, whatever horizon the config given here names.
        out["total_steps"] = step
    out.update({"pointer_step": pointer.step if pointer else None,
                "pointer_path": pointer.path if pointer else None,
                "complete": bool(pointer and pointer.complete), "tokens_done": step * cfg.tokens_per_step,
                "steps_left": max(0, out["total_steps"] - step)})
    # Stream ranges the run skips after loss-spike rollbacks: part of its data position (baton.session.rollback).
    out["skipped"] = list(pointer.cursor.get("skipped") or []) if pointer else []
    # Verified: the one rule of checkpoint.history, which export/eval/publish --step apply too.
    out["checkpoints"] = [{"step": c.step, "verified": c.verified, "pointer": c.pointer}
                          for c in history.checkpoints]
    rate, rate_src = L.measured_rate(records)
    out["rate_tokens_per_s"], out["rate_source"] = rate, rate_src
    out["stepping_hours_left"] = (out["steps_left"] * cfg.tokens_per_step / rate / HOUR) if rate else None
    out["eta"] = None
    if rate and out["steps_left"] and cfg.budget.session_hours:
        from ..planning.relay import relay_input

        # Each figure with the label `baton plan` gives it (planning.ledger): one source per figure.
        relay = relay_input(cfg.budget, out["total_steps"], cfg.tokens_per_step, cfg.train.ckpt_every, step, records,
                            rate, rate_src, billed=family)
        out["cadence"] = relay.cadence.to_dict()
        out["sources"] = relay.sources
        inp = relay.input
        p = _plan_or_problem(out, inp)
        if p is not None:
            from ..planning.simulate import forecast

            out["simulated"] = forecast(inp, records, curve=forecast_curve)
            out["eta"] = iso_by(p.eta)
            out["sessions_left"] = len(p.sessions)
            out["billed_hours_left"] = round(p.billed_hours, 4)
            out["plan_warnings"] = p.warnings
    out["lease"] = lease_status(store, run)
    out["data"] = data_status(cfg, records)
    main, branch = split_run(run)
    if branch is not None:
        at = parse_anneal(branch)
        out["branch"] = {"name": branch, "main_run": main, "step": at[0] if at else None,
                         "tokens": at[1] if at else None}
    else:
        out["branches"] = branches_status(store, run, cfg.tokens_per_step)
    t = L.totals(family, L.quota_from(cfg.budget), cfg.budget.cap_hours)
    out["ledger"] = t.to_dict()
    out["ledger_problems"] = family_problems
    return out


def branches_status(store, run: str, tokens_per_step: int) -> list[dict[str, Any]]:
    """Each cooldown branch of ``run`` in the store: where it starts, how far it is, its final validation."""
    from ..checkpoint.pointer import read_pointer

    out = []
    for b in L.branch_runs(store, run):
        name = split_run(b)[1] or ""
        step, tokens = parse_anneal(name) or (0, 0)
        try:
            pointer, problem = read_pointer(store, b), None
        except BatonError as e:
            pointer, problem = None, str(e)
        out.append({"name": name, "run": b, "step": step, "tokens": tokens,
                    "total_steps": step + tokens // tokens_per_step if tokens_per_step else None,
                    "pointer_step": pointer.step if pointer else None, "complete": bool(pointer and pointer.complete),
                    "val_loss": pointer.val_loss if pointer and pointer.complete else None, "problem": problem})
    return out


def lease_status(store, run: str) -> dict[str, Any] | None:
    """Who holds the run's lease (store.lease) and until when, by the store's clock where it tells one; None
    when no session ever held it."""
    from ..store.lease import read_lease

    try:
        found = read_lease(store, run)
    except BatonError as e:
        return {"problem": str(e)}
    if found is None:
        return None
    rec, age = found
    left = None if age is None or rec.released else round(max(0.0, rec.ttl_s - age), 1)
    return {"session": rec.session, "host": rec.host, "pid": rec.pid, "since": rec.started, "epoch": rec.epoch,
            "renewed": rec.renewed, "age_s": None if age is None else round(age, 1), "ttl_s": rec.ttl_s,
            "released": rec.released, "expires_in_s": left, "expired": left == 0.0, "took_over": rec.took_over,
            # its process is gone (told for certain on the holder's own machine): the next session takes the run
            "ended": not rec.released and rec.ended()}


def data_status(cfg: Config, records: list[L.LedgerRecord]) -> dict[str, Any]:
    """The dataset the next session trains on (data.url's manifest, else data.dir's) and the last pull."""
    from ..data.manifest import MANIFEST, load_manifest, parse_manifest

    out: dict[str, Any] = {"url": cfg.data.url or None, "dir": cfg.data.dir, "problem": None}
    try:
        if cfg.data.url:
            from ..data.remote import data_store

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
    pulled = [r for r in records if r.data]
    out["last_pull"] = ({"session": pulled[-1].session, **(pulled[-1].data or {})} if pulled else None)
    return out


def _plan_or_problem(out: dict[str, Any], inp: PlanInput):
    try:
        return plan(inp)
    except BatonError as e:  # a budget that cannot plan is worth reporting, not a reason to hide the status
        out["plan_problem"] = str(e)
        return None
