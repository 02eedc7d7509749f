"""The end of a session at the horizon: evaluation, export, the completed pointer; and the run summary."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoint.cycle import push_folder
from ..checkpoint.pointer import read_pointer, write_pointer
from ..data.prepare import TOKENIZER_FILE
from ..errors import BatonError, Fenced, StoreError
from ..evaluate.heldout import eval_micro_batch, window_losses
from ..model.optimizer import split_summary
from ..runtime import cuda, dist, slurm
from ..runtime.compiled import fallbacks
from ..runtime.memory import rss_peak
from ..versions import versions

if TYPE_CHECKING:
    from .core import Session

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(s: Session) -> dict[str, float]:
    """Loss and perplexity over the held-out windows, split across ranks and summed.

    Training may go on after it (``train.eval_every``), so it leaves no trace there: the model back in train
    mode, the random generators as they were (the model draws none today; a later one with dropout would).
    """
    p, st = s.parts, s.state
    rng = torch.get_rng_state(), (cuda.rng_state(p.device) if p.device.type == "cuda" else None)
    s.note_peak()  # before the reset below
    if p.device.type == "cuda":
        cuda.reset_peak(p.device)
    model = getattr(p.model, "module", p.model)
    model.eval()
    all_ids = p.data.val_window_ids()
    ids = all_ids[p.dist.rank :: p.world]
    loss_sum, count = 0.0, 0
    mb = eval_micro_batch(p.micro_batch, p.cfg.data.seq_len, p.cfg.model.vocab_size, p.autocast_dtype)
    # Sharded forwards are collectives: every rank runs as many as the busiest rank, the extra ones on
    # a window whose loss is not counted.
    n_fwd = -(-len(all_ids[:: p.world]) // mb) if p.parallel.sharded else -(-len(ids) // mb)
    for b in range(n_fwd):
        chunk = ids[b * mb : (b + 1) * mb]
        x, y = p.data.windows(chunk if len(chunk) else all_ids[:1])
        losses = window_losses(model, x.to(p.device), y.to(p.device), s.autocast)
        if len(chunk):
            loss_sum += float(losses.double().sum())
            count += len(chunk)
    model.train()
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        cuda.set_rng_state(rng[1], p.device)
    loss_sum = dist.total(loss_sum, p.device)
    count = int(dist.total(count, p.device))
    st.peak_eval = max(st.peak_eval, cuda.peak_allocated(p.device) if p.device.type == "cuda" else rss_peak())
    if p.device.type == "cuda":  # training's high-water mark from here on must not count this evaluation's
        cuda.reset_peak(p.device)
    if count == 0:
        return {}
    val_loss = loss_sum / count
    return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700)), "val_windows": count}

def validate(s: Session, step: int) -> dict[str, float]:
    """A periodic evaluation during training (``train.eval_every``): its values for the step's metrics row,
    with its cost in seconds, which the time budget counts before the next one."""
    t0 = time.perf_counter()
    val = evaluate(s)
    seconds = time.perf_counter() - t0
    s.budget.observe_eval(seconds)
    if val:
        s.state.val = {**val, "val_step": step}
    return {**val, "eval_seconds": round(seconds, 4)} if val else {}


def finish(s: Session) -> None:
    """At the horizon: final evaluation, export, push the export, and mark the run complete."""
    p, st = s.parts, s.state
    val = evaluate(s)
    if val:
        st.val = {**val, "val_step": st.step}
    log.info("validation: loss %.4f ppl %.2f over %d windows", val.get("val_loss", float("nan")),
             val.get("val_ppl", float("nan")), val.get("val_windows", 0))
    plain = s.checkpointer.plain_state()

    def publish_all() -> None:
        assert plain is not None  # rank 0 holds the full state
        try:
            _publish_final(s, plain[0])
        except Fenced:
            raise  # another session holds the run: it finishes it
        except (BatonError, OSError) as e:
            raise StoreError(f"the final model could not be published to {p.store.describe()}: {type(e).__name__}: "
                             f"{e}; the pointer still names the verified checkpoint at step {st.step}: fix the "
                             "store's problem, then rerun `baton train`, which publishes it again") from None
        if p.cfg.publish.url:
            from ..release.publish import final_revision, publish_trained

            if p.lease is not None:
                p.lease.verify()  # publish.url is outside the run's store: a fenced session publishes nothing
            try:
                publish_trained(p.cfg, plain[0], st.step, p.run_dir / "final", s.metrics_path,
                                final_revision(p.cfg))
            except Exception as e:  # noqa: BLE001 - the run is complete and verified: one line, whatever failed
                said = " ".join(f"{type(e).__name__}: {e}".split())
                branch = final_revision(p.cfg)
                raise StoreError(f"the run is complete, but publishing it to {p.cfg.publish.url} failed ({said}); "
                                 f"run `baton publish -c CONFIG{f' --branch {branch}' if branch else ''}` to finish "
                                 "publishing") from None

    dist.on_main(publish_all)


def _publish_final(s: Session, model: torch.nn.Module) -> None:
    p, st = s.parts, s.state
    from ..model.export import export_model

    pointer = read_pointer(p.store, p.run)
    if pointer is None or pointer.step != st.step:
        raise StoreError(f"expected the pointer at step {st.step} before publishing the final model")
    out = p.run_dir / "final"
    manifest = p.data.manifest["tokenizer"]
    export_model(model, Path(p.cfg.data.dir) / TOKENIZER_FILE, out, manifest["eos_token"],
                 meta={"run": p.run, "step": st.step, **_horizon_val(st.val, st.step), "config": p.cfg.to_dict()})
    files, _ = push_folder(p.store, out, f"{p.run}/final", p.cfg.store.verify)
    # The verified history stays in the pointer: retention in later sessions goes by it.
    write_pointer(p.store, pointer.completed(files, _horizon_val(st.val, st.step)))
    log.info("run %s complete: final model verified at %s/final; pointer marks the run complete",
             p.run, p.run)

def _horizon_val(val: dict[str, Any] | None, step: int) -> dict[str, Any]:
    """The horizon's own validation values (none when an earlier one is the newest)."""
    if not val or val.get("val_step") != step:
        return {}
    return {k: v for k, v in val.items() if k != "val_step"}


