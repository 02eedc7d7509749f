"""The scorecard and the Markdown report, rendered only from the evidence in preflight.json."""

from __future__ import annotations

import json
from typing import Any

from .core import StageResult

MARK = {"pass": "✅", "fail": "❌", "not proven": "not proven"}
MARK_CHECK = {True: "✅", False: "❌", None: "not proven:"}

# (requirement, stage, the checks that prove it; None = every check of the stage)
ROWS: list[tuple[str, str | None, list[str] | None]] = [
    ("The training code constructs on this machine", "construct",
     ["config validates", "closed-form parameter count equals the built model", "forward loss is finite",
      "backward gives finite gradients for every parameter"]),
    ("Precision as configured: fp32 master weights, GradScaler exactly when fp16", "construct",
     ["precision asserted: fp32 master weights, GradScaler live exactly when fp16"]),
    ("The schedule's shape, measured", "construct",
     ["schedule: 1.0 at the warmup's end and the decay start, never rising after, above the floor at the end"]),
    ("The data on this machine: where it came from, how long the pull took", "data",
     ["the data is present on this machine, from where the config says"]),
    ("Data bytes match the manifest", "data", ["every shard hashes to its manifest entry"]),
    ("Resumption from the exact data position", "data",
     ["resume reads the same windows at every boundary", "labels are next-token",
      "same seed gives the same order, another seed another"]),
    ("Validation windows held out cleanly", "data",
     ["no validation window's first 64 tokens equal a training window's"]),
    ("Checkpoint push proven by the store (listing + ranged read-back), pointer read back, then prune", "storage",
     ["push verified against the store's listing and ranged read-back",
      "pointer read back names the pushed checkpoint", "local copy pruned only after verification"]),
    ("Cold pull from the store into an empty folder, sha-verified", "storage",
     ["cold pull into an empty folder, every sha256 checked", "scratch location cleaned up"]),
    ("Measured throughput, with the plan's ETA and GPU-hours", "throughput", None),
    ("Cold resume from an empty disk, three legs, position never drifting backwards", "resume",
     ["leg 1 exits 0", "leg 2 exits 0", "leg 3 exits 0", "every resume reports the step it found in the store",
      "cursor sample counts strictly increasing and distinct", "sample counts are step x samples per step",
      "resumed model has the configured parameter count"]),
    ("Loss continuous across the restarts", "resume",
     ["loss finite on both sides of every resume", "loss trace complete across the wipes"]),
    ("Stop at a boundary, resume from the store alone, evaluate and export", "stop_probe", None),
    ("Stable loss over a few thousand steps", None, None),
]


def scorecard(results: dict[str, StageResult]) -> list[dict[str, Any]]:
    rows = []
    for i, (req, stage, names) in enumerate(ROWS, 1):
        if stage is None:
            rows.append({"n": i, "requirement": req, "stage": "—", "result": "not proven",
                         "evidence": "a preflight is minutes long by design; see Limitations"})
            continue
        res = results[stage]
        if res.status == "not proven":
            rows.append({"n": i, "requirement": req, "stage": stage, "result": "not proven",
                         "evidence": res.error or "stage not run"})
            continue
        checks = {c.name: c for c in res.checks}
        wanted = names if names is not None else list(checks)
        missing = [n for n in wanted if n not in checks]
        failed = [checks[n] for n in wanted if n in checks and checks[n].ok is False]
        unproven = [checks[n] for n in wanted if n in checks and checks[n].ok is None]
        ok = not missing and not failed and bool(wanted) and not (names is None and res.error)
        if ok and unproven:
            rows.append({"n": i, "requirement": req, "stage": stage, "result": "not proven",
                         "evidence": "; ".join(c.detail for c in unproven)})
            continue
        if ok:
            evidence = "; ".join(f"{checks[n].detail}" for n in wanted if checks[n].detail)[:160] or "all checks pass"
        elif failed:
            evidence = "; ".join(f"{c.name}: {c.detail}" for c in failed)[:300]
        else:
            evidence = res.error or f"not reached: {', '.join(missing)}"
        rows.append({"n": i, "requirement": req, "stage": stage, "result": "pass" if ok else "fail",
                     "evidence": evidence})
    return rows


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def scorecard_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| # | requirement | stage | result | evidence |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['n']} | {_cell(r['requirement'])} | {r['stage']} | {MARK[r['result']]} | {_cell(r['evidence'])} |")
    return out


