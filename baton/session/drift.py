"""What a resume may change, and the one message that lists everything it may not.

A checkpoint's weights, optimizer moments and data cursor mean something only for the model shape, the
batch geometry and the data they were made with. A resume that changes one of those would quietly become
a different run, so it is refused with a single message that lists every difference, old and new (a
user fixes them all in one go). Changes that are legitimate pass and are logged: a
different world size (accumulation is derived), the learning rate of the decay tail, the precision, the
store. A few are legitimate only on purpose and pass with ``baton train --allow-change KEY``; a new horizon
(``train.steps``) besides only while the wsd schedule is still on its plateau, so its cooldown can move.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.record import CheckpointState, DataStamp
from ..errors import BatonError, DataError, ResumeError
from ..hashing import sha256_file

log = logging.getLogger(__name__)

# The checkpoint's tensors do not fit another shape, and its cursor counts samples of this geometry
# (samples consumed = step x global batch of seq_len windows): never allowed.
SHAPE_KEYS = ("model.n_layers", "model.hidden", "model.n_heads", "model.n_kv_heads", "model.ffn",
              "model.vocab_size", "model.tie_embeddings")
GEOMETRY_KEYS = ("data.seq_len", "train.global_batch")
# The checkpoint's optimizer tensors are that optimizer's (AdamW's moments, Muon's momentum): never allowed.
OPTIMIZER_KEY = "optim.name"
TOKENS_PER_STEP = "tokens per step"
HORIZON = "train.steps"  # the horizon in steps, however configured: it places the schedule's decay

# Allowed with --allow-change KEY: the run goes on meaningfully, but it is no longer the run it was.
ALLOWABLE = {
    "model.rope_theta": "the RoPE base (e.g. to extend the context)",
    "data.shuffle_seed": "the order of the windows from here on",
    "data.val_windows": "the validation hold-out (and with it the window order)",
    "data.fingerprint": "the corpus (other or more prepared data)",
    "data.tokenizer": "the tokenizer file (sha256)",
    "data.permutation": "the window order itself",
    HORIZON: "the horizon (train.steps or train.target_tokens), while the wsd schedule is still on its plateau",
}

# Config keys compared on resume (the others are free to change, and changes are logged).
FROZEN_KEYS = SHAPE_KEYS + ("model.rope_theta",) + GEOMETRY_KEYS + ("data.shuffle_seed", "data.val_windows",
                                                                       OPTIMIZER_KEY)
# Frozen keys added after checkpoints were first written, with the value every run before them had.
BEFORE_THE_KEY = {OPTIMIZER_KEY: "adamw"}
# Config keys whose change says nothing about the run itself; not even logged.
QUIET = {"run.local_dir", "data.dir", "train.log_every", "train.threads"}
# Everything the drift check compares; a setting outside it changes on resume without --allow-change.
COMPARED = frozenset(FROZEN_KEYS) | frozenset(ALLOWABLE) | {TOKENS_PER_STEP, "train.target_tokens"}
# Settings named in the messages as free to change: only those the check does not compare.
FREE_EXAMPLES = tuple(k for k in ("optim.lr", "train.precision", "store.url") if k not in COMPARED)


def allow_change_keys() -> str:
    """The --allow-change keys with what each allows, and which settings need no flag: the help and the
    refusal say the same, from the lists above."""
    return (f"one of: {'; '.join(f'{k}: {what}' for k, what in ALLOWABLE.items())}; other settings such as "
            f"{', '.join(FREE_EXAMPLES)} or the number of ranks may change without it")


@dataclass(frozen=True)
class Difference:
    key: str
    old: Any
    new: Any
    why: str = ""  # what explains the change, where it is known (a Hub source's revision that moved)

    def __str__(self) -> str:
        return f"{self.key}: checkpoint {_show(self.old)}, now {_show(self.new)}" + (f" ({self.why})" if self.why
                                                                                      else "")


def _show(v: Any) -> str:
    if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v):
        return f"sha256 {v[:12]}…"
    return repr(v)


def _get(d: dict[str, Any], key: str) -> Any:
    sec, name = key.split(".", 1)
    return (d.get(sec) or {}).get(name, BEFORE_THE_KEY.get(key))


def tokenizer_sha256(data_dir: str | Path, manifest: dict[str, Any]) -> str:
    """The sha256 of the data folder's tokenizer file, which must exist and match the manifest."""
    name = (manifest.get("tokenizer") or {}).get("file", "tokenizer.json")
    path = Path(data_dir) / name
    if not path.is_file():
        raise DataError(f"{path} is missing: the tokenizer of the prepared data is needed to export the model "
                        "(rerun `baton prepare`, or copy the tokenizer back)")
    digest = sha256_file(path)
    want = (manifest.get("tokenizer") or {}).get("sha256")
    if want and digest != want:
        raise DataError(f"{path} has sha256 {digest[:12]}…, but the manifest says {want[:12]}…: the tokenizer "
                        "was replaced after the data was prepared (restore it, or rerun `baton prepare --force`)")
    return digest


