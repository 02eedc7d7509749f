"""The parts of a training session, built once before the loop and never replaced while it runs."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.pointer import pointer_key, read_pointer
from ..checkpoint.pull import stored_state
from ..checkpoint.record import CheckpointState, read_state
from ..config import Config
from ..data.permutation import Permutation
from ..data.pull import DataSource, ensure_data
from ..data.reader import WindowDataset
from ..errors import BatonError, ConfigError
from ..guard import without_credentials
from ..model.llama import build_model, count_parameters, param_count
from ..model.optimizer import build_optimizer, check_precision, split_summary
from ..planning.ledger import SessionLedger, new_session_id
from ..runtime import attention, autotune, determinism, dist, features, logs, memory
from ..runtime.device import pick_device, rank_device
from ..runtime.flops import FlopsInfo, session_flops
from ..runtime.parallel import Parallel
from ..runtime.slurm import current_job
from ..store import RetryPolicy, Store, open_store
from ..store.lease import FencedStore, Lease, refuse_if_held
from .drift import check_before_pull, tokenizer_sha256
from .warmstart import CompileCache, StartupClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parts:
    cfg: Config  # with precision, compile and micro_batch "auto" resolved to what runs
    device: torch.device
    dist: dist.DistInfo
    store: Store
    ledger: SessionLedger | None  # rank 0's record of this session in the store; None on other ranks
    data: WindowDataset
    tokenizer_sha256: str
    model: torch.nn.Module  # the plain model until resumed, then as wrapped for the layout (DDP, FSDP)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    parallel: Parallel
    micro_loss: Callable[..., torch.Tensor]  # forward under autocast, fp32 cross-entropy; compiled or not
    autocast_dtype: torch.dtype | None
    flops: FlopsInfo
    n_params: int
    perf_notes: dict[str, Any]  # how each "auto" setting was resolved
    total_steps: int
    stop_step: int  # where this session stops at the latest (--stop-after-steps, else the horizon)
    micro_batch: int  # samples per forward pass
    accum: int  # micro-batches per rank per optimizer step
    lease: Lease | None = None  # rank 0's hold on the run (store.lease); ``store`` is then fenced by it
    startup: StartupClock | None = None  # where the start-up went (pull, build, first step), for the ledger
    compile_cache: CompileCache | None = None  # train.compile_cache: pulled beside the checkpoint, pushed once

    @property
    def run(self) -> str:
        return self.cfg.run.name

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    @property
    def world(self) -> int:
        return self.dist.world

    def wrapped(self) -> Parts:
        """These parts with the model and optimizer wrapped for the layout (DDP, FSDP), once a checkpoint is
        loaded into the plain ones."""
        model, optimizer = self.parallel.wrap(self.model, self.optimizer, lambda m: build_optimizer(m, self.cfg, self.device))
        return dataclasses.replace(self, model=model, optimizer=optimizer)


def build(cfg: Config, stop_after: int | None, started: float, deadline: float | None, resume: str = "auto",
          allow_change: frozenset[str] = frozenset(), take_over: bool = False) -> Parts:
    """Everything the loop calls, checked before anything long starts (memory, divisibility, vocabulary).

    Rank 0 takes the run's lease before its first write to the store (its ledger record) and from then on
    writes through a store the lease fences; a failure after that releases it again."""
    if cfg.train.deterministic:
        determinism.enable()  # before anything touches the GPU
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    info = dist.init(pick_device(cfg.train.device).type, cfg.train.dist_timeout)
    device = rank_device(cfg.train.device, info.local_rank, dist.under_torchrun())
    attention.check(cfg.model.attn, device)  # one line now, not a kernel error after set-up
    features.check(cfg, info.world)  # what this torch lacks (Muon, FSDP2), said before anything is written
    logs.setup(info.rank, cfg.run_dir / "logs")
    total_steps = cfg.total_steps
    world = info.world
    memory.check_fits(param_count(cfg.model), cfg.train.parallel, world, device)
    # precision, compile and micro_batch "auto" become concrete values in cfg (the saved config says what ran)
    perf_notes = autotune.resolve(cfg, device, world)
    micro_batch = cfg.train.micro_batch
    assert isinstance(micro_batch, int), "autotune.resolve leaves no micro_batch 'auto'"
    if cfg.train.global_batch % (micro_batch * world):
        raise ConfigError(
            f"train.global_batch={cfg.train.global_batch} is not divisible by micro_batch "
            f"{micro_batch} x {world} ranks (change micro_batch or the number of ranks)"
        )
    store = open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    if not take_over:
        # A run another session is training is refused now, not after this one pulled its data (gigabytes, on an
        # empty machine); the lease itself is taken below, once the data is there.
        dist.on_main(lambda: refuse_if_held(store, cfg.run.name))
    startup = StartupClock(started)
    # The compile cache downloads in the background from here, beside the data and the checkpoint.
    cache = CompileCache(cfg, device, info, cfg.run_dir)
    cache.start_pull(store)
    # The dataset before anything is written to the store: a session that cannot have its data (pulled, or
    # read from data.dir: its manifest, shards and tokenizer) ends here and leaves the store as it was.
    t = time.time()
    source = _ensure_data(cfg, info, _data_drift(cfg, store, resume, allow_change))
    startup.pull += time.time() - t
    data = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
    # Checked now, not when the final export needs it hours later.
    tok_sha256 = tokenizer_sha256(cfg.data.dir, data.manifest)
    if data.vocab_size > cfg.model.vocab_size:
        raise ConfigError(
            f"the tokenizer in {cfg.data.dir} has {data.vocab_size} tokens but model.vocab_size is "
            f"{cfg.model.vocab_size} (raise model.vocab_size to at least {data.vocab_size})"
        )
    held: list[Lease] = []  # rank 0's; every rank gets its refusal (LeaseHeld) from on_main
    dist.on_main(lambda: held.append(_take_lease(cfg, store, started, take_over)))
    lease = held[0] if held else None
    try:
        parts = _built(cfg, stop_after, started, deadline, info, device, store, lease, source, data, tok_sha256,
                       total_steps, world, perf_notes, micro_batch)
        return dataclasses.replace(parts, startup=startup, compile_cache=cache)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def _take_lease(cfg: Config, store: Store, started: float, take_over: bool) -> Lease:
    """Rank 0: the run's lease (or LeaseHeld naming its live holder), its pointer sealed with the new epoch, and
    its renewals started."""
    lease = Lease(store, cfg.run.name, new_session_id(started), cfg.store.lease_seconds, started=started)
    lease.acquire(take_over)
    try:
        fence = getattr(store, "fence", None)
        if fence is not None:
            fence(lease.on_moved)  # the Hub: every commit from now on names its parent (HubStore.fence)
        lease.seal(pointer_key(cfg.run.name))
        lease.start()
    except BaseException:
        lease.release()
        raise
    return lease


def _built(cfg: Config, stop_after: int | None, started: float, deadline: float | None, info: dist.DistInfo,
           device: torch.device, store: Store, lease: Lease | None, source: DataSource | None, data: WindowDataset,
           tok_sha256: str, total_steps: int, world: int, perf_notes: dict[str, Any], micro_batch: int) -> Parts:
    ledger = _open_ledger(cfg, store, info, device, started, deadline, source, lease)
    if ledger is not None:  # written with the record's next write (the resume)
        ledger.rec.settings = {("model." if k == "attn" else "train.") + k: v for k, v in perf_notes.items()
                               if isinstance(v, str)}
    if lease is not None:
        store = FencedStore(store, lease)  # a Store that asks the lease first
    try:
        return _with_model(cfg, stop_after, started, deadline, info, device, store, lease, ledger, data, tok_sha256,
                           total_steps, world, perf_notes, micro_batch)
    except BaseException as e:
        if ledger is not None:  # the session is billed from its start to here, failed as it is (a GPU OOM)
            ledger.end(without_credentials(f"failed: {type(e).__name__}: {e}"), None, 0.0)
        raise


def _with_model(cfg: Config, stop_after: int | None, started: float, deadline: float | None, info: dist.DistInfo,
                device: torch.device, store: Store, lease: Lease | None, ledger: SessionLedger | None,
                data: WindowDataset, tok_sha256: str, total_steps: int, world: int, perf_notes: dict[str, Any],
                micro_batch: int) -> Parts:
    model = build_model(cfg.model, device, seed=cfg.train.seed)
    n_params = count_parameters(model)
    if n_params != param_count(cfg.model):
        raise RuntimeError(f"built model has {n_params} parameters, closed form says {param_count(cfg.model)}")
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.precision == "fp16")
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision)
    check_precision(model, scaler, cfg.train.precision)
    optimizer = build_optimizer(model, cfg, device)
    if info.is_main:
        log.info("optimizer %s: %s", cfg.optim.name, ", ".join(
            f"{k} {v['tensors']} tensors ({v['params']:,} parameters)" for k, v in split_summary(optimizer).items()))
    return Parts(
        cfg=cfg, device=device, dist=info, store=store, ledger=ledger, data=data, tokenizer_sha256=tok_sha256,
        model=model, optimizer=optimizer, scaler=scaler,
        parallel=Parallel(cfg.train.parallel, info.rank, world, device),
        micro_loss=autotune.micro_loss_fn(autocast_dtype, compiled=bool(cfg.train.compile),
                                          fused=cfg.train.fused_ce, scope=cfg.train.compile_scope),
        autocast_dtype=autocast_dtype,
        flops=session_flops(cfg.model, cfg.data.seq_len, device, cfg.train.precision, world),
        n_params=n_params, perf_notes=perf_notes, total_steps=total_steps,
        stop_step=min(stop_after, total_steps) if stop_after is not None else total_steps,
        micro_batch=micro_batch, accum=cfg.train.global_batch // (micro_batch * world), lease=lease,
    )


def _ensure_data(cfg: Config, info: dist.DistInfo, check: Callable[[dict[str, Any]], None] | None
                 ) -> DataSource | None:
    """data.url pulled into data.dir by one process per node while the others wait; every rank gets the error."""
    if not cfg.data.url:
        return None
    return dist.on_main(lambda: ensure_data(cfg, check), local=True)


def _data_drift(cfg: Config, store: Store, resume: str, allow_change: frozenset[str]
                ) -> Callable[[dict[str, Any]], None] | None:
    """The drift check, for the pull to make on the published manifest before any download: the checkpoint
    this session would resume (the store's pointer and its state.json, or --resume PATH) against this config
    and the dataset the manifest describes. None when there is nothing to compare (--resume never)."""
    if resume == "never":
        return None

    def check(manifest: dict[str, Any]) -> None:
        state: CheckpointState | None
        if resume == "auto":
            pointer = read_pointer(store, cfg.run.name)
            if pointer is None:
                return  # a fresh start
            state = stored_state(store, pointer)
            horizon = state.horizon(cfg.total_steps) if state is not None else cfg.total_steps
            if pointer.complete and pointer.step >= horizon:
                return  # a complete run that trains nothing
            cursor, step = pointer.cursor, pointer.step
        else:
            try:
                state = read_state(Path(resume))
            except BatonError:
                return  # the resume reports an unreadable checkpoint in its own words
            cursor, step, horizon = state.cursor, state.step, state.horizon(cfg.total_steps)
        n_train = WindowDataset.train_windows(manifest["total_tokens"], cfg.data.seq_len, cfg.data.val_windows)
        order = Permutation(n_train, cfg.data.shuffle_seed, 0).fingerprint() if n_train >= 1 else None
        check_before_pull(state, cursor, step, cfg.to_dict(), horizon, manifest, order, allow_change)

    return check


def _open_ledger(cfg: Config, store: Store, info: dist.DistInfo, device: torch.device, started: float,
                 deadline: float | None, source: DataSource | None, lease: Lease | None) -> SessionLedger | None:
    """The session's own record, written through the store itself (not the fenced one): a fenced session still
    records its end, saying it was fenced; nothing else of the run is its to write any more."""
    if not info.is_main:
        return None
    b = cfg.budget
    job = current_job(query=False)  # the environment's ids; the end time is the clock's (session.clock)
    return SessionLedger(store, cfg.run.name, started, device=str(device), accelerators=info.world,
                         bill_factor=b.bill_factor or float(info.world), tokens_per_step=cfg.tokens_per_step,
                         deadline=deadline, heartbeat_every_s=b.heartbeat_minutes * 60,
                         data=source.to_dict() if source else None,
                         slurm=(job.job_id, job.array_task_id, job.restart_count) if job else None,
                         session=lease.session if lease else None, epoch=lease.epoch if lease else None,
                         took_over=lease.took_over if lease else None)
