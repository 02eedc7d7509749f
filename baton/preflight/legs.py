"""Preflight stages that train: throughput, resume (three legs), stop probe (half, wipe, finish)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import extras
from ..checkpoint.pull import read_pointer
from ..model.llama import param_count
from ..runtime.device import pick_device
from ..store import delete_prefix, open_store
from .core import Context, StageResult, finite, timed

RESUME_LINE = re.compile(r"auto-resume: .* says step (\d+)")


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def _fail_detail(p) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    return f"exit {p.returncode}: " + " | ".join(lines[-3:])


@timed
def stage_throughput(ctx: Context) -> StageResult:
    from ..bench import pick, precision_for, run_grid
    from ..planning.plan import PlanInput, plan
    from ..runtime import attention
    from ..runtime.autotune import AUTOCAST

    r = StageResult("throughput")
    cfg = ctx.scaled
    device = pick_device(cfg.train.device)
    micro = cfg.train.micro_batch
    if not isinstance(micro, int):  # "auto": what `baton train` would pick on this device, from the whole batch
        from ..runtime.autotune import auto_micro_batch

        micro = auto_micro_batch(cfg, device, cfg.train.global_batch)[0]
    micros = sorted({micro, max(1, micro // 2)})
    # The attention a session on this device runs ("auto" resolved as `baton train` resolves it).
    attn, _ = attention.resolve(cfg, device, AUTOCAST.get(precision_for(cfg, device)))
    cells = run_grid(cfg, [attn], [cfg.data.seq_len], micros, [cfg.model.grad_ckpt], [False],
                     cfg.tokens_per_step, device, warmup=1, steps=3, target_tokens=ctx.cfg.total_steps * ctx.cfg.tokens_per_step)
    r.numbers["cells"] = [{"label": c.label, "status": c.status, "tokens_per_s": c.tokens_per_s,
                           "optimizer_seconds": c.optim_seconds, "peak_bytes": c.peak_bytes, "reason": c.reason}
                          for c in cells]
    best = pick(cells)
    r.check("every grid cell ran or was recorded as OOM", all(c.status in ("ok", "OOM") for c in cells),
            ", ".join(f"{c.label}: {c.status}" for c in cells))
    measured = best is not None and finite(best.tokens_per_s)
    if not r.check("a fastest cell was measured", measured) or best is None or best.tokens_per_s is None:
        return r
    r.numbers["rate_tokens_per_s"] = best.tokens_per_s
    r.numbers["picked"] = best.label
    real = ctx.cfg
    p = plan(PlanInput(total_steps=real.total_steps, tokens_per_step=real.tokens_per_step, rate=best.tokens_per_s,
                       session_hours=ctx.session_hours, margin_hours=min(0.25, ctx.session_hours / 10)))
    r.numbers["plan"] = p.to_dict()
    # The same plan with sessions cut at random: no ledger yet, so at the cautious rate (as if every session could
    # be the one cut), with the checkpoint cycle and the cold pull the storage stage measured, if it ran.
    from ..planning.simulate import forecast

    st = ctx.results.get("storage")
    cycle = st.numbers.get("save_seconds", 0) + st.numbers.get("push_verify_seconds", 0) if st else 0.0
    startup = st.numbers.get("cold_pull_seconds", 0.0) if st else 0.0
    from ..planning.cadence import resolve_cadence

    cadence = resolve_cadence(real.budget.ckpt_minutes, [], cycle, ctx.session_hours, p.input.usable_seconds / 3600)
    r.numbers["cadence"] = cadence.to_dict()
    r.numbers["simulated"] = forecast(replace(p.input, ckpt_seconds=cycle, startup_seconds=startup,
                                              ckpt_every=real.train.ckpt_every, ckpt_every_s=cadence.minutes * 60),
                                      [], runs=300, curve=bool(cycle))
    r.check("the plan's sessions are contiguous and end at the horizon",
            p.sessions[0].start_step == 0 and p.sessions[-1].stop_after_steps == real.total_steps
            and all(a.stop_after_steps == b.start_step for a, b in zip(p.sessions, p.sessions[1:])),
            f"{len(p.sessions)} sessions, ETA {p.to_dict()['eta']}")
    return r


def _scratch_cleaned(stage: str):
    """Whatever the stage's outcome, its scratch run leaves nothing in the store."""

    def wrap(fn):
        def run(ctx: Context) -> StageResult:
            try:
                return fn(ctx)
            finally:
                delete_prefix(open_store(ctx.store_url), f"{ctx.run_name(stage)}/")

        run.__name__ = fn.__name__
        return run

    return wrap