def hub_commits(manifest: dict[str, Any]) -> tuple[str | None, ...] | None:
    """Each source's Hub commit as the manifest pins it ("owner/name@sha", None for a local source); None
    when no source is a Hub one."""
    pins = [s.get("hub") if isinstance(s, dict) else None for s in manifest.get("sources") or []]
    if not any(isinstance(p, dict) for p in pins):
        return None
    return tuple(f"{p.get('repo')}@{p.get('commit')}" if isinstance(p, dict) else None for p in pins)


def moved_sources(old: tuple[str | None, ...] | None, new: tuple[str | None, ...] | None) -> str:
    """The Hub sources whose commit differs between the checkpoint's data and this data, in words ("" when
    none is known: a record from before Hub sources, or local sources only)."""
    out = []
    for i, (a, b) in enumerate(zip(old or (), new or ())):
        if not a or not b or a == b:
            continue
        (repo_a, _, commit_a), (repo_b, _, commit_b) = a.rpartition("@"), b.rpartition("@")
        if repo_a != repo_b:
            out.append(f"data source {i}: hub {a} -> {b}")
        else:
            out.append(f"data source {i}, hub {repo_a}: commit {commit_a} -> {commit_b}; revision = "
                       f"\"{commit_a}\" and `baton prepare --force` restore the checkpoint's data")
    return "; ".join(out)


def state_data(cfg_dict: dict[str, Any], fingerprint: str, tok_sha256: str,
               hub: tuple[str | None, ...] | None = None) -> DataStamp:
    """What a checkpoint records about its data, for the next resume to compare."""
    t, d = cfg_dict["train"], cfg_dict["data"]
    return DataStamp(fingerprint, tok_sha256, t["global_batch"] * d["seq_len"], hub)


def differences(state: CheckpointState, new_cfg: dict[str, Any], fingerprint: str, permutation: str,
                tok_sha256: str, total_steps: int | None = None,
                hub: tuple[str | None, ...] | None = None) -> list[Difference]:
    """Every difference between the checkpoint and this session that would make it a different run (``hub``:
    this data's Hub commits, ``hub_commits``)."""
    old_cfg = state.config
    out = [Difference(k, _get(old_cfg, k), _get(new_cfg, k)) for k in FROZEN_KEYS
           if _get(old_cfg, k) != _get(new_cfg, k)]
    try:
        old_tps = _get(old_cfg, "train.global_batch") * _get(old_cfg, "data.seq_len")
    except TypeError:
        old_tps = None
    new_tps = new_cfg["train"]["global_batch"] * new_cfg["data"]["seq_len"]
    if old_tps != new_tps:
        out.append(Difference(TOKENS_PER_STEP, old_tps, new_tps))
    cursor = state.cursor
    if cursor.get("dataset_fingerprint") != fingerprint:
        out.append(Difference("data.fingerprint", cursor.get("dataset_fingerprint"), fingerprint,
                              moved_sources(state.data.hub, hub)))
    if state.data.tokenizer_sha256 and state.data.tokenizer_sha256 != tok_sha256:
        out.append(Difference("data.tokenizer", state.data.tokenizer_sha256, tok_sha256))
    # The order's identity follows from the seed, the hold-out and the corpus; named only when none of
    # those explains a change (a different permutation algorithm).
    explained = {d.key for d in out} & {"data.shuffle_seed", "data.val_windows", "data.fingerprint", "data.seq_len"}
    if cursor.get("permutation_fingerprint") != permutation and not explained:
        out.append(Difference("data.permutation", cursor.get("permutation_fingerprint"), permutation))
    if total_steps is not None and state.total_steps is not None and state.total_steps != total_steps:
        out.append(Difference(HORIZON, state.total_steps, total_steps))
    return out


