"""A run's name and its cooldown branches': one maker and one parser each.

A cooldown branch (``baton anneal``) is a run of its own inside its main run's prefix in the store,
``<run>/branches/anneal-<step>-<tokens>``: it starts from the main run's verified checkpoint at ``step`` and
trains ``tokens`` more tokens while its learning rate decays. Its name is its whole definition (where it
starts, how long it cools down), so two requests for the same branch name the same folder, and any command
given the name knows the branch's horizon without reading anything.
"""

from __future__ import annotations

import re

BRANCHES = "branches"  # the folder of a run's branches, under the run's prefix
_ANNEAL = re.compile(r"anneal-([1-9][0-9]*)-([1-9][0-9]*)")


def anneal_name(step: int, tokens: int) -> str:
    """The branch that cools down from step ``step`` over ``tokens`` tokens."""
    return f"anneal-{step}-{tokens}"


def parse_anneal(name: str) -> tuple[int, int] | None:
    """(step, tokens) of a branch name ``anneal-<step>-<tokens>``; None for any other name."""
    m = _ANNEAL.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def branch_run(run: str, branch: str) -> str:
    """The run name (and store prefix) of ``branch`` of the main run ``run``."""
    return f"{run}/{BRANCHES}/{branch}"


def split_run(run: str) -> tuple[str, str | None]:
    """(main run, branch name) of a run name; the branch is None for a main run."""
    main, sep, branch = run.partition(f"/{BRANCHES}/")
    return (main, branch) if sep else (run, None)


def branches_in(keys: list[str] | set[str], run: str) -> list[str]:
    """The branch names of ``run`` that a listing of ``<run>/branches/`` shows, sorted by step, then tokens."""
    prefix = f"{run}/{BRANCHES}/"
    names = {k[len(prefix):].split("/", 1)[0] for k in keys if k.startswith(prefix)}
    found = [(parse_anneal(n), n) for n in names]
    return [n for at, n in sorted((at, n) for at, n in found if at is not None)]
