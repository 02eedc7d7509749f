"""The report's PNGs (matplotlib, the `plot` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import extras
from ..planning.charts import save_figure


def _plt():
    return extras.pyplot("the report plots")


def _mark_sessions(ax, doc: dict[str, Any], scale: float) -> None:
    labelled = False
    for i, s in enumerate(doc["sessions"], 1):
        if s["steps_from"]:
            ax.axvline(s["steps_from"] * scale, color="tab:green", linestyle=":", linewidth=1,
                       label=None if labelled else "resumed")
            labelled = True
        if s["steps_to"] is not None:
            ax.axvline(s["steps_to"] * scale, color="grey", linestyle="--", linewidth=1,
                       label="session end" if i == 1 else None)
            ax.annotate(f"S{i}", (s["steps_to"] * scale, 1), xycoords=("data", "axes fraction"), ha="right", va="top",
                        fontsize=8, color="grey")


def plot_loss(doc: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    tps = doc["tokens_per_step"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    rows = doc["rows"]
    ax.plot([r["step"] * tps for r in rows], [r["loss"] for r in rows], linewidth=1, label="train loss")
    if doc["val"]:
        ax.plot([v["step"] * tps for v in doc["val"]], [v["val_loss"] for v in doc["val"]], "o-", markersize=4,
                label="validation loss")
    if doc["spikes"]:
        ax.plot([p["step"] * tps for p in doc["spikes"]], [p["loss"] for p in doc["spikes"]], "x", color="red",
                markersize=8, label="loss spike")
    _mark_sessions(ax, doc, tps)
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss")
    ax.set_title(f"{doc['run']}: loss; sessions marked")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def plot_throughput(doc: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    names = [f"S{s['n']}" for s in doc["sessions"]]
    a.bar(names, [s["tokens_per_s"] or 0 for s in doc["sessions"]])
    a.set_title("tokens/s per session")
    b.bar(names, [100 * (s["mfu"] or 0) for s in doc["sessions"]], color="tab:orange")
    b.set_title("MFU per session (%, median of steps)")
    return save_figure(plt, fig, path)


def plot_hours(doc: dict[str, Any], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.5))
    total, xs, ys = 0.0, [0], [0.0]
    for s in doc["sessions"]:
        total += s["billed_hours"]
        xs.append(s["n"])
        ys.append(total)
    ax.step(xs, ys, where="post", label="billed hours (cumulative)")
    led = doc["ledger"]
    if led["quota_hours"]:
        ax.axhline(led["quota_hours"], color="red", linestyle="--", label=f"quota {led['quota_hours']:g} h per period")
    if led["cap_hours"]:
        ax.axhline(led["cap_hours"], color="black", linestyle=":", label=f"cap {led['cap_hours']:g} h")
    ax.set_xlabel("session")
    ax.set_ylabel("hours")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def plot_branches(doc: dict[str, Any], path: Path) -> Path:
    """Validation loss against tokens: the main run's (its own validations and `baton eval`'s) and each cooldown
    branch's, drawn from its branch point on the main run's curve to where it ended."""
    plt = _plt()
    tps = doc["tokens_per_step"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    main = {v["step"]: v["val_loss"] for v in doc.get("evals", [])}
    main.update({v["step"]: v["val_loss"] for v in doc["val"]})  # the run's own where both scored a step
    steps = sorted(main)
    if steps:
        ax.plot([s * tps for s in steps], [main[s] for s in steps], "o-", color="black", markersize=4,
                label=f"{doc['run']} (main run)")
    for b in doc.get("branches", []):
        pts = {v["step"]: v["val_loss"] for v in b.get("evals", [])}
        pts.update({v["step"]: v["val_loss"] for v in b["val"]})
        if not pts:
            continue
        xs = sorted(pts)
        start = [b["step"]] if b["step"] in main else []
        line = ax.plot([s * tps for s in start + xs], [(main | pts)[s] for s in start + xs], "-", linewidth=1.5)
        ax.plot([xs[-1] * tps], [pts[xs[-1]]], "*", markersize=11, color=line[0].get_color(),
                label=f"{b['name']}: {pts[xs[-1]]:.3f}" + ("" if b["complete"] else " (not finished)"))
        ax.axvline(b["step"] * tps, color=line[0].get_color(), linestyle=":", linewidth=0.8)
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{doc['run']}: validation loss; cooldown branches from the plateau (dotted: branch points)")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)