def horizon_problem(state: CheckpointState, new_cfg: dict[str, Any], total_steps: int) -> str | None:
    """Why the horizon may not move at this checkpoint (None: it may).

    Moving the horizon moves the decay. The run stays the run it would have been with the new horizon from
    the start only while every update so far ran at the same factor under both: warmup or plateau under the
    old schedule and the new. That needs the wsd schedule (cosine and linear decay from the warmup's end, so
    every later factor depends on the horizon) and a checkpoint at or before both decay starts.
    """
    from ..model.schedule import decay_begin

    step, old_total = state.step, state.total_steps or 0
    old_o, new_o = state.config.get("optim") or {}, new_cfg["optim"]
    kind = old_o.get("schedule", "wsd")
    if kind != "wsd" or new_o["schedule"] != "wsd":
        if step <= min(old_o.get("warmup_steps", 0), new_o["warmup_steps"]):
            return None
        return (f"the {kind} schedule decays from the end of the warmup, and the checkpoint at step {step} is "
                "past it: a new horizon would change the learning rate of updates already made")
    old_d0 = decay_begin(old_total, old_o.get("decay_start", 0.8), decay_step=old_o.get("decay_step", 0))
    new_d0 = decay_begin(total_steps, new_o["decay_start"], decay_step=new_o.get("decay_step", 0))
    if step > old_d0:
        return (f"the checkpoint at step {step} is past the decay start of the {old_total}-step schedule (step "
                f"{old_d0}): its cooldown has begun, and a new horizon cannot move it")
    if step > new_d0:
        return (f"the {total_steps}-step schedule would begin its decay at step {new_d0}, before the checkpoint at "
                f"step {step}: updates already made at the plateau's rate belong to its cooldown")
    return None


def refuse_drift(state: CheckpointState, new_cfg: dict[str, Any], total_steps: int, fingerprint: str,
                 permutation: str, tok_sha256: str, allowed: set[str] | frozenset[str] = frozenset(),
                 note: str = "", hub: tuple[str | None, ...] | None = None) -> list[Difference]:
    """Raise the one message that refuses a resume that drifts (every difference); returns the differences,
    all of them allowed. ``note`` is added to the message."""
    diffs = differences(state, new_cfg, fingerprint, permutation, tok_sha256, total_steps, hub)
    step = state.step
    lost = state.stats.lost_skips(state.skipped)
    if lost:
        raise ResumeError(f"the checkpoint at step {step} records rollbacks that skipped stream samples {lost}, but "
                          "its data cursor does not skip them: the checkpoint is inconsistent (resume from an "
                          "earlier checkpoint with --resume PATH, or start a new run.name)")
    if total_steps < step:
        if any(d.key != HORIZON and d.key not in allowed for d in diffs):
            _refuse(step, diffs, allowed, note)  # one message, every difference: the horizon's among them
        raise ResumeError(f"the horizon is {total_steps} steps but the checkpoint is at step {step}{note} (raise "
                          "train.steps or train.target_tokens, or start a new run.name)")
    _refuse(step, diffs, allowed, note)
    moved = next((d for d in diffs if d.key == HORIZON), None)
    if moved is not None:
        why = horizon_problem(state, new_cfg, total_steps)
        if why:
            raise ResumeError(f"refusing to move the horizon from {moved.old} to {moved.new} steps: {why}{note} "
                              f"(resume with train.steps = {moved.old}, or start a new run.name)")
    return diffs