def summary(s: Session, tokens_per_s: float) -> dict[str, Any]:
    """run_summary.json: whole-run counters, this session's checkpoints, peaks (max over ranks), config."""
    p, st = s.parts, s.state
    gb = p.cfg.train.global_batch
    # Each rank's own high-water marks go to its log; the summary keeps the maximum over ranks.
    log.info("PEAK rank=%d train_bytes=%d eval_bytes=%d", p.dist.rank, st.peak_train, st.peak_eval)
    peak_train = int(dist.maximum(st.peak_train, p.device))
    peak_eval = int(dist.maximum(st.peak_eval, p.device))
    if p.compile_cache is not None:
        p.compile_cache.finish_push()  # what became of it belongs in the summary
    return {
        "run": p.run,
        "params": p.n_params,
        "optimizer": {"name": p.cfg.optim.name, **split_summary(p.optimizer)},
        "steps_done": st.step,
        "total_steps": p.total_steps,
        "tokens_consumed": st.step * gb * p.cfg.data.seq_len,
        "samples_consumed": st.step * gb,
        "final_train_loss": st.stats.last_loss,
        "val_loss": (st.val or {}).get("val_loss"),
        "val_ppl": (st.val or {}).get("val_ppl"),
        # The step of that validation: the horizon's, or the newest periodic one (train.eval_every), this
        # session's or an earlier one's.
        "val_step": (st.val or {}).get("val_step"),
        "eval_seconds_max": s.budget.eval_max,
        "tokens_per_s": tokens_per_s,
        **p.flops.summary(tokens_per_s),
        "precision": p.cfg.train.precision,
        "compile": p.cfg.train.compile,
        "compile_fallbacks": fallbacks(p.micro_loss),
        "compile_scope": p.cfg.train.compile_scope,
        "compile_cache": p.compile_cache.summary() if p.compile_cache is not None else None,
        "startup": s.startup_summary(),
        "fused_ce": p.cfg.train.fused_ce,
        "deterministic": p.cfg.train.deterministic,
        "micro_batch": p.cfg.train.micro_batch,
        "accumulation": p.accum,
        "auto_settings": p.perf_notes,
        "peak_memory_bytes": max(peak_train, peak_eval),
        "peak_memory_train_bytes": peak_train,
        "peak_memory_eval_bytes": peak_eval,
        "nonfinite_skips": st.stats.nonfinite_skips,
        "rollbacks": st.stats.rollbacks,
        "skipped_ranges": [list(r) for r in p.data.skipped],
        "checkpoints": s.checkpointer.saved,
        "resumed_from_step": st.session_from,
        "stopped_by": st.stopped_by,
        "deadline": s.deadline,
        "world_size": p.world,
        "device": str(p.device),
        "store": p.store.describe(),
        "seconds": round(time.time() - s.t_start, 3),
        "config": p.cfg.to_dict(),
        "versions": versions(),
        **requeue_plan(s),
    }


def requeue_plan(s: Session) -> dict[str, Any]:
    """The summary's ``slurm`` (the job's ids) and ``requeue`` (whether the process that started the session
    requeues the job once every rank is done: ``runtime.slurm``). Decided on rank 0, which also asks the
    controller whether SLURM brings the job back by itself already (preemption, an outside requeue)."""
    job = slurm.current_job(query=s.parts.dist.is_main)
    if job is None:
        return {"slurm": None, "requeue": False}
    t = s.parts.cfg.train
    wanted, why = slurm.requeue_decision(t.requeue, t.max_requeues, job, s.state.stopped_by, s.state.step,
                                         s.parts.total_steps, s.state.session_from or 0)
    if wanted and s.parts.dist.is_main:
        fields = slurm.show_job(job.job_id, strict=False)
        already = slurm.already_requeued(job, fields) if fields else None
        if already:
            wanted, why = False, already
    if s.parts.dist.is_main:
        log.info("SLURM job %s: %s (%s)", job.job_id, "requeue" if wanted else "no requeue", why)
    return {"slurm": job.to_dict(), "requeue": wanted}

def write_summary(s: Session, summary: dict[str, Any]) -> None:
    p = s.parts
    if p.dist.is_main:
        p.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = p.run_dir / "run_summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
        tmp.replace(p.run_dir / "run_summary.json")
