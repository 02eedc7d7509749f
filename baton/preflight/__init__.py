"""`baton preflight`: every property the run relies on, proven on this machine, cheapest first.

Stages run in order and each leaves JSON evidence; ``preflight.json`` holds all of it and ``report.md``
renders it as a scorecard. A stage that crashes is a failed stage with its error; a stage not run is
"not proven". Nothing is claimed that was not measured in this invocation.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import extras
from ..errors import BatonError
from ..versions import versions
from .core import STAGES, Context, StageResult
from .legs import stage_resume, stage_stop_probe, stage_throughput
from .report import render, scorecard
from .static import stage_construct, stage_data, stage_storage

log = logging.getLogger(__name__)

RUNNERS = {
    "construct": stage_construct,
    "data": stage_data,
    "storage": stage_storage,
    "throughput": stage_throughput,
    "resume": stage_resume,
    "stop_probe": stage_stop_probe,
}


def parse_stages(text: str | None) -> list[str]:
    if not text:
        return list(STAGES)
    chosen = [s.strip().replace("-", "_") for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in RUNNERS]
    if not chosen:
        raise BatonError(f"--stages {text!r} names no stage (choose from {', '.join(STAGES)}, or leave it out for all)")
    if unknown:
        raise BatonError(f"unknown preflight stage(s) {', '.join(unknown)} (choose from {', '.join(STAGES)})")
    return [s for s in STAGES if s in chosen]  # always in the cheap-first order


def run_preflight(config: str, out: Path, stages: list[str], scale: str = "tiny", overrides: Sequence[str] = (),
                  store_url: str | None = None, leg_steps: int | None = None, session_hours: float = 12.0,
                  keep_work: bool = False, resume_overrides: Sequence[str] = ()) -> dict[str, Any]:
    if scale not in ("tiny", "real"):
        raise BatonError(f"--scale must be tiny or real, got {scale!r}")
    out.mkdir(parents=True, exist_ok=True)
    from ..config import load_config

    cfg = load_config(config, list(overrides))
    # Scratch runs go to the configured store (that is what must be proven), under <run>-preflight-*.
    ctx = Context(config, list(overrides), scale, out, store_url or cfg.store.url,
                  leg_steps or (4 if scale == "tiny" else 2), session_hours, list(resume_overrides))
    t0 = time.time()
    lease = _hold_scratch_runs(ctx, t0) if any(s in stages for s in SCRATCH_STAGES) else None
    try:
        for name in STAGES:
            if name not in stages:
                ctx.results[name] = StageResult(name, status="not proven", error="stage not selected").finish()
                continue
            log.info("preflight: %s ...", name)
            started = time.time()
            result = RUNNERS[name](ctx)
            ctx.results[name] = result
            _bill(ctx, name, started, result)
            log.info("preflight: %s %s in %.1fs%s", name, result.status.upper(), result.seconds,
                     f" ({result.error})" if result.error else "")
    finally:
        if lease is not None:
            lease.release()
    _plot_throughput(ctx)
    _plot_forecast(ctx)
    rows = scorecard(ctx.results)
    verdict = "PASS" if all(r["result"] != "fail" for r in rows) and any(r["result"] == "pass" for r in rows) else "FAIL"
    doc = {
        "format": "baton-preflight-v1",
        "verdict": verdict,
        "config": config,
        "overrides": list(overrides),
        "resume_overrides": list(resume_overrides),
        "scale": scale,
        "store": _safe_store(ctx),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t0, 3),
        "machine": _machine(),
        "versions": versions(),
        "resolved_config": ctx.cfg.to_dict(),
        "stages": {k: v.to_dict() for k, v in ctx.results.items()},
        "scorecard": rows,
    }
    (out / "preflight.json").write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    (out / "report.md").write_text(render(doc), encoding="utf-8")
    if not keep_work:
        shutil.rmtree(ctx.work, ignore_errors=True)
    return doc


# The stages that write scratch runs to the store (<run>-preflight-<stage>): each empties its prefix first.
SCRATCH_STAGES = ("storage", "resume", "stop_probe")


def _hold_scratch_runs(ctx: Context, started: float):
    """The lease of ``<run>-preflight``, held while the stages run: two preflights of one run against one store
    would empty and roll each other's scratch runs and both fail with a misleading error. The second is refused
    in one line instead; a preflight whose process died frees them at once on its machine, elsewhere once its
    lease expires."""
    from ..errors import LeaseHeld, StoreError
    from ..planning.ledger import new_session_id
    from ..store import open_store
    from ..store.lease import Lease, read_lease

    store = open_store(ctx.store_url)
    name = f"{ctx.cfg.run.name}-preflight"
    lease = Lease(store, name, new_session_id(started), ctx.cfg.store.lease_seconds, started=started)
    try:
        lease.acquire()
    except StoreError as e:
        # A store that cannot hold a lease cannot hold a checkpoint either: the storage stage fails on it and says
        # why, in the scorecard beside the stages that need no store.
        log.warning("preflight: could not take the lease of %s (%s); the stages run without it", name, e)
        return None
    except LeaseHeld:
        found = read_lease(store, name)
        who = found[0].holder() if found is not None else "another session"
        raise BatonError(f"another `baton preflight` of run {ctx.cfg.run.name!r} is using its scratch runs in "
                         f"{store.describe()} ({who}): wait for it to end (one whose machine died frees them "
                         "store.lease_seconds after its last renewal), or run this one under another run.name"
                         ) from None
    lease.start()
    return lease


def _bill(ctx: Context, name: str, started: float, result: StageResult) -> None:
    """Every stage is a billed session in the run's ledger, failed ones too."""
    import torch

    from ..planning.ledger import SessionLedger
    from ..store import open_store

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        led = SessionLedger(open_store(ctx.store_url), ctx.cfg.run.name, started,
                            device="cuda" if gpus else "cpu", accelerators=max(1, gpus),
                            bill_factor=float(max(1, gpus)), tokens_per_step=ctx.scaled.tokens_per_step)
        led.rec.kind = f"preflight:{name}"
        led.end(f"preflight {name} {result.status}", None, 0.0)
    except Exception as e:  # the bill must not hide the stage's own result
        log.warning("could not record preflight stage %s in the ledger: %s", name, e)


