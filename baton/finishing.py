"""The end of a session at the horizon: evaluation, export, the completed pointer; and the run summary."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import checkpointing, dist
from .checkpoint.cycle import make_pointer, push_folder, write_pointer
from .checkpoint.resume import read_pointer
from .data.prepare import TOKENIZER_FILE
from .errors import BatonError, StoreError
from .heldout import window_losses
from .versions import versions

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(s: Session) -> dict[str, float]:
    """Loss and perplexity over the held-out windows, split across ranks and summed.

    Training may go on after it (``train.eval_every``), so it leaves no trace there: the model back in train
    mode, the random generators as they were (the model draws none today; a later one with dropout would).
    """
    rng = torch.get_rng_state(), (torch.cuda.get_rng_state(s.device) if s.device.type == "cuda" else None)
    if s.device.type == "cuda":
        s.peak_train = max(s.peak_train, torch.cuda.max_memory_allocated(s.device))  # before the reset below
        torch.cuda.reset_peak_memory_stats(s.device)
    model = getattr(s.model, "module", s.model)
    model.eval()
    all_ids = s.data.val_window_ids()
    ids = all_ids[s.dist.rank :: s.world]
    loss_sum, count = 0.0, 0
    mb = s.cfg.train.micro_batch
    # Sharded forwards are collectives: every rank runs as many as the busiest rank, the extra ones on
    # a window whose loss is not counted.
    n_fwd = -(-len(all_ids[:: s.world]) // mb) if s.parallel.sharded else -(-len(ids) // mb)
    for b in range(n_fwd):
        chunk = ids[b * mb : (b + 1) * mb]
        x, y = s.data.windows(chunk if len(chunk) else all_ids[:1])
        losses = window_losses(model, x.to(s.device), y.to(s.device), s.autocast)
        if len(chunk):
            loss_sum += float(losses.double().sum())
            count += len(chunk)
    model.train()
    torch.set_rng_state(rng[0])
    if rng[1] is not None:
        torch.cuda.set_rng_state(rng[1], s.device)
    loss_sum = dist.total(loss_sum, s.device)
    count = int(dist.total(count, s.device))
    from .session import rss_peak

    s.peak_eval = max(s.peak_eval, torch.cuda.max_memory_allocated(s.device) if s.device.type == "cuda" else rss_peak())
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
        s.val = {**val, "val_step": step}
    return {**val, "eval_seconds": round(seconds, 4)} if val else {}


def finish(s: Session) -> None:
    """At the horizon: final evaluation, export, push the export, and mark the run complete."""
    s.val = evaluate(s)
    log.info("validation: loss %.4f ppl %.2f over %d windows", s.val.get("val_loss", float("nan")),
             s.val.get("val_ppl", float("nan")), s.val.get("val_windows", 0))
    plain = checkpointing.plain_state(s)
    err = None
    if s.dist.is_main:
        try:
            _publish_final(s, plain[0])
        except (BatonError, OSError) as e:
            err = (f"the final model could not be published to {s.store.describe()}: {type(e).__name__}: {e}; the "
                   f"pointer still names the verified checkpoint at step {s.step}: fix the store's problem, then "
                   "rerun `baton train`, which publishes it again")
        if err is None and s.cfg.publish.url:
            from .publish import publish_trained

            try:
                publish_trained(s.cfg, plain[0], s.step, s.run_dir / "final", s.metrics_path)
            except (BatonError, OSError) as e:
                err = (f"the run is complete, but publishing it to {s.cfg.publish.url} failed ({e}); run "
                       "`baton publish -c CONFIG` to finish publishing")
    err = dist.broadcast(err)
    if err:
        raise StoreError(err)


def _publish_final(s: Session, model: torch.nn.Module) -> None:
    from .export import export_model

    pointer = read_pointer(s.store, s.run)
    if pointer is None or pointer["step"] != s.step:
        raise StoreError(f"expected the pointer at step {s.step} before publishing the final model")
    out = s.run_dir / "final"
    manifest = s.data.manifest["tokenizer"]
    export_model(model, Path(s.cfg.data.dir) / TOKENIZER_FILE, out, manifest["eos_token"],
                 meta={"run": s.run, "step": s.step, **(s.val or {}), "config": s.cfg.to_dict()})
    files, _ = push_folder(s.store, out, f"{s.run}/final", s.cfg.store.verify)
    # The verified history stays in the pointer: retention in later sessions goes by it.
    history = {"verified": pointer["verified"]} if "verified" in pointer else {}
    done = make_pointer(s.run, pointer["step"], pointer["path"], pointer["files"], pointer["cursor"],
                        complete=True, extra={"final": {"path": "final", "files": files}, **history, **(s.val or {})})
    write_pointer(s.store, s.run, done)
    log.info("run %s complete: final model verified at %s/final; pointer marks the run complete",
             s.run, s.run)

def summary(s: Session, tokens_per_s: float) -> dict[str, Any]:
    """run_summary.json: whole-run counters, this session's checkpoints, peaks (max over ranks), config."""
    gb = s.cfg.train.global_batch
    # Each rank's own high-water marks go to its log; the summary keeps the maximum over ranks.
    log.info("PEAK rank=%d train_bytes=%d eval_bytes=%d", s.dist.rank, s.peak_train, s.peak_eval)
    peak_train = int(dist.maximum(s.peak_train, s.device))
    peak_eval = int(dist.maximum(s.peak_eval, s.device))
    return {
        "run": s.run,
        "params": s.n_params,
        "steps_done": s.step,
        "total_steps": s.total_steps,
        "tokens_consumed": s.step * gb * s.cfg.data.seq_len,
        "samples_consumed": s.step * gb,
        "final_train_loss": s.stats.last_loss,
        "val_loss": (s.val or {}).get("val_loss"),
        "val_ppl": (s.val or {}).get("val_ppl"),
        # The step of that validation: the horizon's, or the newest periodic one (train.eval_every).
        "val_step": (s.val or {}).get("val_step", s.step if s.val else None),
        "eval_seconds_max": s.budget.eval_max,
        "tokens_per_s": tokens_per_s,
        **s.flops.summary(tokens_per_s),
        "precision": s.cfg.train.precision,
        "compile": s.cfg.train.compile,
        "fused_ce": s.cfg.train.fused_ce,
        "deterministic": s.cfg.train.deterministic,
        "micro_batch": s.cfg.train.micro_batch,
        "accumulation": s.accum,
        "auto_settings": s.perf_notes,
        "peak_memory_bytes": max(peak_train, peak_eval),
        "peak_memory_train_bytes": peak_train,
        "peak_memory_eval_bytes": peak_eval,
        "nonfinite_skips": s.stats.nonfinite_skips,
        "rollbacks": s.stats.rollbacks,
        "skipped_ranges": [list(r) for r in s.data.skipped],
        "checkpoints": s.session_checkpoints,
        "resumed_from_step": s.resumed_from,
        "stopped_by": s.stopped_by,
        "deadline": s.deadline,
        "world_size": s.world,
        "device": str(s.device),
        "store": s.store.describe(),
        "seconds": round(time.time() - s.t_start, 3),
        "config": s.cfg.to_dict(),
        "versions": versions(),
    }

def write_summary(s: Session, summary: dict[str, Any]) -> None:
    if s.dist.is_main:
        s.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = s.run_dir / "run_summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1), encoding="utf-8")
        tmp.replace(s.run_dir / "run_summary.json")
