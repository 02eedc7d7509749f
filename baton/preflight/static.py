"""Preflight stages that need no training run: construct, data, storage."""

from __future__ import annotations

import json
import math
import shutil
import time
from itertools import pairwise

import torch

from ..checkpoint.cycle import push_checkpoint
from ..checkpoint.pull import pull_checkpoint, read_pointer
from ..checkpoint.state import CheckpointState, rng_state, save_checkpoint
from ..data.pull import ensure_data
from ..data.reader import Cursor, WindowDataset, prefix_collisions
from ..data.verify import verify_data
from ..errors import StoreError
from ..model.llama import build_model, count_parameters, param_count
from ..model.optimizer import adamw, build_optimizer, check_precision
from ..model.schedule import factor_for, landmarks, plateau_share, plot
from ..runtime.autotune import resolve_precision
from ..runtime.device import pick_device
from ..store import delete_prefix, open_store
from .core import Context, StageResult, timed

SCHEDULE_CHECK = "schedule: 1.0 at the warmup's end and the decay start, never rising after, above the floor at the end"


def schedule_shape(cfg) -> tuple[dict, bool, str]:
    """The configured schedule's factors measured at its landmarks, whether its shape holds, and one line."""
    o, total = cfg.optim, cfg.total_steps
    at = landmarks(total, o.warmup_steps, o.decay_start, o.schedule, o.decay_step)
    f = [factor_for(o, s, total) for s in range(total)]
    shape = {"schedule": o.schedule, "decay_shape": o.decay_shape if o.schedule == "wsd" else o.schedule,
             "min_lr_ratio": o.min_lr_ratio, "total_steps": total,
             "plateau_share": plateau_share(total, o.warmup_steps, o.decay_start, o.schedule, o.decay_step),
             **{f"step_{k}": s for k, s in at.items()}, **{f"factor_{k}": f[s] for k, s in at.items()},
             "plot": plot(o, total)}
    ok = (f[at["warmup_end"]] == 1.0 and abs(f[at["decay_start"]] - 1.0) < 1e-12
          and all(b <= a for a, b in pairwise(f[at["warmup_end"]:])) and o.min_lr_ratio < f[-1] <= f[at["at_90pct"]])
    detail = (f"{o.schedule}{' (' + o.decay_shape + ' cooldown)' if o.schedule == 'wsd' else ''}, floor "
              f"{o.min_lr_ratio:g}: plateau {shape['plateau_share']:.1%}, decay from step {at['decay_start']}, "
              f"{shape['factor_at_90pct']:.3f} at 90 %, {shape['factor_last']:.4f} at the final update")
    return shape, ok, detail