@timed
@_scratch_cleaned("resume")
def stage_resume(ctx: Context) -> StageResult:
    """Three legs; the local run folder is deleted before each resume, so only the store can help."""
    r = StageResult("resume")
    n = ctx.leg_steps
    horizon = 3 * n
    run, run_dir, store = _scratch(ctx, "resume")
    legs: list[dict[str, Any]] = []
    cursors: list[int | None] = []
    resumes: list[int | None] = []
    for k in (1, 2, 3):
        if k > 1:
            shutil.rmtree(run_dir)  # a new machine: nothing local survives
        p = ctx.train_leg("resume", horizon, k * n, resumed=k > 1)
        legs.append({"leg": k, "exit": p.returncode})
        if not r.check(f"leg {k} exits 0", p.returncode == 0, _fail_detail(p) if p.returncode else ""):
            return r
        if k > 1:
            found = RESUME_LINE.search(p.stderr)
            resumes.append(int(found.group(1)) if found else None)
        pointer = read_pointer(store, run)
        cursors.append(pointer.cursor.get("samples_consumed") if pointer else None)
        legs[-1].update(pointer_step=pointer.step if pointer else None, samples=cursors[-1])
    metrics = _metrics(run_dir)
    loss = {m["step"]: m["loss"] for m in metrics}
    around = [{"resume_at": b, "loss_before": loss.get(b), "loss_after": loss.get(b + 1)} for b in (n, 2 * n)]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    r.numbers.update(legs=legs, resumed_at=resumes, samples_consumed=cursors, loss_around_resume=around,
                     loss_trace=[[m["step"], m["loss"]] for m in metrics], val_loss=summary.get("val_loss"),
                     params=summary.get("params"))
    r.check("every resume reports the step it found in the store", resumes == [n, 2 * n], resumes)
    counts = [c for c in cursors if isinstance(c, int)]
    r.check("cursor sample counts strictly increasing and distinct",
            len(counts) == len(cursors) and all(a < b for a, b in zip(counts, counts[1:])), cursors)
    r.check("sample counts are step x samples per step",
            cursors == [k * n * ctx.scaled.train.global_batch for k in (1, 2, 3)], cursors)
    r.check("loss finite on both sides of every resume",
            all(finite(a["loss_before"]) and finite(a["loss_after"]) for a in around),
            "; ".join(f"step {a['resume_at']}: {a['loss_before']:.4f} -> {a['loss_after']:.4f}" for a in around
                      if finite(a["loss_before"]) and finite(a["loss_after"])))
    r.check("loss trace complete across the wipes", [m["step"] for m in metrics] == list(range(1, horizon + 1)))
    r.check("resumed model has the configured parameter count", summary.get("params") == param_count(ctx.scaled.model),
            summary.get("params"))
    _plot_legs(ctx, metrics, [n, 2 * n], r)
    return r


