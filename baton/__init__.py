"""baton: pretrain small Llama-style models across interruptible GPU sessions without losing a step.

The Python API (``baton.load_config``, ``prepare``, ``publish_data``, ``train``, ``anneal``, ``branch``, ``status``,
``plan``, ``simulate``, ``export``, ``eval``, ``publish``) lives in ``baton.api`` and is imported on first use, so
``import baton`` stays light (no torch until needed). No submodule of the package carries one of these names.
"""

from typing import Any

from .errors import BatonError, ConfigError, DataError, ResumeError, StoreError

__version__ = "0.1.0"

_API = ("load_config", "prepare", "publish_data", "train", "anneal", "branch", "status", "plan", "simulate", "export",
        "eval", "publish")

__all__ = ["BatonError", "ConfigError", "DataError", "ResumeError", "StoreError", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
