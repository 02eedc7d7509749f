"""Resuming a session: find the baton (pointer, local folder or nothing), check it fits, load it.

``--resume auto``: no pointer is a fresh start, said plainly; any other problem (unreadable or malformed
pointer, missing or damaged file, a checkpoint for another model or data) stops the run. Never a silent
restart from step 0.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import faults
from ..checkpoint import state as ckstate
from ..checkpoint.cycle import check_not_behind, finish_pruning, push_checkpoint
from ..checkpoint.names import STATE_FILE, folder_name, parse_step
from ..checkpoint.pointer import POINTER, Lineage, Pointer, read_pointer
from ..checkpoint.pull import pull_checkpoint, stored_state
from ..checkpoint.record import DAMAGED, CheckpointState, Shortened, Stats
from ..data.reader import Cursor
from ..errors import BatonError, ResumeError
from ..guard import resume_folder
from ..planning.ledger import ledger_key
from ..runs import split_run
from ..runtime import dist
from .branch import branch_start
from .drift import HORIZON, Difference, check_resume, hub_commits
from .parts import Parts

log = logging.getLogger(__name__)


@dataclass
class Resumed:
    """Where the session starts: step 0, or the state of a checkpoint now loaded into the model and optimizer."""

    step: int = 0
    from_step: int | None = None  # the checkpoint's step, None on a fresh start
    stats: Stats = field(default_factory=Stats)
    parent: Lineage | None = None  # the lineage of the verified checkpoint resumed from
    complete: Pointer | None = None  # the pointer of a run already complete: nothing to train
    no_pointer: bool = False  # the store was read and holds no pointer of this run (--resume PATH reads it only to
    # check the folder is not behind it)
    total_steps: int | None = None  # the horizon it trains to (None: the config's); anytime mode's shorter one
    shortened: Shortened | None = None  # the checkpoint's record of that shortening


def resume(s: Parts, mode: str, allow_change: frozenset[str]) -> Resumed:
    """Load the baton into the session's parts: from the store's pointer, a local folder, or nothing (step 0)."""
    cfg = s.cfg
    parent = None
    implied: frozenset[str] = frozenset()
    no_pointer = False
    folder = resume_folder(mode)  # the folder --resume names, or None for auto and never
    source = s.run  # the run whose checkpoint is loaded: a branch's first comes from its main run
    branch = split_run(s.run)[1]
    if mode == "never" and branch is not None:
        raise BatonError(f"cooldown branch {branch} starts from its main run's checkpoint, never from step 0: use "
                         "--resume auto (what `baton anneal` runs)")
    if mode == "never":
        pointer = dist.on_main(lambda: read_pointer(s.store, s.run))
        if pointer is not None:
            raise BatonError(f"{s.store.describe()} already holds run {s.run!r} at step {pointer.step}; "
                             "use --resume auto to continue it, or set a new run.name")
        log.info("--resume never: starting run %r at step 0", s.run)
        _fresh_metrics(s)
        return Resumed(no_pointer=True)
    if folder is None:  # auto
        # Only rank 0 reads the store; the answer (or the error) is shared so every rank agrees.
        pointer, finished = dist.on_main(lambda: _find_baton(s, allow_change)) or (None, None)
        if pointer is None and branch is not None:
            pointer = dist.on_main(lambda: branch_start(s.store, s.run))
            assert pointer is not None  # branch_start raises for a branch it cannot start
            source, implied, no_pointer = pointer.run, frozenset({HORIZON}), True
            log.info("cooldown branch %s has no checkpoint of its own: starting from the verified step %d of run %r in "
                     "%s", branch, pointer.step, source, s.store.describe())
        elif pointer is None:
            log.info("no checkpoint pointer %s/%s in %s: starting run %r at step 0",
                     s.run, POINTER, s.store.describe(), s.run)
            _fresh_metrics(s)
            return Resumed(no_pointer=True)
        elif pointer.complete and pointer.step >= _complete_at(s, pointer):
            return Resumed(step=pointer.step, complete=pointer, total_steps=pointer.step)  # the ledger: N -> N
        else:
            log.info("auto-resume: %s says step %d at %s/%s", s.store.describe(), pointer.step, s.run, pointer.path)
        # One download per node; a folder per node, since nodes may share a file system (NFS home).
        folder = s.run_dir / "resume" / f"{folder_name(pointer.step)}{dist.node_suffix()}"

        def pull() -> None:
            _tidy_local(s.run_dir, pointer.step)
            if finished != folder:  # else: the copy just pushed and verified, already here
                pull_checkpoint(s.store, source, pointer, folder)

        t = time.time()
        dist.on_main(pull, local=True)
        if s.startup is not None:
            s.startup.pull += time.time() - t
        if source == s.run:
            # The pruning a killed session left undone, only now that the pointer's checkpoint has been pulled and
            # proven: were it missing or damaged, the older verified checkpoints are what a person resumes from.
            dist.on_main(lambda: finish_pruning(s.store, s.run, pointer, s.cfg.store.keep_last))
        # A branch's first checkpoint has no parent in its own line: like a run's first, it continues the store
        # when the branch's ledger knows the session that saved it (_continues).
        parent = pointer.lineage if source == s.run else None
    st = ckstate.read_state(folder)
    # The step three records name must agree: state.json's, the pointer's (or the folder's name, for --resume
    # PATH) and the cursor's samples (below). A state.json edited or swapped would resume elsewhere in the data
    # and the schedule, and push its next checkpoint as verified.
    named = pointer.step if mode == "auto" and pointer is not None else parse_step(folder.name, tail=True)
    if named is not None and st.step != named:
        raise ResumeError(f"{folder / STATE_FILE} says step {st.step}, but its checkpoint is step {named}{DAMAGED}")
    if mode not in ("auto", "never"):  # --resume PATH: a folder behind the store's pointer must not roll it back
        dist.on_main(lambda: _not_behind(s, st.step))
    # Anytime mode's shorter horizon, kept in the run's own checkpoints while the config names the one it cut; a
    # cooldown branch's first start (from its main run's checkpoint) trains to the branch's own.
    horizon = st.horizon(s.cfg.total_steps) if source == s.run else s.cfg.total_steps
    allowed = _check_drift(s, st, horizon, allow_change, implied)
    ckstate.load_checkpoint(folder, s.model, s.optimizer)
    cursor = Cursor.from_dict(st.cursor)
    if not any(d.key.startswith("data.") for d in allowed):  # else: the data changed on purpose (--allow-change)
        s.data.check_cursor(cursor)
    elif cursor.skipped:
        log.warning("the checkpoint skips stream ranges %s of its data's order; with the data or its order changed "
                    "they now skip other windows", list(cursor.skipped))
    s.data.set_skipped(cursor.skipped)  # the ranges earlier rollbacks skipped stay skipped
    if cursor.samples_consumed != st.step * cfg.train.global_batch:
        raise ResumeError(f"cursor has {cursor.samples_consumed} samples at step {st.step}, expected "
                          f"{st.step * cfg.train.global_batch}")
    step = st.step
    if st.scaler:
        s.scaler.load_state_dict(st.scaler)
    ranks = st.rng_ranks
    if len(ranks) == s.world:
        ckstate.set_rng_state(ranks[s.dist.rank])
    else:
        log.warning("checkpoint was written by %d ranks, this run has %d: accumulation is now %d micro-batches "
                    "per rank (same %d samples per step); reseeding RNGs deterministically",
                    len(ranks), s.world, s.accum, cfg.train.global_batch)
        torch.manual_seed(cfg.train.seed + 1_000_003 * step + s.dist.rank)
    if s.dist.is_main and (folder / ckstate.METRICS_FILE).is_file():
        s.run_dir.mkdir(parents=True, exist_ok=True)
        # Lines past the checkpoint belong to work that was lost with the previous session.
        (s.run_dir / "metrics.jsonl").write_bytes((folder / ckstate.METRICS_FILE).read_bytes())
    log.info("resumed at step %d (samples consumed %d%s)", step, cursor.samples_consumed,
             f"; skipping stream ranges {list(cursor.skipped)}" if cursor.skipped else "")
    return Resumed(step=step, from_step=step, stats=st.stats, parent=parent, no_pointer=no_pointer, total_steps=horizon,
                   shortened=st.shortened if horizon != s.cfg.total_steps else None)


def _not_behind(s: Parts, step: int) -> None:
    pointer = read_pointer(s.store, s.run)
    if pointer is not None and step < pointer.step:
        check_not_behind(s.store, s.run, pointer, step)


def _complete_at(s: Parts, pointer: Pointer) -> int:
    """The horizon a complete pointer is measured against: the config's, or the shorter one anytime mode gave
    the run (its state.json, read on rank 0)."""
    if pointer.step >= s.cfg.total_steps:
        return s.cfg.total_steps
    state = dist.on_main(lambda: stored_state(s.store, pointer))
    return state.horizon(s.cfg.total_steps) if state is not None else s.cfg.total_steps


def _find_baton(s: Parts, allow_change: frozenset[str]) -> tuple[Pointer | None, Path | None]:
    """Rank 0: the pointer to resume from (after finishing a push a killed session left on this disk, and the
    pruning one left undone, for a complete run; any other's waits for its pull, below), and the folder a finished
    push was moved to (None if nothing was pushed)."""
    pointer, finished = read_pointer(s.store, s.run), None
    if pointer is None or not pointer.complete:
        pointer, finished = _finish_interrupted_push(s, pointer, allow_change)
    elif pointer.complete:
        finish_pruning(s.store, s.run, pointer, s.cfg.store.keep_last)  # nothing is pulled for a complete run
    return pointer, finished


def _finish_interrupted_push(s: Parts, pointer: Pointer | None, allow_change: frozenset[str]
                             ) -> tuple[Pointer | None, Path | None]:
    """Rank 0: a session killed after saving a checkpoint and before the store verified it leaves the
    checkpoint on this machine's disk. If it continues the store's line of work and fits this config, run the
    push it never finished (upload, verify, pointer, read-back) instead of training its steps again.

    Returns the pointer to resume from, and the folder the pushed checkpoint was moved to (where resuming
    would download it; None if nothing was pushed). Anything doubtful leaves the local folder alone and
    the pointer as it was: the verified checkpoint stays the baton."""
    local = _newest_local(s.run_dir / "ckpt", above=pointer.step if pointer else 0)
    if local is None:
        return pointer, None
    verified = f"the verified step {pointer.step}" if pointer else "step 0 (the store has no checkpoint)"
    try:
        st = ckstate.read_state(local)
        step = parse_step(local.name)
        if st.step != step or not _continues(s, st, pointer):
            log.info("%s does not continue the store's %s (another line of work); not pushed", local,
                     f"step {pointer.step}" if pointer else "run, which has no checkpoint")
            return pointer, None
        _check_drift(s, st, st.horizon(s.cfg.total_steps), allow_change)
    except Exception as e:  # noqa: BLE001 - a folder that cannot be judged is not pushed; the pointer stays
        log.warning("not pushing %s, left by an earlier session: %s", local, e)
        return pointer, None
    log.info("checkpoint step %d was saved on this disk by a session that ended before the store verified it: "
             "finishing its push", step)
    try:
        push_checkpoint(s.store, s.run, local, st.step, st.cursor, s.cfg.store.verify, s.cfg.store.keep_last,
                        keep_local=True)
    except BatonError as e:
        log.warning("could not finish the push of %s (%s); resuming from %s and keeping it", local, e, verified)
        return pointer, None
    new = read_pointer(s.store, s.run)
    if new is None or new.step != st.step:
        raise ResumeError(f"pushed checkpoint step {st.step}, but the pointer then read {new and new.step}")
    # The verified copy is the one the resume would download: it moves where the download would put it.
    folder = s.run_dir / "resume" / f"{folder_name(st.step)}{dist.node_suffix()}"
    # Older pulls go first: a kill between the move and the resume's tidying must not leave two copies here.
    _tidy_local(s.run_dir, st.step, pulls_only=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(local, folder)
    faults.point("resume.moved", st.step)
    return new, folder


def _continues(s: Parts, st: CheckpointState, pointer: Pointer | None) -> bool:
    """Whether a local checkpoint follows the store's line of work: its parent is the pointer's checkpoint
    (step and weights); or, before any pointer, it is a first checkpoint saved by a session the store's
    ledger knows, so the run in the store was not deleted and started afresh since."""
    if pointer is not None:
        return st.parent == pointer.lineage
    if st.parent is not None or st.session is None or not re.fullmatch(r"[A-Za-z0-9-]+", st.session):
        return False
    return s.store.read_text(ledger_key(s.run, st.session)) is not None


def _newest_local(folder: Path, above: int) -> Path | None:
    """The newest complete local checkpoint (``step-N``; a save in progress is ``step-N.partial``) past ``above``."""
    steps = [parse_step(d.name) for d in folder.iterdir() if d.is_dir()] if folder.is_dir() else []
    newer = [n for n in steps if n is not None and n > above]
    return folder / folder_name(max(newer)) if newer else None


def _fresh_metrics(s: Parts) -> None:
    # Rows left by a session killed before its first verified checkpoint describe lost work.
    if s.dist.is_main:
        (s.run_dir / "metrics.jsonl").unlink(missing_ok=True)


def _check_drift(s: Parts, st: CheckpointState, horizon: int, allow_change: frozenset[str],
                 implied: frozenset[str] = frozenset()) -> list[Difference]:
    """Refuse a checkpoint made for another model, geometry or data (every difference in one message);
    returns the changes allowed on purpose (``--allow-change``) that the checkpoint does show. ``implied``: a
    cooldown branch's own horizon, at its branch point."""
    return check_resume(st, s.cfg.to_dict(), horizon, s.data.fingerprint, s.data.permutation_fingerprint,
                        s.tokenizer_sha256, allow_change, hub_commits(s.data.manifest), implied)


def _tidy_local(run_dir: Path, step: int, pulls_only: bool = False) -> None:
    """Remove what killed sessions left in ``run_dir``: earlier pulls, and (unless ``pulls_only``) local
    checkpoints up to the pointer's step (the store holds a verified checkpoint at least as new). Each is a full
    checkpoint of disk; left alone they pile up session after session until a save finds the disk full."""
    for sub, newest in (("resume", step - 1), ("ckpt", -1 if pulls_only else step)):
        folder = run_dir / sub
        for d in sorted(folder.iterdir()) if folder.is_dir() else []:
            n = parse_step(d.name, tail=True)
            if d.is_dir() and n is not None and n <= newest:
                shutil.rmtree(d, ignore_errors=True)
                log.info("removed %s, left by an earlier session (the store holds step %d)", d, step)
