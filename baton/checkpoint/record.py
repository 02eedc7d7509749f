"""``state.json``: everything a checkpoint holds besides its tensors, as one typed record with one parser.

Its sha256 matched the pointer before it is read, yet its values may not be what this version wrote (a hand
edit with the hashes updated): ``from_json`` checks each for its kind, so no code further on meets a wrong
type. A record written by an earlier version of this format still loads (``tests/assets/records``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ResumeError
from .names import STATE_FILE
from .pointer import Lineage

FORMAT = "baton-checkpoint-v1"
# A checkpoint that passed its sha256 checks but cannot be read was written that way: no retry helps.
DAMAGED = "; the checkpoint is unusable: resume from an earlier checkpoint (--resume PATH), or start a new run.name"


@dataclass
class Stats:
    """Counters that travel in the checkpoint so a resumed run reports whole-run totals."""

    nonfinite_skips: int = 0
    consecutive_nonfinite: int = 0
    last_loss: float | None = None
    spike_window: list[float] = field(default_factory=list)  # the spike detector's recent losses
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # one record per spike rollback (session.rollback)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stats:
        # Keys of earlier versions that are no longer counters (``checkpoints``) are dropped.
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in fields(cls)}})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lost_skips(self, skipped: list[list[int]]) -> list[list[int]]:
        """The ranges these rollbacks skipped that ``skipped`` (the cursor's) does not cover: none, when sound.
        The skipped ranges are part of the data position; a cursor without them would read those samples."""
        return [r["skip"] for r in self.rollbacks
                if not any(a <= r["skip"][0] and r["skip"][1] <= b for a, b in skipped)]


@dataclass(frozen=True)
class DataStamp:
    """What a checkpoint records about its data, for the next resume to compare."""

    fingerprint: str | None = None
    tokenizer_sha256: str | None = None
    tokens_per_step: int | None = None
    # Each data source's Hub commit ("owner/name@sha"; None for a local source), in source order: what lets a
    # changed fingerprint be explained by the revision that moved. None where no source is a Hub one, and in
    # records written before Hub sources.
    hub: tuple[str | None, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fingerprint": self.fingerprint, "tokenizer_sha256": self.tokenizer_sha256,
                               "tokens_per_step": self.tokens_per_step}
        if self.hub is not None:
            out["hub"] = list(self.hub)
        return out


@dataclass(frozen=True)
class Shortened:
    """Anytime mode's decision (``session.anytime``) that shortened the run's horizon so its cooldown ends inside
    the quota: kept in every later checkpoint, so every later session trains to ``horizon``."""

    planned: int  # the config's horizon (train.steps, or train.target_tokens in steps) when it was decided
    horizon: int  # the horizon the run trains to since
    step: int  # the step it was decided at (its cooldown begins there, or before the next checkpoint)
    line: str = ""  # the one line that said so, with the forecast's numbers

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> Shortened | None:
        """The record in ``d``, or None when it is not one (its reader names it)."""
        if not (isinstance(d, dict) and all(type(d.get(k)) is int and d[k] >= 0 for k in ("planned", "horizon", "step"))
                and isinstance(d.get("line", ""), str) and d["step"] < d["horizon"] < d["planned"]):
            return None
        return cls(d["planned"], d["horizon"], d["step"], d.get("line", ""))


@dataclass
class CheckpointState:
    step: int
    total_steps: int | None
    cursor: dict[str, Any]  # data.reader.Cursor.to_dict(): the data position at ``step``
    config: dict[str, Any]  # the resolved config that trained it (Config.to_dict())
    rng_ranks: list[dict[str, Any]]  # every rank's generators (checkpoint.state.rng_state), rank order
    optimizer_param_groups: list[dict[str, Any]]
    scaler: dict[str, Any] | None = None  # the GradScaler's state under fp16
    stats: Stats = field(default_factory=Stats)
    data: DataStamp = field(default_factory=DataStamp)
    params: int | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    # The verified checkpoint this one follows, and the session that saved it: how a later session knows
    # whether a folder left unpushed on disk continues the store's line of work.
    parent: Lineage | None = None
    session: str | None = None
    shortened: Shortened | None = None  # anytime mode shortened the horizon (``total_steps``) from the config's

    @property
    def skipped(self) -> list[list[int]]:
        return [list(r) for r in self.cursor.get("skipped") or ()]

    def horizon(self, config_steps: int) -> int:
        """The horizon a resume from this checkpoint trains to when the config names ``config_steps``: the one
        anytime mode shortened it to while the config still names the horizon it shortened, else the config's
        (a different one is a move of the horizon, which ``session.drift`` allows or refuses as any other)."""
        if self.shortened is not None and self.shortened.planned == config_steps:
            return self.shortened.horizon
        return config_steps

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "step": self.step, "total_steps": self.total_steps, "cursor": self.cursor,
                "scaler": self.scaler, "rng": {"world_size": len(self.rng_ranks), "ranks": self.rng_ranks},
                "stats": self.stats.to_json(), "config": self.config, "versions": self.versions,
                "params": self.params, "data": self.data.to_json(),
                "parent": self.parent.to_json() if self.parent else None, "session": self.session,
                "optimizer_param_groups": self.optimizer_param_groups,
                **({"shortened": self.shortened.to_json()} if self.shortened else {})}

    @classmethod
    def from_json(cls, state: Any, where: str) -> CheckpointState:
        """The record in ``state`` (parsed JSON) read from ``where``, or one ResumeError naming every problem."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            found = state.get("format") if isinstance(state, dict) else None
            raise ResumeError(f"{where} is not a {FORMAT} state (format={found!r}){DAMAGED}")
        for key in ("step", "cursor", "config", "rng"):
            if key not in state:
                raise ResumeError(f"{where} lacks {key!r}{DAMAGED}")
        ranks = state["rng"].get("ranks") if isinstance(state["rng"], dict) else None
        stats, data = state.get("stats") or {}, state.get("data") or {}
        rollbacks = stats.get("rollbacks", []) if isinstance(stats, dict) else None
        groups = state.get("optimizer_param_groups")
        wrong = [what for what, ok in (
            ("step is not a count", type(state["step"]) is int and state["step"] >= 0),
            ("total_steps is not a count", state.get("total_steps") is None
             or (type(state["total_steps"]) is int and state["total_steps"] >= 0)),
            ("cursor is not a table", isinstance(state["cursor"], dict)),
            ("cursor.skipped is not a list of ranges", isinstance(state["cursor"], dict)
             and _ranges(state["cursor"].get("skipped") or [])),
            ("config is not a table", isinstance(state["config"], dict)
             and all(isinstance(v, dict) for v in state["config"].values())),
            ("rng.ranks is not a list of tables", isinstance(ranks, list) and bool(ranks)
             and all(isinstance(r, dict) for r in ranks)),
            ("optimizer_param_groups is not a list of tables", isinstance(groups, list)
             and all(isinstance(g, dict) for g in groups)),
            ("scaler is not a GradScaler's state (scale, growth_factor, backoff_factor, growth_interval, "
             "_growth_tracker; a finite scale > 0)", _scaler(state.get("scaler"))),
            ("stats is not a table", isinstance(stats, dict)),
            ("stats holds counters of the wrong type", not isinstance(stats, dict) or _stats(stats)),
            ("stats.rollbacks is not a list of rollback records", isinstance(rollbacks, list)
             and all(isinstance(r, dict) and _ranges([r.get("skip")]) for r in rollbacks)),
            ("data is not a table", isinstance(data, dict)),
            ("data.hub is not a list of owner/name@commit", not isinstance(data, dict) or data.get("hub") is None
             or (isinstance(data["hub"], list) and all(h is None or (isinstance(h, str) and "@" in h)
                                                       for h in data["hub"]))),
            ("parent is not a lineage", state.get("parent") is None or Lineage.from_json(state["parent"]) is not None),
            ("session is not a name", state.get("session") is None or isinstance(state["session"], str)),
            ("shortened is not a shortened horizon (planned > horizon > step)", state.get("shortened") is None
             or (Shortened.from_json(state["shortened"]) is not None
                 and state["shortened"]["horizon"] == state.get("total_steps"))),
        ) if not ok]
        if wrong:
            raise ResumeError(f"{where} is malformed: {'; '.join(wrong)}{DAMAGED}")
        return cls(step=state["step"], total_steps=state.get("total_steps"), cursor=state["cursor"],
                   config=state["config"], rng_ranks=ranks, optimizer_param_groups=groups,  # type: ignore[arg-type]
                   scaler=state.get("scaler"), stats=Stats.from_json(stats),
                   data=DataStamp(**{k: data.get(k) for k in ("fingerprint", "tokenizer_sha256", "tokens_per_step")},
                                  hub=tuple(data["hub"]) if data.get("hub") is not None else None),
                   params=state.get("params"), versions=state.get("versions") or {},
                   parent=Lineage.from_json(state.get("parent")), session=state.get("session"),
                   shortened=Shortened.from_json(state.get("shortened")))


def _number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _scaler(sc: Any) -> bool:
    """None, {} (no scaler: fp32, bf16) or a GradScaler's state_dict, which ``load_state_dict`` reads key by key."""
    if sc is None or sc == {}:
        return True
    keys = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    return (isinstance(sc, dict) and all(_number(sc.get(k)) for k in keys) and sc["scale"] > 0
            and type(sc["growth_interval"]) is int and type(sc["_growth_tracker"]) is int)


def _stats(st: dict[str, Any]) -> bool:
    counts = all(type(st.get(k, 0)) is int and st.get(k, 0) >= 0 for k in ("nonfinite_skips", "consecutive_nonfinite"))
    window = st.get("spike_window", [])
    return (counts and (st.get("last_loss") is None or type(st["last_loss"]) in (int, float))
            and isinstance(window, list) and all(_number(x) for x in window))


def _ranges(rs: Any) -> bool:
    return isinstance(rs, list) and all(isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
                                        for r in rs)


def read_state(ckpt: Path) -> CheckpointState:
    """The ``state.json`` of the checkpoint folder ``ckpt``."""
    path = ckpt / STATE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResumeError(f"{ckpt} has no {STATE_FILE}: not a complete baton checkpoint{DAMAGED}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResumeError(f"{path} is not valid JSON ({e}){DAMAGED}") from None
    return CheckpointState.from_json(raw, str(path))


def parse_state_text(text: str, where: str) -> CheckpointState | None:
    """A ``state.json`` read from a store as text; None when it is not one (its reader reports that later)."""
    try:
        return CheckpointState.from_json(json.loads(text), where)
    except (ValueError, ResumeError):
        return None
