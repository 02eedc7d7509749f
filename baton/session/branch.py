"""Cooldown branches (`baton anneal`): a plateau checkpoint of a wsd run, cooled down into a finished model.

A branch is a run of its own inside its main run's prefix, ``<run>/branches/anneal-<N>-<T>`` (``baton.runs``):
its config is the main run's with that name, the horizon ``N + T / tokens_per_step`` and the wsd cooldown
beginning at step ``N`` (``optim.decay_step``), so its learning rate starts at the peak and decays with the
config's shape over its ``T`` tokens. Its first session starts from the main run's verified checkpoint at
step ``N`` (weights, optimizer, data cursor: the branch's step ``N + 1`` reads the batch the main run's step
``N + 1`` reads); from then on it is a run like any other, with its own pointer, checkpoints, ledger and
lease, resumed, verified and finished by the same session code. The main run is only read.

``plan_anneal`` checks a request against the store before anything is written; ``branch_start`` is what a
branch without a checkpoint of its own resumes from (``session.resume``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from fractions import Fraction

from ..checkpoint.history import locate, read_history
from ..checkpoint.names import STATE_FILE
from ..checkpoint.pointer import Pointer, read_pointer
from ..checkpoint.record import CheckpointState, parse_state_text
from ..config import Config, config_from_dict
from ..data.permutation import Permutation
from ..data.reader import WindowDataset
from ..errors import BatonError, ConfigError, ResumeError
from ..model.schedule import decay_begin
from ..runs import anneal_name, branch_run, parse_anneal, split_run
from ..store import RetryPolicy, Store, open_store
from .drift import HORIZON, hub_commits, refuse_drift

log = logging.getLogger(__name__)


class AnnealError(BatonError):
    """A cooldown branch that cannot be made from this run, this step or these tokens (nothing was written)."""


def _needs_wsd(run: str, schedule: str) -> AnnealError:
    return AnnealError(f"run {run!r} uses the {schedule} schedule, which decays from the end of its warmup: a "
                       "cooldown branch starts from a checkpoint on a wsd plateau (train runs you mean to branch "
                       "with optim.schedule = \"wsd\")")


def branch_config(cfg: Config, name: str) -> Config:
    """The config of ``name``, a branch of ``cfg``'s run: its run name, its horizon and its cooldown."""
    main, already = split_run(cfg.run.name)
    if already is not None:
        raise ConfigError(f"run.name={cfg.run.name!r} is a cooldown branch already: give the main run's config "
                          f"(run.name = {main!r})")
    at = parse_anneal(name) if isinstance(name, str) else None
    if at is None:
        raise ConfigError(f"--branch {name!r} is not a cooldown branch's name (anneal-STEP-TOKENS, as `baton status` "
                          "lists them)")
    if cfg.optim.schedule != "wsd":
        raise _needs_wsd(main, cfg.optim.schedule)
    step, tokens = at
    tps = cfg.tokens_per_step
    if tokens % tps:
        raise ConfigError(f"--branch {name}: {tokens} tokens are not whole steps of {tps} tokens (train.global_batch x "
                          "data.seq_len); use the name `baton anneal` printed")
    d = cfg.to_dict()
    d["run"]["name"] = branch_run(main, name)
    d["train"].update(steps=step + tokens // tps, target_tokens=0)
    d["optim"]["decay_step"] = step
    # A branch is its cooldown from the start: anytime mode has no plateau left to cut, and must not move it.
    d["budget"]["anytime"] = False
    return config_from_dict(d)


def cooldown_steps(cfg: Config, step: int, tokens: int | None, fraction: float | None) -> int:
    """The branch's length in whole steps: ``tokens`` (rounded down to steps), or ``fraction`` of the tokens the run
    has seen at ``step``."""
    if (tokens is None) == (fraction is None):
        raise AnnealError("anneal needs one of --tokens T (the cooldown's length) and --fraction F (of the tokens "
                          "seen at --step)")
    tps = cfg.tokens_per_step
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise AnnealError(f"--fraction {fraction} must be in (0, 1]: the cooldown's share of the {step * tps:,} "
                              f"tokens seen at step {step} (0.2 for 20 %)")
        steps = int(Fraction(repr(float(fraction))) * step)  # on the decimal written, as horizon_step
        if steps < 1:
            raise AnnealError(f"--fraction {fraction} of the {step * tps:,} tokens seen at step {step} is less than one "
                              f"step of {tps:,} tokens")
        return steps
    assert tokens is not None
    if tokens < tps:
        raise AnnealError(f"--tokens {tokens:,} is less than one step of {tps:,} tokens (train.global_batch x "
                          "data.seq_len)")
    return tokens // tps


@dataclass(frozen=True)
class AnnealPlan:
    """A checked request: the branch's name and config, its length, and where it stands in the store."""

    name: str
    config: Config
    step: int  # the branch point
    steps: int  # the cooldown's length in steps
    pointer: Pointer | None  # the branch's own pointer, when an earlier session checkpointed it

    @property
    def tokens(self) -> int:
        return self.steps * self.config.tokens_per_step


def plan_anneal(cfg: Config, step: int, tokens: int | None = None, fraction: float | None = None,
                store: Store | None = None) -> AnnealPlan:
    """Every check of a cooldown branch of ``cfg``'s run from ``step``, against the store, before anything is
    written: a main run on the wsd schedule; ``step`` a verified checkpoint on its plateau (after the warmup, not
    past the decay start); a length of whole steps within the data; a config the checkpoint can resume into. A
    branch that already has a checkpoint of its own needs only its name: it resumes from there."""
    run, already = split_run(cfg.run.name)
    if already is not None:
        raise AnnealError(f"run.name={cfg.run.name!r} is a cooldown branch: branch from its main run (run.name = "
                          f"{run!r})")
    if cfg.optim.schedule != "wsd":
        raise _needs_wsd(run, cfg.optim.schedule)
    if type(step) is not int or step < 1:
        raise AnnealError(f"--step must be a verified checkpoint's step (>= 1), got {step!r}")
    steps = cooldown_steps(cfg, step, tokens, fraction)
    name = anneal_name(step, steps * cfg.tokens_per_step)
    bcfg = branch_config(cfg, name)
    store = store or open_store(cfg.store.url, RetryPolicy.from_config(cfg.store))
    pointer = read_pointer(store, bcfg.run.name)
    plan = AnnealPlan(name, bcfg, step, steps, pointer)
    if pointer is not None:
        return plan  # checked when its first session started; the main run's checkpoint may be pruned since
    state, located = _branch_point(store, run, step)
    o = state.config.get("optim") or {}
    if o.get("schedule", "wsd") != "wsd":
        raise _needs_wsd(run, str(o.get("schedule")))
    warmup = int(o.get("warmup_steps", 0))
    total = state.total_steps or step
    d0 = decay_begin(total, o.get("decay_start", 0.8), "wsd", warmup, int(o.get("decay_step", 0)))
    if step < warmup:
        raise AnnealError(f"step {step} of run {run!r} is inside its warmup (steps 0-{warmup}): a cooldown branch starts "
                          f"from a checkpoint on the plateau, steps {warmup}-{d0} ({_plateau(store, run, warmup, d0)})")
    if step > d0:
        raise AnnealError(f"step {step} of run {run!r} is inside the main run's cooldown, which began at step {d0} of "
                          f"its {total}-step schedule: a branch starts from a plateau checkpoint, steps {warmup}-{d0} "
                          f"({_plateau(store, run, warmup, d0)})")
    manifest = _manifest(cfg)
    _check_data(cfg, state, manifest, step, steps, total, tokens, fraction)
    n_train = WindowDataset.train_windows(manifest["total_tokens"], cfg.data.seq_len, cfg.data.val_windows)
    order = Permutation(n_train, cfg.data.shuffle_seed, 0).fingerprint()
    note = f"; the cooldown branch {name} was not started"
    refuse_drift(state, bcfg.to_dict(), bcfg.total_steps, manifest["fingerprint"], order,
                 manifest["tokenizer"]["sha256"], {HORIZON}, note, hub_commits(manifest))
    log.info("cooldown branch %s: from the verified step %d of run %r (%s), %d steps of %d tokens", name, step, run,
             located.path, steps, cfg.tokens_per_step)
    return plan


def _plateau(store: Store, run: str, lo: int, hi: int) -> str:
    steps = [s for s in read_history(store, run).verified_steps() if lo <= s <= hi]
    return f"verified there: {', '.join(map(str, steps))}" if steps else "no verified checkpoint is there yet"


def _branch_point(store: Store, run: str, step: int) -> tuple[CheckpointState, Pointer]:
    """The main run's verified checkpoint at ``step``: its state.json (checked against the sha256 the store
    proved) and its pointer-shaped record."""
    try:
        located = locate(store, run, step)
    except BatonError as e:
        raise AnnealError(str(e)) from None
    key = f"{run}/{located.path}/{STATE_FILE}"
    text = store.read_text(key)
    if text is None or hashlib.sha256(text.encode("utf-8")).hexdigest() != located.files[STATE_FILE]["sha256"]:
        raise AnnealError(f"{key} in {store.describe()} does not match the sha256 its verification recorded: the "
                          "checkpoint is damaged (branch from another verified step)")
    state = parse_state_text(text, key)
    if state is None or state.step != step:
        raise AnnealError(f"{key} in {store.describe()} is not the state of step {step}: the checkpoint is damaged "
                          "(branch from another verified step)")
    return state, located


def _manifest(cfg: Config) -> dict:
    """The dataset the branch trains on: data.url's published manifest, else data.dir's."""
    if cfg.data.url:
        from ..data.manifest import MANIFEST, parse_manifest
        from ..data.remote import data_store

        ds = data_store(cfg)
        raw = ds.read_text(MANIFEST)
        if raw is None:
            raise AnnealError(f"no {MANIFEST} in {ds.describe()} (data.url): publish the data first (`baton "
                              "publish-data`)")
        return parse_manifest(raw, f"{MANIFEST} in {ds.describe()}")
    from ..data.manifest import load_manifest

    return load_manifest(cfg.data.dir)


def _check_data(cfg: Config, state: CheckpointState, manifest: dict, step: int, steps: int, total: int,
                tokens: int | None, fraction: float | None) -> None:
    """A branch reads the tokens after its branch point, never one twice: it ends within one pass over the training
    windows (or within the main run's own horizon, for a run that planned more than one pass)."""
    gb, tps = cfg.train.global_batch, cfg.tokens_per_step
    n_train = WindowDataset.train_windows(manifest["total_tokens"], cfg.data.seq_len, cfg.data.val_windows)
    skipped = [(int(a), int(b)) for a, b in state.cursor.get("skipped") or ()]
    one_pass = n_train - sum(min(b, n_train) - min(a, n_train) for a, b in skipped)  # samples, after rollbacks
    last = max(one_pass // gb, total)  # the furthest step a branch may reach
    if step + steps <= last:
        return
    asked = f"--tokens {tokens:,}" if tokens is not None else f"--fraction {fraction}"
    room = (last - step) * tps
    raise AnnealError(f"{asked} would cool down to step {step + steps:,} ({(step + steps) * tps:,} tokens), beyond the "
                      f"data: one pass over its {n_train:,} training windows ends at step {one_pass // gb:,} and the main "
                      f"run's horizon is step {total:,}; a branch reads only tokens after its branch point, never one "
                      "twice (" + (f"at most {room:,} tokens from step {step}" if room >= tps else
                                   f"no room after step {step}: branch from an earlier step") + ")")


def branch_start(store: Store, run: str) -> Pointer | None:
    """What a branch without a checkpoint of its own starts from: its main run's verified checkpoint at the branch
    point, as a pointer-shaped record (its ``run`` is the main run's). None for a main run."""
    main, name = split_run(run)
    at = parse_anneal(name) if name else None
    if at is None:
        return None
    try:
        return locate(store, main, at[0])
    except BatonError as e:
        raise ResumeError(f"cooldown branch {name} has no checkpoint of its own yet and starts from step {at[0]} of run "
                          f"{main!r}, but: {e}") from None
