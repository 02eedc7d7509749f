"""Per-rank logging: every rank writes its own file; rank 0 (and any rank's warnings) reach stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_FMT = "%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"


def setup(rank: int = 0, log_dir: Path | None = None, verbose: bool = False) -> Path | None:
    root = logging.getLogger("baton")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for h in list(root.handlers):
        if getattr(h, "_baton", False):
            root.removeHandler(h)
            h.close()
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    console.setFormatter(logging.Formatter("%(message)s" if rank == 0 else f"[rank {rank}] %(levelname)s %(message)s"))
    console._baton = True  # type: ignore[attr-defined]
    root.addHandler(console)
    path = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"rank-{rank}.log"
        fh = logging.FileHandler(path, encoding="utf-8")
        fh.setFormatter(logging.Formatter(_FMT.format(rank=rank)))
        fh._baton = True  # type: ignore[attr-defined]
        root.addHandler(fh)
    root.propagate = False
    return path
