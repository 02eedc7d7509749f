"""baton: pretrain small Llama-style models across interruptible GPU sessions without losing a step.

The Python API (``baton.load_config``, ``prepare``, ``train``, ``status``, ``plan``, ``export``) lives in
``baton.api`` and is imported on first use, so ``import baton`` stays light (no torch until needed).
"""

import sys
import types

from .errors import BatonError, ConfigError, DataError, ResumeError, StoreError

__version__ = "0.1.0"

_API = ("load_config", "prepare", "publish_data", "train", "status", "plan", "export")

__all__ = ["BatonError", "ConfigError", "DataError", "ResumeError", "StoreError", *_API]


def _api_function(name: str) -> property:
    def get(package):
        from . import api

        return getattr(api, name)

    def ignore(package, value):
        # Importing the submodule baton.train (or .status, .plan, .export) binds it as an attribute of the
        # package; the function of the same name must keep the name. The module stays in sys.modules.
        pass

    return property(get, ignore, doc=f"baton.api.{name}")


class _Package(types.ModuleType):
    pass


for _name in _API:
    setattr(_Package, _name, _api_function(_name))
sys.modules[__name__].__class__ = _Package