@timed
def stage_construct(ctx: Context) -> StageResult:
    r = StageResult("construct")
    cfg, small = ctx.cfg, ctx.scaled
    expected = param_count(cfg.model)
    built = count_parameters(build_model(cfg.model, "meta"))
    r.numbers.update(params_closed_form=expected, params_built=built, params_stand_in=param_count(small.model))
    r.check("config validates", True, ctx.config_path)
    r.check("closed-form parameter count equals the built model", built == expected, f"{built:,} vs {expected:,}")

    device = pick_device(small.train.device)
    model = build_model(small.model, device, seed=small.train.seed)
    x = torch.randint(0, min(small.model.vocab_size, 1000), (2, min(small.data.seq_len, 64)), device=device)
    # "auto" is what a session on this device resolves it to (fp16 on a T4, bf16 on Ampere+), not fp32.
    precision = resolve_precision(device) if small.train.precision == "auto" else small.train.precision
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    first = float(loss.detach())
    r.numbers["first_loss"] = first
    r.check("forward loss is finite", math.isfinite(first), f"{first:.4f}")
    r.check("backward gives finite gradients for every parameter",
            all(g is not None and torch.isfinite(g).all().item() for g in grads))

    shape, shape_ok, detail = schedule_shape(cfg)
    r.numbers["schedule"] = shape
    r.check(SCHEDULE_CHECK, shape_ok, detail)

    opt = build_optimizer(model, small, device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    try:
        check_precision(model, scaler, precision)
        r.check("precision asserted: fp32 master weights, GradScaler live exactly when fp16", True,
                f"{precision}, scaler {'on' if scaler.is_enabled() else 'off'}")
    except RuntimeError as e:
        r.check("precision asserted: fp32 master weights, GradScaler live exactly when fp16", False, e)
    del opt
    r.numbers["precision"] = {"configured": cfg.train.precision, "tested": precision, "device": str(device)}
    return r


@timed
def stage_data(ctx: Context) -> StageResult:
    r = StageResult("data")
    cfg = ctx.scaled
    source = ensure_data(cfg)  # with data.url: pulled (or reused) and verified, as a training session would
    r.numbers["source"] = source.to_dict() if source else {"location": cfg.data.dir, "pulled_files": 0}
    r.check("the data is present on this machine, from where the config says",
            True, source.line() if source else f"local folder {cfg.data.dir} (no data.url)")
    report = verify_data(str(cfg.data.dir))
    r.numbers["verify"] = {"files_hashed": report.files_hashed, "total_tokens": report.total_tokens,
                           "mismatches": len(report.problems), "problems": report.problems}
    # A failure names its files first: the scorecard row, the check line and the console show them, as
    # verify-data does, not only the measured numbers.
    named = "; ".join(report.problems[:3]) + (f"; {len(report.problems) - 3} more" if len(report.problems) > 3 else "")
    r.check("every shard hashes to its manifest entry", report.ok, f"{named} ({report.summary()})" if named
            else report.summary())

    ds = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
    real = ctx.cfg
    train_tokens = ds.n_train * cfg.data.seq_len
    horizon = real.total_steps * real.tokens_per_step
    r.numbers["geometry"] = {
        "tokens": ds.stream.total, "seq_len": cfg.data.seq_len, "windows": ds.n_windows, "train_windows": ds.n_train,
        "val_windows": ds.n_val, "horizon_tokens": horizon, "epochs": horizon / train_tokens,
        "margin": (train_tokens - horizon) / horizon, "fingerprint": ds.fingerprint,
        "permutation_fingerprint": ds.permutation_fingerprint,
    }

    gb, steps = cfg.train.global_batch, max(3, cfg.total_steps)
    boundaries = sorted({1, steps // 3, (2 * steps) // 3, steps - 1, ds.n_train // gb + 1})
    same = []
    for b in boundaries:
        # The real save/load path: cursor -> JSON -> cursor -> a fresh reader slicing at it.
        saved = json.loads(json.dumps(ds.cursor(b * gb, b).to_dict()))
        fresh = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
        cursor = Cursor.from_dict(saved)
        fresh.check_cursor(cursor)
        a = ds.train_batch(b * gb, gb)
        c = fresh.train_batch(cursor.samples_consumed, gb)
        same.append(torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
                    and fresh.permutation_fingerprint == ds.permutation_fingerprint)
    r.numbers["resume_boundaries"] = boundaries
    r.check("resume reads the same windows at every boundary", all(same) and len(boundaries) >= 3,
            f"{len(boundaries)} boundaries: {boundaries}")

    x, y = ds.train_batch(0, 4)
    r.check("labels are next-token", torch.equal(x[:, 1:], y[:, :-1]))
    other = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed + 1, cfg.data.val_windows)
    first = ds.train_window_ids(0, min(64, ds.n_train))
    r.check("same seed gives the same order, another seed another",
            (first == WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
             .train_window_ids(0, len(first))).all() and not (first == other.train_window_ids(0, len(first))).all())
    collisions = prefix_collisions(ds, 64) if ds.n_windows <= 2_000_000 else None
    r.numbers["val_prefix_collisions"] = collisions
    r.check("no validation window's first 64 tokens equal a training window's",
            None if collisions is None else collisions == 0,
            "not checked above 2M windows (a full prefix index would not fit a preflight)" if collisions is None
            else f"{collisions} collisions")
    return r


@timed
def stage_storage(ctx: Context) -> StageResult:
    """A checkpoint of the configured shape (random weights, real size) through the full cycle."""
    r = StageResult("storage")
    cfg = ctx.cfg if ctx.scale == "real" else ctx.scaled
    store = open_store(ctx.store_url)
    run = ctx.run_name("storage")
    delete_prefix(store, f"{run}/")
    model = build_model(cfg.model, "cpu", seed=0)
    opt = adamw(model, cfg, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():  # real bytes, not zeros that a store might compress away
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.randn(p.shape, generator=gen) * 1e-3,
                        "exp_avg_sq": torch.rand(p.shape, generator=gen) * 1e-6}
    folder = ctx.work / "storage" / "step-1"
    cursor = Cursor(cfg.train.global_batch, 1, cfg.data.seq_len, cfg.data.shuffle_seed, "preflight", "preflight")
    t = time.perf_counter()
    save_checkpoint(folder, model, opt, CheckpointState(step=1, total_steps=None, cursor=cursor.to_dict(),
                                                        config=cfg.to_dict(), rng_ranks=[rng_state()],
                                                        optimizer_param_groups=[]), None)
    r.numbers["save_seconds"] = round(time.perf_counter() - t, 3)
    size = sum(f.stat().st_size for f in folder.iterdir())
    r.numbers["checkpoint_bytes"] = size
    del model, opt
    free_before = shutil.disk_usage(ctx.work).free
    result = push_checkpoint(store, run, folder, 1, cursor.to_dict(), cfg.store.verify, keep_last=1)
    free_after = shutil.disk_usage(ctx.work).free
    r.numbers.update(push_verify_seconds=round(result.seconds, 3), timings={k: round(v, 3) for k, v in result.timings.items()},
                     free_bytes_before_prune=free_before, free_bytes_after_prune=free_after,
                     throughput_mb_s=round(size / 1e6 / max(result.seconds, 1e-9), 1))
    r.check("push verified against the store's listing and ranged read-back", result.verified, store.describe())
    pointer = read_pointer(store, run)
    r.check("pointer read back names the pushed checkpoint", pointer is not None and pointer.step == 1)
    if pointer is None:  # nothing to pull from: the stage fails, with this as its error
        raise StoreError(f"the pointer of {run} is not in {store.describe()} after a verified push")
    r.check("local copy pruned only after verification", not folder.exists(),
            f"{free_before / 1e9:.2f} -> {free_after / 1e9:.2f} GB free")
    pulled = ctx.work / "storage" / "cold-pull"
    t = time.perf_counter()
    pull_checkpoint(store, run, pointer, pulled)
    r.numbers["cold_pull_seconds"] = round(time.perf_counter() - t, 3)
    r.check("cold pull into an empty folder, every sha256 checked",
            sorted(p.name for p in pulled.iterdir()) == sorted(pointer.files))
    shutil.rmtree(pulled)
    delete_prefix(store, f"{run}/")
    r.check("scratch location cleaned up", not store.list(f"{run}/"))
    return r
