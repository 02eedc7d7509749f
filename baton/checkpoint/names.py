"""Checkpoint file and folder names: ``step-N`` locally, ``ckpt/step-N`` under the run in the store. One parser.

Local folders may carry a tail: ``step-N.partial`` (a save in progress), ``step-N-node1`` (a pull on one
node of several sharing a file system). Only ``parse_step(..., tail=True)`` accepts one.
"""

from __future__ import annotations

import re

CKPT_DIR = "ckpt"
# The files of a checkpoint folder (checkpoint.state writes them).
MODEL_FILE = "model.safetensors"  # the fp32 master weights
OPTIM_FILE = "optimizer.safetensors"  # the optimizer's per-parameter tensors
STATE_FILE = "state.json"  # everything else, under named keys (checkpoint.record)
METRICS_FILE = "metrics.jsonl"  # the per-step metrics so far
REQUIRED = (MODEL_FILE, OPTIM_FILE, STATE_FILE)
_NAME = re.compile(r"(?:ckpt/)?step-(\d+)")
_TAIL = re.compile(r"(?:ckpt/)?step-(\d+)(?:-node\d+)?(?:\.partial)?")


def ckpt_path(step: int) -> str:
    """The checkpoint of ``step`` relative to the run's prefix in the store."""
    return f"{CKPT_DIR}/step-{step}"


def folder_name(step: int) -> str:
    return f"step-{step}"


def parse_step(name: str, tail: bool = False) -> int | None:
    """The step a checkpoint folder name (``step-N`` or ``ckpt/step-N``) names; None for any other name.
    ``tail``: a local folder's ``-nodeK`` and ``.partial`` endings are allowed too."""
    m = (_TAIL if tail else _NAME).fullmatch(name)
    return int(m.group(1)) if m else None