def proven_line(rows: list[dict[str, Any]]) -> str:
    """How much of the scorecard a verdict covers: a PASS of a few stages is not a PASS of all of them."""
    n = {k: sum(1 for r in rows if r["result"] == k) for k in ("pass", "fail", "not proven")}
    return f"{n['pass']} of {len(rows)} requirements proven" + (f", {n['fail']} failed" if n["fail"] else "") + (
        f", {n['not proven']} not proven" if n["not proven"] else "")


def render(doc: dict[str, Any]) -> str:
    st = doc["stages"]
    m = doc["machine"]
    lines = [
        f"# Preflight report: `{doc['config']}` at scale {doc['scale']}",
        "",
        f"**{'VERDICT PASS' if doc['verdict'] == 'PASS' else 'VERDICT FAIL'}** ({proven_line(doc['scorecard'])}) — "
        f"{doc['created']}, "
        f"{doc['seconds']:.0f} s on {m['platform']}, {m['cpus']} CPUs, GPUs: {', '.join(m['gpus']) or 'none'}; "
        f"baton {doc['versions']['baton']}, torch {doc['versions']['torch']}, transformers "
        f"{doc['versions']['transformers']}, git {doc['versions'].get('git_rev') or 'n/a'}. Store: {doc['store']}.",
        "",
        "## Scorecard",
        "",
        *scorecard_table(doc["scorecard"]),
        "",
        "## Stages",
        "",
        "| stage | result | seconds | checks passed |",
        "|---|---|---|---|",
    ]
    for name, s in st.items():
        passed = sum(c["ok"] is True for c in s["checks"])
        lines.append(f"| {name} | {MARK[s['status']]} | {s['seconds']:.1f} | {passed}/{len(s['checks'])} |")
    for i, (name, s) in enumerate(st.items(), 1):
        lines += ["", f"### {i}. {name} — {MARK[s['status']]}", ""]
        if s["error"]:
            lines += [f"**Error:** `{_cell(s['error'])}`", ""]
        for c in s["checks"]:
            lines.append(f"- {MARK_CHECK[c['ok']]} {c['name']}" + (f" — {_cell(c['detail'])}" if c["detail"] else ""))
        plot = (s["numbers"].get("schedule") or {}).get("plot")
        if plot:  # the construct stage's measured schedule, drawn
            lines += ["", "```text", *plot, "```"]
        if s["numbers"]:
            lines += ["", "<details><summary>measured numbers</summary>", "", "```json",
                      json.dumps(_trim(s["numbers"]), indent=1, default=str), "```", "", "</details>"]
        for a in s["artifacts"]:
            lines += ["", f"![{name}]({a})"]
    lines += _plan_section(st.get("throughput", {}), doc["scale"])
    lines += _limitations(doc)
    return "\n".join(lines) + "\n"


def _trim(numbers: dict[str, Any]) -> dict[str, Any]:
    out = dict(numbers)
    if isinstance(out.get("schedule"), dict):
        out["schedule"] = {k: v for k, v in out["schedule"].items() if k != "plot"}  # drawn above instead
    if isinstance(out.get("loss_trace"), list) and len(out["loss_trace"]) > 12:
        out["loss_trace"] = out["loss_trace"][:6] + ["…"] + out["loss_trace"][-6:]
    if isinstance(out.get("simulated"), dict):
        out["simulated"] = {k: v for k, v in out["simulated"].items() if k not in ("finish_quantiles", "curve")}
    if isinstance(out.get("plan"), dict):
        out["plan"] = {k: v for k, v in out["plan"].items() if k != "sessions"}
    return out


