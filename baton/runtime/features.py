"""What the installed torch offers that a config may ask for, checked at session start.

pyproject.toml admits torch from 2.4, the oldest that notebook images still carry. Two settings need more:
Muon is ``torch.optim.Muon`` (torch 2.9), and FSDP is FSDP2's ``torch.distributed.fsdp.fully_shard`` (public
from torch 2.6). On an older torch a session that asks for either is refused in one line naming the
version it needs, before anything is written, instead of an AttributeError after the data is pulled.
"""

from __future__ import annotations

import importlib

import torch

from ..config import Config
from ..errors import ConfigError


def _has_muon() -> bool:
    return hasattr(torch.optim, "Muon")


def _has_fsdp2() -> bool:
    try:
        return hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard")
    except ImportError:
        return False


def refusals(cfg: Config, world: int) -> list[str]:
    """One line per setting this torch cannot run (empty when it can run them all)."""
    out = []
    have = torch.__version__.split("+")[0]
    if cfg.optim.name == "muon" and not _has_muon():
        out.append(f"optim.name = \"muon\" needs torch.optim.Muon, which torch 2.9 and newer have, and this is torch "
                   f"{have} (upgrade torch, or use optim.name = \"adamw\")")
    if cfg.train.parallel == "fsdp" and world > 1 and not _has_fsdp2():
        out.append(f"train.parallel = \"fsdp\" needs FSDP2 (torch.distributed.fsdp.fully_shard), which torch 2.6 and "
                   f"newer have, and this is torch {have} (upgrade torch, or use train.parallel = \"ddp\")")
    return out


def check(cfg: Config, world: int) -> None:
    problems = refusals(cfg, world)
    if problems:
        raise ConfigError("; ".join(problems))
