"""The tracker backends by name, and the optional package each one needs (checked before training starts)."""

from __future__ import annotations

import importlib
import importlib.util

from .. import extras
from ..errors import ConfigError

BACKENDS = ("jsonl", "tensorboard", "wandb", "mlflow")
# backend -> (importable module, what to install)
PACKAGES = {name: (name, extras.fix(name)) for name in ("tensorboard", "wandb", "mlflow")}


def check_installed(backends: list[str]) -> None:
    """One line, at start, before anything is written: a backend whose package is missing, or is installed but
    fails on import (a broken install, a version clash). Each is imported here, as it will be when opened."""
    problems = []
    for b in backends:
        if b not in PACKAGES:
            continue
        mod, fix = PACKAGES[b]
        if importlib.util.find_spec(mod) is None:
            problems.append(f"{b}, but the {mod!r} package is not installed ({fix}, or remove {b!r} from "
                            "log.backends)")
            continue
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any failure of a third-party import means the same here
            said = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            problems.append(f"{b}, but the installed {mod!r} package fails on import ({said}; reinstall it: {fix}, "
                            f"or remove {b!r} from log.backends)")
    if problems:
        raise ConfigError("log.backends asks for " + "; ".join(problems))