def _hours(h: float) -> str:
    """A tenth of an hour, or three digits below one: a plan of minutes is not "0.0 h"."""
    return f"{h:,.1f}" if h >= 1 else f"{h:.3g}"


def _plan_section(tp: dict[str, Any], scale: str) -> list[str]:
    p = (tp.get("numbers") or {}).get("plan")
    if not p:
        return ["", "## Plan", "", "Not proven: the throughput stage did not produce a rate."]
    lines = ["", "## Plan", "",
             f"At the measured {p['rate_tokens_per_s']:,.0f} tokens/s ({tp['numbers'].get('picked')}), the horizon of "
             f"{p['total_steps']:,} steps × {p['tokens_per_step']:,} tokens = {p['horizon_tokens']:,} tokens takes "
             f"**{_hours(p['stepping_hours'])} h** of stepping, {_hours(p['wall_hours'])} h of sessions and "
             f"**{_hours(p['billed_hours'])} GPU-hours** billed; ETA {p['eta']}.", ""]
    if scale == "tiny":
        lines += ["**Not the configured model's ETA:** at `--scale tiny` the rate is the stand-in model's, so these "
                  "hours, GPU-hours and this ETA are not proven for the configured shape; `--scale real` on the "
                  "target machine measures them.", ""]
    sim = (tp.get("numbers") or {}).get("simulated") or {}
    if sim.get("p50"):
        lines += [f"Simulated with sessions cut at random ({sim['runs']} runs, {sim['interrupt_rate_per_hour']:.3g} "
                  f"interruptions per session hour: {sim['why']}): finish P50 {sim['p50']}, P90 {sim['p90']}; "
                  f"{_hours(sim['billed_hours_p50'])} to {_hours(sim['billed_hours_p90'])} GPU-hours (P50 to P90); "
                  "`baton simulate` for other rates.", ""]
    elif sim.get("problem"):
        lines += [f"Not simulated: {sim['problem']}", ""]
    lines += ["| session | steps | stop_after_steps | hours |", "|---|---|---|---|"]
    for s in p["sessions"][:20]:
        lines.append(f"| {s['session']} | {s['start_step']:,} → {s['stop_after_steps']:,} | {s['stop_after_steps']} | "
                     f"{_hours(s['hours'])} |")
    if len(p["sessions"]) > 20:
        lines.append(f"| … | {len(p['sessions']) - 20} more sessions | | |")
    return lines


def _limitations(doc: dict[str, Any]) -> list[str]:
    lines = ["", "## Limitations: what this preflight does not prove", ""]
    lines.append("- **Stable loss over a few thousand steps** is not proven: a preflight runs minutes by design. "
                 "What is proven is narrower: the loss is finite, optimizer and schedule state survive a cold "
                 "resume, and the loss trace continues across the wipes.")
    if doc["scale"] == "tiny":
        lines.append("- **Scale tiny**: the training stages ran a small stand-in model "
                     f"({', '.join(k.split('.')[-1] for k in ('model.n_layers', 'model.hidden'))} reduced), so "
                     "checkpoint bytes, throughput and memory are those of the stand-in, not of the configured "
                     "shape. Rerun with `--scale real` on the target machine for those numbers.")
    if not doc["machine"]["gpus"]:
        lines.append("- **No GPU** was visible: GPU throughput, GPU memory and fp16/bf16 autocast on the "
                     "accelerator are not proven here.")
    for name, s in doc["stages"].items():
        if s["status"] == "not proven":
            lines.append(f"- Stage **{name}** was not run ({s['error']}).")
        elif s["status"] == "fail":
            lines.append(f"- Stage **{name}** failed: see its section; rows that depend on it are not proven.")
    return lines
