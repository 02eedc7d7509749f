"""Tripwires: decisions fixed before launch ("below R tok/s, cut the target to T tokens", "below R, switch to
micro-batch m x accumulation a"), checked against a measured rate, with the config overrides each one means."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import BatonError
from .plan import PlanInput, parse_count


@dataclass(frozen=True)
class Tripwire:
    """'below ``rate`` tok/s, do ``action``': a decision fixed before launch, checked against a measurement."""

    rate: float
    target_tokens: int | None = None
    steps: int | None = None
    micro_batch: int | None = None
    accum: int | None = None
    text: str = ""

    def describe(self) -> str:
        acts = []
        if self.target_tokens is not None:
            acts.append(f"cut the target to {self.target_tokens:,} tokens")
        if self.steps is not None:
            acts.append(f"cut the horizon to {self.steps:,} steps")
        if self.micro_batch is not None:
            acts.append(f"switch to micro-batch {self.micro_batch}"
                        + (f" x accumulation {self.accum}" if self.accum is not None else "")
                        + " (same tokens per step)")
        return f"below {self.rate:,.0f} tok/s: " + " and ".join(acts)


_KEYS = {"target": "target_tokens", "target_tokens": "target_tokens", "tokens": "target_tokens",
         "steps": "steps", "micro": "micro_batch", "micro_batch": "micro_batch", "m": "micro_batch",
         "accum": "accum", "accumulation": "accum", "a": "accum"}


def parse_tripwire(text: str) -> Tripwire:
    """'7400: micro=8, accum=16' or 'below 5150: target=0.9B' -> Tripwire."""
    head, sep, body = text.partition(":")
    head = head.strip().lower().removeprefix("below").strip().removesuffix("tok/s").strip()
    if not sep or not body.strip():
        raise BatonError(f"tripwire {text!r} is not 'RATE: key=value, ...' (example: '7400: micro=8, accum=16')")
    kwargs: dict[str, int] = {}
    for item in re.split(r"[,\s]+", body.strip()):
        if not item:
            continue
        key, eq, value = item.partition("=")
        name = _KEYS.get(key.strip().lower())
        if not eq or name is None:
            raise BatonError(f"tripwire {text!r}: {item!r} is not one of target=, steps=, micro=, accum=")
        kwargs[name] = parse_count(value, f"tripwire {name}")
    if "target_tokens" in kwargs and "steps" in kwargs:
        raise BatonError(f"tripwire {text!r}: a horizon is target= or steps=, not both (train takes exactly one)")
    if "accum" in kwargs and "micro_batch" not in kwargs:
        raise BatonError(f"tripwire {text!r}: accum= needs micro= (accumulation follows from the micro-batch)")
    if any(v <= 0 for v in kwargs.values()):
        raise BatonError(f"tripwire {text!r}: every value must be > 0")
    rate = float(parse_count(head, "tripwire rate"))
    if rate <= 0:  # no measured rate is below 0 tok/s: the tripwire could never fire
        raise BatonError(f"tripwire {text!r}: the rate must be > 0 tok/s (example: '7400: micro=8, accum=16')")
    return Tripwire(rate=rate, text=text.strip(), **kwargs)


@dataclass
class TripwireResult:
    wire: Tripwire
    fired: bool
    overrides: list[str]
    problem: str = ""


def evaluate_tripwires(wires: list[Tripwire], measured_rate: float, tokens_per_step: int,
                       global_batch: int | None = None, seq_len: int | None = None,
                       ranks: int | None = None, total_steps: int | None = None) -> list[TripwireResult]:
    """Which tripwires a measured rate trips, and the config overrides each one means.

    A micro-batch switch must keep tokens per step: micro x accumulation x ranks x seq_len must equal
    ``tokens_per_step`` (checked when the geometry is known), so the schedule and horizon stay as planned.
    A cut of the target or the horizon must be below the planned horizon (``total_steps``, when known).
    """
    out = []
    for w in wires:
        fired = measured_rate < w.rate
        overrides: list[str] = []
        problems: list[str] = []
        if w.target_tokens is not None:
            overrides.append(f"train.target_tokens={w.target_tokens}")
            overrides.append("train.steps=0")
            if w.target_tokens < tokens_per_step:
                problems.append(f"a target of {w.target_tokens:,} tokens is less than one step of "
                                f"{tokens_per_step:,} tokens")
            elif total_steps is not None and w.target_tokens // tokens_per_step >= total_steps:
                problems.append(f"a target of {w.target_tokens:,} tokens is {w.target_tokens // tokens_per_step:,} "
                                f"steps, not below the planned {total_steps:,}: it cuts nothing")
        if w.steps is not None:
            overrides.append(f"train.steps={w.steps}")
            if total_steps is not None and w.steps >= total_steps:
                problems.append(f"{w.steps:,} steps is not below the planned {total_steps:,}: it cuts nothing")
        if w.micro_batch is not None:
            overrides.append(f"train.micro_batch={w.micro_batch}")
            if w.accum is None and global_batch is not None and global_batch % (w.micro_batch * (ranks or 1)):
                # Accumulation follows from the micro-batch: it must divide each rank's share of the global batch.
                problems.append(f"micro {w.micro_batch} x {ranks or 1} rank(s) does not divide the global batch of "
                                f"{global_batch} samples")
            if w.accum is not None:
                if global_batch is not None:
                    if global_batch % (w.micro_batch * w.accum):
                        problems.append(f"micro {w.micro_batch} x accum {w.accum} does not divide the global "
                                        f"batch of {global_batch} samples")
                    elif ranks is not None and global_batch != w.micro_batch * w.accum * ranks:
                        problems.append(f"micro {w.micro_batch} x accum {w.accum} x {ranks} ranks = "
                                        f"{w.micro_batch * w.accum * ranks} samples, not the global batch of "
                                        f"{global_batch}")
                elif seq_len is not None and ranks is not None:
                    got = w.micro_batch * w.accum * ranks * seq_len
                    if got != tokens_per_step:
                        problems.append(f"micro x accum x ranks x seq_len = {got:,} tokens per step, not "
                                        f"{tokens_per_step:,}")
        out.append(TripwireResult(w, fired, overrides, "; ".join(problems)))
    return out


def apply_tripwires(inp: PlanInput, results: list[TripwireResult]) -> PlanInput:
    """The plan input after every fired tripwire's horizon change (geometry changes keep tokens/step); a
    tripwire with a problem is not applied."""
    new = inp
    for r in results:
        if not r.fired or r.problem:
            continue
        if r.wire.target_tokens is not None:
            new = replace(new, total_steps=max(new.start_step, r.wire.target_tokens // new.tokens_per_step),
                          target_tokens=r.wire.target_tokens)
        if r.wire.steps is not None:
            new = replace(new, total_steps=max(new.start_step, r.wire.steps), target_tokens=0)
    return new
