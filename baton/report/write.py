"""report.md, report.json and the plots, from the gathered numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import extras
from ..planning import ledger as L
from ..runs import split_run
from .plots import plot_branches, plot_hours, plot_loss, plot_throughput


def _f(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "—"


def write_report(doc: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    draw = extras.plotting("the report's plots")
    if draw:
        plots = {"loss": plot_loss(doc, out / "loss.png"), "throughput": plot_throughput(doc, out / "throughput.png"),
                 "hours": plot_hours(doc, out / "hours.png")}
        if doc.get("branches") or doc.get("evals"):
            plots["validation"] = plot_branches(doc, out / "validation.png")
    tps = doc["tokens_per_step"]
    step = doc["pointer_step"]
    led = doc["ledger"]
    lines = [f"# Run report: {doc['run']}", "",
             f"Store: {doc['store']}. Read from the store alone: the pointer's checkpoint (its metrics.jsonl) and the "
             "ledger; steps a running session has not checkpointed yet are not in it.", ""]
    cut = doc.get("shortened")
    if step is None:
        # "step 0 of N" would read as a checkpoint at step 0; there is none to report progress from.
        lines.append(f"- progress: no verified checkpoint in the store yet (the next `baton train` starts at step 0 "
                     f"of {doc['total_steps']:,})")
    else:
        lines += [f"- progress: step {step:,} of {doc['total_steps']:,} ({step * tps:,} of "
                  f"{doc['total_steps'] * tps:,} tokens)" + (", run complete" if doc["complete"] else "")
                  + (f"; the horizon was shortened from the planned {cut['planned']:,} steps by anytime mode at "
                     f"step {cut['step']:,}" if cut else ""),
                  f"- last training loss: {_f(doc['last_train_loss'], '.4f')} (step {step})"]
    if doc["val"]:
        v = doc["val"][-1]
        lines.append(f"- last validation: loss {_f(v['val_loss'], '.4f')}, perplexity {_f(v['val_ppl'], '.2f')} "
                     f"(step {v['step']})")
    lines.append(f"- billed: {led['billed_hours']:.4f} h over {led['sessions']} session(s)"
                 + (" (the main run's and its cooldown branches')" if doc.get("branches") or split_run(doc["run"])[1]
                    else "")
                 + (f"; quota period {led['period_hours']:.4f} of {led['quota_hours']:g} h" if led["period_hours"]
                    is not None else "") + (f"; cap {led['cap_hours']:g} h" if led["cap_left"] is not None else ""))
    if doc["complete"]:
        lines.append("- ETA: done")
    elif doc["eta"]:
        lines.append(f"- ETA: {doc['eta']} ({doc['sessions_left']} more session(s))")
    else:
        lines.append(f"- ETA: {doc['eta_problem'] or 'needs a measured rate and budget.session_hours'}"
                     + (f"; {doc['stepping_hours_left']:.2f} h of stepping left" if doc["stepping_hours_left"] else ""))
    lines += ["", "## Sessions", "", "| # | session | started | steps | tokens/s | MFU | billed h | outcome |",
              "|---|---|---|---|---|---|---|---|"]
    for s in doc["sessions"]:
        lines.append(f"| {s['n']} | {s['session']} | {s['started']} | {s['steps_from']} → {s['steps_to']} | "
                     f"{_f(s['tokens_per_s'], ',.0f')} | {_f(s['mfu'], '.1%')} | {s['billed_hours']:.4f} | "
                     f"{s['outcome']}{L.takeover_note(s.get('took_over'))} |")
    taken = sum(1 for s in doc["sessions"] if s.get("took_over"))
    fenced = sum(1 for s in doc["sessions"] if str(s["outcome"]).startswith("fenced"))
    if taken or fenced:
        lines += ["", f"Concurrency: {taken} takeover(s) of the run's lease, {fenced} session(s) fenced (stopped "
                      "because another session took the run over; see docs/concurrency.md)."]
    lines += ["", f"Session ends at steps: {', '.join(map(str, doc['session_ends'])) or 'none'}; resumes at steps: "
              f"{', '.join(map(str, doc['resumes'])) or 'none'}.", ""]
    lines += _startup(doc["sessions"])
    resolved = [(s["n"], k, v) for s in doc["sessions"] for k, v in sorted((s.get("settings") or {}).items())]
    if resolved:
        lines += ["How each session resolved its `auto` settings on its machine:", ""]
        lines += [f"- session {n}: {k}: {v}" for n, k, v in resolved] + [""]
    if doc["spikes"]:
        lines += ["## Loss spikes (train.spike_threshold)", "", "| step | loss | MADs above median | windows |",
                  "|---|---|---|---|"]
        lines += [f"| {p['step']} | {p['loss']:.4f} | {p['score']:.1f} | {p['windows']} |" for p in doc["spikes"]]
        lines.append("")
    lines += _branch_lines(doc) + _predicted(doc) + _anytime(doc)
    lines += _forecast(doc, out, plots, draw)
    lines += ["## Plots", ""] + ([f"![{k}]({p.name})" for k, p in plots.items()] if draw else
                                 [f"Not drawn: matplotlib is not installed ({extras.fix('matplotlib')})."])
    if doc["problems"]:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in doc["problems"]]
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "report.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1),
                                     encoding="utf-8")
    return out / "report.md"


def _branch_lines(doc: dict[str, Any]) -> list[str]:
    """The cooldown branches (`baton anneal`) beside the main run: where each starts, how far it is, its loss."""
    if not doc.get("branches"):
        return []
    tps = doc["tokens_per_step"]
    main = {v["step"]: v["val_loss"] for v in doc.get("evals", [])} | {v["step"]: v["val_loss"] for v in doc["val"]}
    lines = ["## Cooldown branches", "",
             "| branch | from step | cooldown tokens | progress | validation loss at its end | at its branch point |",
             "|---|---|---|---|---|---|"]
    for b in doc["branches"]:
        pts = {v["step"]: v["val_loss"] for v in b.get("evals", [])} | {v["step"]: v["val_loss"] for v in b["val"]}
        end = max(pts) if pts else None
        progress = ("complete" if b["complete"] else f"step {b['pointer_step']:,} of {b['total_steps']:,}"
                    if b["pointer_step"] is not None else "not started") + (f" ({b['problem']})" if b["problem"] else "")
        lines.append(f"| {b['name']} | {b['step']:,} ({b['step'] * tps:,} tokens) | {b['tokens']:,} | {progress} | "
                     + (f"{pts[end]:.4f} (step {end:,})" if end is not None else "—") + " | "
                     + _f(main.get(b["step"]), ".4f") + " |")
    lines += ["", "A branch point's loss is the main run's validation there (`train.eval_every`, or `baton eval --step "
              "N`); `baton eval --branch NAME` scores a branch's checkpoints.", ""]
    return lines


def _predicted(doc: dict[str, Any]) -> list[str]:
    """What each session's start forecast (the plan's ETA, the simulated P50 and P90), beside the actual finish."""
    rows, done = doc.get("forecasts") or [], doc.get("finished")
    if not rows and not done:
        return []
    lines = ["## Predicted and actual finish", ""]
    if rows:
        lines += ["| session | from step | to horizon | plan ETA | P50 | P90 | GPU-hours P50 / P90 |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {f['n']} | {f['step']:,} | {f['horizon']:,} | {f['plan_eta']} | {f['p50']} | {f['p90']} | "
                  f"{f['billed_hours_p50']:.3g} / {f['billed_hours_p90']:.3g} |" for f in rows]
        lines.append("")
    first = rows[0] if rows else None
    predicted = (f"predicted (session {first['n']}'s start, step {first['step']:,} of {first['horizon']:,}): plan ETA "
                 f"{first['plan_eta']}, P50 {first['p50']}, P90 {first['p90']}") if first else \
        "no forecast was recorded (a session records one when it starts with a measured rate and budget.session_hours)"
    actual = (f"actual: finished {done['at']} at step {done['step']:,} (session {done['session']})" if done else
              f"actual: not finished; step {doc['pointer_step'] or 0:,} of {doc['total_steps']:,} so far")
    return lines + [f"- {predicted}", f"- {actual}", ""]


def _anytime(doc: dict[str, Any]) -> list[str]:
    """Anytime mode's decisions, as each session logged them (docs/anytime-mode.md)."""
    events = doc.get("anytime") or []
    if not events:
        return []
    lines = ["## Anytime mode", "", "| session | step | decision | horizon | line |", "|---|---|---|---|---|"]
    lines += [f"| {e['n']} | {e['step']:,} | {e['action']} | {e['horizon_from']:,} → {e['horizon_to']:,} | "
              f"{e['line']} |" for e in events]
    return lines + [""]


