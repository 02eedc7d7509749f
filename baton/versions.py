"""What produced a run: package versions, Python, and the git revision when run from a checkout."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from . import __version__

PACKAGES = ("torch", "transformers", "safetensors", "tokenizers", "numpy")


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"baton": __version__, "python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    out["git_rev"] = _git_rev()
    return out


def _git_rev() -> str | None:
    here = Path(__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if rev.returncode:
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
