"""The optional libraries, the extra that brings each, and the one message when one is missing.

``pip install baton`` brings what training needs; plots, S3, trackers, Parquet, lm-eval and the fused loss
come with extras (pyproject.toml). A command that needs one and finds it missing ends with one line naming
the extra, never a traceback; a command for which it is a by-product (the plots beside a report or a bench
table) does its work and says what it left out.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType

from .errors import BatonError

log = logging.getLogger(__name__)

# top-level module -> (the package pip installs, the extra of baton that brings it)
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("matplotlib", "plot"),
    "boto3": ("boto3", "s3"),
    "botocore": ("boto3", "s3"),
    "yaml": ("pyyaml", "hub"),
    "pyarrow": ("pyarrow", "data"),
    "datasets": ("datasets", "data"),
    "lm_eval": ("lm-eval", "eval"),
    "liger_kernel": ("liger-kernel", "liger"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow-skinny", "mlflow"),
    "accelerate": ("accelerate", "bench"),
}


class MissingExtra(BatonError):
    """An optional library a command needs is not installed."""


def fix(module: str) -> str:
    """What to install for ``module``: ``pip install "baton[plot]"``."""
    return f'pip install "baton[{EXTRAS[module.split(".")[0]][1]}]"'


def missing(module: str, what: str) -> str:
    """The one line: ``{what} needs matplotlib, which is not installed (pip install "baton[plot]")``."""
    package = EXTRAS[module.split(".")[0]][0]
    return f"{what} needs {package}, which is not installed: {fix(module)}"


def available(module: str) -> bool:
    return importlib.util.find_spec(module.split(".")[0]) is not None


def require(module: str, what: str) -> ModuleType:
    """Import ``module`` for ``what``; a missing top-level package is a MissingExtra naming its extra. A package
    that is there but fails inside its own import is a different problem, and rises as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != module.split(".")[0]:
            raise
        raise MissingExtra(missing(module, what)) from None


def pyplot(what: str) -> ModuleType:
    """matplotlib.pyplot on the file-only Agg backend (no display on a training machine)."""
    matplotlib = require("matplotlib", what)
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", what)


def skip_note(module: str, what: str) -> str:
    """Logged where a by-product is left out: ``{what} skipped: ...``; returns the line."""
    line = f"{what} left out: {EXTRAS[module.split('.')[0]][0]} is not installed ({fix(module)})"
    log.warning("%s", line)
    return line


def plotting(what: str) -> bool:
    """Whether plots can be drawn; when not, says once here that ``what`` is left out (the rest of the work goes on)."""
    if available("matplotlib"):
        return True
    skip_note("matplotlib", what)
    return False