@timed
@_scratch_cleaned("stop")
def stage_stop_probe(ctx: Context) -> StageResult:
    """Stop at half the horizon, wipe, resume from the store alone to the horizon, evaluate, export."""
    r = StageResult("stop_probe")
    half = ctx.leg_steps
    horizon = 2 * half
    run, run_dir, store = _scratch(ctx, "stop")
    gb = ctx.scaled.train.global_batch

    p1 = ctx.train_leg("stop", horizon, half)
    r.check("leg 1 exits 0", p1.returncode == 0, _fail_detail(p1) if p1.returncode else "")
    ptr1 = read_pointer(store, run)
    s1 = json.loads((run_dir / "run_summary.json").read_text()) if (run_dir / "run_summary.json").is_file() else {}
    r.check("the stop lands on the boundary", s1.get("steps_done") == half, s1.get("steps_done"))
    r.check("the pointer names the stop step",
            ptr1 is not None and ptr1.step == half and ptr1.path == f"ckpt/step-{half}",
            ptr1.path if ptr1 else ptr1)
    r.check("the local copy was pruned after verification", not any((run_dir / "ckpt").glob("step-*")))
    r.check("validation skipped on a segment that ends before the horizon", s1.get("val_loss") is None)
    shutil.rmtree(run_dir, ignore_errors=True)

    p2 = ctx.train_leg("stop", horizon, horizon, resumed=True)
    r.check("leg 2 exits 0", p2.returncode == 0, _fail_detail(p2) if p2.returncode else "")
    found = RESUME_LINE.search(p2.stderr)
    r.check("leg 2 resumes from the store at the stop step", found is not None and int(found.group(1)) == half,
            found.group(0) if found else found)
    ptr2 = read_pointer(store, run)
    s2 = json.loads((run_dir / "run_summary.json").read_text()) if (run_dir / "run_summary.json").is_file() else {}
    c1, c2 = ptr1.cursor if ptr1 else {}, ptr2.cursor if ptr2 else {}
    r.check("sample counts are step x samples per step",
            c1.get("samples_consumed") == half * gb and c2.get("samples_consumed") == horizon * gb,
            [c1.get("samples_consumed"), c2.get("samples_consumed")])
    r.check("dataset and permutation fingerprints identical across the resume",
            bool(c1) and all(c1[k] == c2.get(k) for k in ("dataset_fingerprint", "permutation_fingerprint")))
    r.check("tokens consumed equal the horizon", s2.get("tokens_consumed") == horizon * ctx.scaled.tokens_per_step,
            s2.get("tokens_consumed"))
    r.check("parameter count as configured", s2.get("params") == param_count(ctx.scaled.model), s2.get("params"))
    r.check("final evaluation ran", finite(s2.get("val_loss")), s2.get("val_loss"))
    r.check("final pointer rolled to the completed run",
            ptr2 is not None and ptr2.complete and ptr2.step == horizon and ptr2.final is not None)
    r.check("the exported model loads with transformers", _loads(run_dir / "final"))
    failed = [c.name for c in r.checks if not c.ok]
    r.numbers["verdict"] = "VERDICT PASS" if not failed else f"VERDICT FAIL {failed}"
    r.numbers.update(val_loss=s2.get("val_loss"), stop_step=half, horizon=horizon)
    return r


def _scratch(ctx: Context, stage: str):
    """A scratch run for ``stage``: its name, an empty local folder and an empty prefix in the store."""
    run = ctx.run_name(stage)
    run_dir = ctx.work / "runs" / run
    store = open_store(ctx.store_url)
    delete_prefix(store, f"{run}/")
    shutil.rmtree(run_dir, ignore_errors=True)
    return run, run_dir, store


def _loads(folder: Path) -> bool:
    try:
        from transformers import AutoModelForCausalLM

        from ..model.export import library_bars_off

        with library_bars_off():
            AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True)  # never a pickle (.bin) file
        return True
    except Exception:
        return False


def _plot_legs(ctx: Context, metrics: list[dict[str, Any]], resumes: list[int], r: StageResult) -> None:
    if not extras.plotting("the preflight's resume plot"):
        return
    plt = extras.pyplot("the preflight's resume plot")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], marker=".", color="#1f77b4")
    for b in resumes:
        ax.axvline(b + 0.5, color="#d62728", linestyle="--", linewidth=1)
        ax.text(b + 0.6, ax.get_ylim()[1], "wipe + resume", color="#d62728", fontsize=7, va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("loss across the resume legs")
    fig.tight_layout()
    path = ctx.out / "loss_legs.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    r.artifacts.append(path.name)
