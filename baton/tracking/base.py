"""The logger interface every tracker backend implements, and the one mapping from a metrics row to scalars."""

from __future__ import annotations

from typing import Any, Protocol

# metrics.jsonl key -> the tracker's name for it (TensorBoard's tags of old, kept for every backend)
SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
           "tokens_per_s": "train/tokens_per_s", "mfu": "train/mfu", "spike_score": "train/spike_score",
           "val_loss": "val/loss", "val_ppl": "val/ppl", "eval_seconds": "val/seconds"}


def scalars(row: dict[str, Any]) -> dict[str, float]:
    return {name: float(row[k]) for k, name in SCALARS.items() if isinstance(row.get(k), (int, float))}


class Backend(Protocol):
    name: str
    # live: a local sink that resuming rewrites, fed each row as it is made. Not live: an append-only
    # tracker run, fed only rows up to the newest verified checkpoint (see Trackers).
    live: bool
    # Not live only, optional (read with getattr, default False): ``durable``, whether a row is kept by the
    # tracker once log() returns (else: once close() returns).

    def start(self, resume_step: int, saved: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Open (or create) this backend's run. ``saved``: what an earlier session kept in the store for it.
        Returns what to keep in the store now (ids; never credentials) and the newest step it already holds."""

    def log(self, step: int, row: dict[str, Any]) -> None:
        """One metrics row (the metrics.jsonl row, or a few values of the final evaluation)."""

    def close(self, complete: bool) -> None:
        """End of the session; ``complete``: the run reached its horizon."""
