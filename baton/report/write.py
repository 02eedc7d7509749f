"""report.md, report.json and the plots, from the gathered numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import extras
from ..planning import ledger as L
from .plots import plot_hours, plot_loss, plot_throughput


def _f(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "—"


def write_report(doc: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    draw = extras.plotting("the report's plots")
    if draw:
        plots = {"loss": plot_loss(doc, out / "loss.png"), "throughput": plot_throughput(doc, out / "throughput.png"),
                 "hours": plot_hours(doc, out / "hours.png")}
    tps = doc["tokens_per_step"]
    step = doc["pointer_step"]
    led = doc["ledger"]
    lines = [f"# Run report: {doc['run']}", "",
             f"Store: {doc['store']}. Read from the store alone: the pointer's checkpoint (its metrics.jsonl) and the "
             "ledger; steps a running session has not checkpointed yet are not in it.", ""]
    if step is None:
        # "step 0 of N" would read as a checkpoint at step 0; there is none to report progress from.
        lines.append(f"- progress: no verified checkpoint in the store yet (the next `baton train` starts at step 0 "
                     f"of {doc['total_steps']:,})")
    else:
        lines += [f"- progress: step {step:,} of {doc['total_steps']:,} ({step * tps:,} of "
                  f"{doc['total_steps'] * tps:,} tokens)" + (", run complete" if doc["complete"] else ""),
                  f"- last training loss: {_f(doc['last_train_loss'], '.4f')} (step {step})"]
    if doc["val"]:
        v = doc["val"][-1]
        lines.append(f"- last validation: loss {_f(v['val_loss'], '.4f')}, perplexity {_f(v['val_ppl'], '.2f')} "
                     f"(step {v['step']})")
    lines.append(f"- billed: {led['billed_hours']:.4f} h over {led['sessions']} session(s)"
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
    lines += _forecast(doc, out, plots, draw)
    lines += ["## Plots", ""] + ([f"![{k}]({p.name})" for k, p in plots.items()] if draw else
                                 [f"Not drawn: matplotlib is not installed ({extras.fix('matplotlib')})."])
    if doc["problems"]:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in doc["problems"]]
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "report.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1),
                                     encoding="utf-8")
    return out / "report.md"


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
