"""The tracker backends by name, and the optional package each one needs (checked before training starts)."""

from __future__ import annotations

import importlib.util

from ..errors import ConfigError

BACKENDS = ("jsonl", "tensorboard", "wandb", "mlflow")
# backend -> (importable module, what to install)
PACKAGES = {"tensorboard": ("tensorboard", "pip install 'baton[tensorboard]'"),
            "wandb": ("wandb", "pip install 'baton[wandb]'"),
            "mlflow": ("mlflow", "pip install 'baton[mlflow]'")}


def check_installed(backends: list[str]) -> None:
    """One line, at start: a backend whose package is missing (found without importing it: wandb and mlflow
    take seconds to import)."""
    missing = [(b, PACKAGES[b]) for b in backends if b in PACKAGES and importlib.util.find_spec(PACKAGES[b][0]) is None]
    if missing:
        raise ConfigError("log.backends asks for " + "; ".join(
            f"{b}, but the {mod!r} package is not installed ({fix}, or remove {b!r} from log.backends)"
            for b, (mod, fix) in missing))