def _startup(sessions: list[dict[str, Any]]) -> list[str]:
    """Each session's start-up: pulling, building, the first step and the compile in it (cold, or warm from the
    run's compile cache). Sessions recorded before the split show their total only."""
    rows = [s for s in sessions if s.get("startup") or s.get("startup_seconds") is not None]
    if not rows:
        return []
    lines = ["## Start-up", "", "Command start to first step, and the compile inside the first step (its excess over "
             "the second step).", "", "| # | pull s | build s | first step s | compile | compile s | total s |",
             "|---|---|---|---|---|---|---|"]
    for s in rows:
        u = s.get("startup")
        if u is None:
            lines.append(f"| {s['n']} | — | — | — | — | — | {_f(s['startup_seconds'], '.1f')} |")
            continue
        total = u["pull"] + u["build"] + (u["compile_seconds"] or 0.0)
        lines.append(f"| {s['n']} | {u['pull']:.1f} | {u['build']:.1f} | {u['first_step']:.1f} | {u['compile']} | "
                     f"{_f(u['compile_seconds'], '.1f')} | {total:.1f} |")
    notes = [(s["n"], s["startup"]["note"]) for s in rows if s.get("startup") and s["startup"].get("note")]
    return lines + [""] + [f"- session {n}: {note}" for n, note in notes] + ([""] if notes else [])