def check_resume(state: CheckpointState, new_cfg: dict[str, Any], total_steps: int, fingerprint: str,
                 permutation: str, tok_sha256: str,
                 allowed: set[str] | frozenset[str] = frozenset(),
                 hub: tuple[str | None, ...] | None = None,
                 implied: frozenset[str] = frozenset()) -> list[Difference]:
    """Refuse a resume that drifts (one message, every difference); returns the differences allowed.
    ``implied``: keys allowed by what the session is rather than by --allow-change (a cooldown branch's own
    horizon, at its branch point), logged as such."""
    diffs = refuse_drift(state, new_cfg, total_steps, fingerprint, permutation, tok_sha256, allowed | implied,
                         hub=hub)
    said = {d.key for d in diffs}
    if any(d.key in implied for d in diffs):
        log.info("a cooldown branch's own, at its branch point: %s", "; ".join(str(d) for d in diffs if d.key in implied))
    diffs = [d for d in diffs if d.key not in implied]
    if diffs:
        log.warning("resuming with changes allowed by --allow-change: %s", "; ".join(str(d) for d in diffs))
    for key in sorted(set(allowed) - {d.key for d in diffs}):
        log.info("--allow-change %s: nothing to allow, it is unchanged", key)
    old_cfg = state.config
    free = [Difference(f"{sec}.{name}", old, new_cfg[sec][name])
            for sec, values in old_cfg.items() if isinstance(values, dict) and isinstance(new_cfg.get(sec), dict)
            for name, old in values.items()
            if name in new_cfg[sec] and old != new_cfg[sec][name] and f"{sec}.{name}" not in FROZEN_KEYS
            and f"{sec}.{name}" not in QUIET and f"{sec}.{name}" not in said]
    if free:
        log.info("resuming with changed settings: %s", "; ".join(str(d) for d in free))
    return [d for d in diffs if d.key in allowed]


def _refuse(step: Any, diffs: list[Difference], allowed: set[str] | frozenset[str], note: str = "") -> None:
    refused = [d for d in diffs if d.key not in allowed]
    if refused:
        could = [d.key for d in refused if d.key in ALLOWABLE]
        fix = "restore them, or start a new run.name"
        if could:
            fix += f"; if intended, pass --allow-change for {', '.join(could)}"
        raise ResumeError(f"refusing to resume: the checkpoint at step {step} differs from this config in what "
                          f"makes it the same run: {'; '.join(str(d) for d in diffs)}{note} ({fix})")


def check_before_pull(state: CheckpointState | None, cursor: dict[str, Any], step: Any, new_cfg: dict[str, Any],
                      total_steps: int, manifest: dict[str, Any], permutation: str | None,
                      allowed: set[str] | frozenset[str]) -> None:
    """The drift check made on the published manifest alone, before the dataset is downloaded (hours at a
    billion tokens) only to be refused: with the checkpoint's ``state`` every refusal ``check_resume`` would
    make (the tokenizer and order as the manifest implies them), else the corpus fingerprint against the
    ``cursor``. The whole check still runs on the pulled data."""
    note = "; the dataset at data.url was not downloaded"
    if state is None or permutation is None:
        old = cursor.get("dataset_fingerprint")
        if old != manifest["fingerprint"]:
            _refuse(step, [Difference("data.fingerprint", old, manifest["fingerprint"])], allowed, note)
        return
    refuse_drift(state, new_cfg, total_steps, manifest["fingerprint"], permutation, manifest["tokenizer"]["sha256"],
                 allowed, note, hub_commits(manifest))


def _config_keys() -> set[str]:
    from ..config import reference_table

    return {row[0] for row in reference_table()}


def validate_allowed(keys: list[str] | tuple[str, ...]) -> set[str]:
    """The --allow-change keys, or one error naming every key that cannot be allowed and why."""
    problems = []
    for k in keys:
        if k in ALLOWABLE:
            continue
        if k in SHAPE_KEYS:
            problems.append(f"{k} cannot change on resume (the checkpoint's weights have its shape)")
        elif k in GEOMETRY_KEYS or k == TOKENS_PER_STEP:
            problems.append(f"{k} cannot change on resume (the data cursor counts samples of this size)")
        elif k == OPTIMIZER_KEY:
            problems.append(f"{k} cannot change on resume (the checkpoint holds that optimizer's state)")
        elif k == "train.target_tokens":
            problems.append(f"{k} is allowed as {HORIZON} (the horizon, however configured)")
        elif k in _config_keys() and k not in COMPARED:
            problems.append(f"{k} needs no --allow-change (a resume may change it freely)")
        else:
            problems.append(f"{k} is not a key --allow-change knows")
    if problems:
        raise BatonError("--allow-change: " + "; ".join(problems) + f" (allowable: {', '.join(ALLOWABLE)}; other "
                         f"settings such as {', '.join(FREE_EXAMPLES)} or the number of ranks may change without "
                         "it)")
    return set(keys)