def _safe_store(ctx: Context) -> str:
    from ..store import open_store

    return open_store(ctx.store_url).describe()


def _machine() -> dict[str, Any]:
    import os

    import torch

    from ..runtime import cuda

    gpu = [cuda.name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "gpus": gpu,
            "python": platform.python_version()}


def _plot_throughput(ctx: Context) -> None:
    res = ctx.results.get("throughput")
    if not res or not res.numbers.get("cells") or not extras.plotting("the preflight's throughput plot"):
        return
    plt = extras.pyplot("the preflight's throughput plot")

    cells = res.numbers["cells"]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * len(cells)))
    labels = [c["label"] for c in cells]
    values = [c["tokens_per_s"] or 0 for c in cells]
    bars = ax.barh(labels, values, color=["#2ca02c" if c["status"] == "ok" else "#d62728" for c in cells])
    for bar, c in zip(bars, cells):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {c['status']}", va="center", fontsize=8)
    ax.set_xlabel("tokens/s")
    ax.set_title("throughput grid")
    fig.tight_layout()
    fig.savefig(ctx.out / "throughput.png", dpi=110)
    plt.close(fig)
    res.artifacts.append("throughput.png")


def _plot_forecast(ctx: Context) -> None:
    """The throughput stage's simulated relay, drawn: the finish date's CDF and the cadence's cost."""
    res = ctx.results.get("throughput")
    sim = res.numbers.get("simulated") if res else None
    if res is None or not sim or sim.get("problem") or not extras.plotting("the preflight's forecast plots"):
        return
    import numpy as np

    from ..planning.charts import plot_cadence, plot_finish_cdf
    from ..planning.plan import parse_instant

    plot_finish_cdf(np.asarray(sim["finish_quantiles"]), ctx.out / "finish.png", planned=parse_instant(sim["plan_eta"]))
    res.artifacts.append("finish.png")
    if sim.get("curve"):
        plot_cadence(sim["curve"], sim["ckpt_minutes"], ctx.out / "cadence.png")
        res.artifacts.append("cadence.png")
