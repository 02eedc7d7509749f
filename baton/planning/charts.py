"""The simulator's two pictures (matplotlib, the `plot` extra): when the run finishes, as a distribution, and what
each checkpoint cadence costs. Drawn for `baton simulate --out`, `baton report` and the preflight report."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .. import extras


def _plt():
    return extras.pyplot("the simulator plots")


def plot_finish_cdf(finish: np.ndarray, path: Path, deadline: datetime | None = None,
                    planned: datetime | None = None) -> Path:
    """The empirical CDF of the simulated finish dates (epoch seconds), with the plan's ETA and the deadline."""
    plt = _plt()
    import matplotlib.dates as mdates

    xs = np.sort(finish)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.step([datetime.fromtimestamp(x, timezone.utc) for x in xs], np.arange(1, len(xs) + 1) / len(xs), where="post",
            label=f"simulated finish ({len(xs):,} runs)")
    if planned is not None:
        ax.axvline(planned, color="tab:green", linestyle=":", label="baton plan (no interruptions)")
    if deadline is not None:
        ax.axvline(deadline, color="red", linestyle="--", label="deadline")
    for q in (0.1, 0.5, 0.9):
        ax.axhline(q, color="grey", linewidth=0.5)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    fig.autofmt_xdate()
    ax.set_ylabel("P(finished by then)")
    ax.set_title("finish date")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def plot_cadence(curve: dict[str, Any], chosen_minutes: float, path: Path) -> Path:
    """Expected lost, checkpointing and total overhead hours against the timed cadence."""
    plt = _plt()
    pts = curve["points"]
    m = [p["minutes"] for p in pts]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(m, [p["lost_hours"] for p in pts], "o-", label="steps lost to interruptions (h)")
    ax.plot(m, [p["checkpoint_hours"] for p in pts], "s-", label="checkpointing (h)")
    ax.plot(m, [p["overhead_hours"] for p in pts], "^-", label="all overhead: wall clock - stepping (h)")
    if chosen_minutes:
        ax.axvline(chosen_minutes, color="red", linestyle="--", label=f"cadence used: {chosen_minutes:.1f} min")
    if curve.get("fitted_optimum_minutes"):
        ax.axvline(curve["fitted_optimum_minutes"], color="grey", linestyle=":",
                   label=f"simulated optimum: {curve['fitted_optimum_minutes']:.1f} min")
    ax.set_xscale("log")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ax.set_xticks(m)
    ax.xaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("minutes between checkpoints")
    ax.set_ylabel("expected hours")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, path)


def save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write and close a figure (every plot the views and the report draw)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
