"""``train.deterministic``: the same computation gives the same bits, so a run stopped, wiped and resumed on
CUDA ends bit-identical to one that never stopped.

Without it a resumed run follows the uninterrupted one only within rounding: cuBLAS picks split-K
reductions by workspace, and several CUDA backward kernels (attention, the embedding's gradient) add in
whatever order atomics land. The switch costs speed (deterministic kernels, a fixed cuBLAS workspace, no
cuDNN autotuning), so it is off by default. On CPU the kernels baton uses are deterministic already.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)

# cuBLAS is deterministic with one of these fixed workspace configurations; it reads the variable when it
# creates its handle, i.e. at the first matrix multiply on a GPU.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def enable() -> None:
    """Process-wide; call before anything runs on the GPU."""
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            log.warning("train.deterministic: CUDA was initialised before CUBLAS_WORKSPACE_CONFIG was set; set "
                        "CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment for bit-identical matrix multiplies")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]
    # transformers' FlashAttention-2 call reads this for its deterministic backward.
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    # An operation without a deterministic kernel raises instead of silently breaking the promise.
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    log.info("train.deterministic: deterministic algorithms on (slower; CUBLAS_WORKSPACE_CONFIG=%s)",
             os.environ["CUBLAS_WORKSPACE_CONFIG"])