def _forecast(doc: dict[str, Any], out: Path, plots: dict[str, Path], draw: bool) -> list[str]:
    """The simulated finish from here (``baton simulate`` at the ledger's interruption rate) and the cadence's cost."""
    sim = doc.get("simulated")
    if not sim:
        return []
    if sim.get("problem"):
        return ["## Forecast", "", f"Not simulated: {sim['problem']}", ""]
    import numpy as np

    from ..planning.charts import plot_cadence, plot_finish_cdf
    from ..planning.plan import parse_instant

    planned = parse_instant(sim["plan_eta"]) if sim.get("plan_eta") else None
    if draw:
        plots["finish"] = plot_finish_cdf(np.asarray(sim["finish_quantiles"]), out / "finish.png", planned=planned)
    if draw and sim.get("curve"):
        plots["cadence"] = plot_cadence(sim["curve"], sim["ckpt_minutes"], out / "cadence.png")
    lines = ["## Forecast", "",
             f"Simulated from the store's pointer ({sim['runs']} runs at {sim['interrupt_rate_per_hour']:.3g} "
             f"interruptions per session hour: {sim['why']}): finish P50 {sim['p50']}, P90 {sim['p90']}; "
             f"{sim['billed_hours_p50']:.2f} (P50) to {sim['billed_hours_p90']:.2f} (P90) more GPU-hours billed. "
             f"Without interruptions: {sim['plan_eta']}."]
    cad = doc.get("cadence")
    if cad and (cad["auto"] or cad["ckpt_minutes"]):
        lines.append(f"Checkpoint cadence: {cad['reason']}.")
    return lines + [""]
