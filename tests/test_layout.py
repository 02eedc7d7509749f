"""The import direction of the layout is enforced: `lint-imports` (run by `make lint`) keeps the tree as it is
and breaks on a copy given one upward import or one cycle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env={"PYTHONPATH": str(tree)},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("layout")
    shutil.copytree(ROOT / "baton", tree / "baton", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree)
    return tree


def test_the_tree_keeps_its_contracts(copy):
    r = _lint(copy)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


@pytest.mark.parametrize("module, line, broken", [
    # the store reaching up into the session: an upward import
    ("baton/store/base.py", "from ..session import core as _up\n", "baton.store.base -> baton.session.core"),
    # the parts importing the session that builds them: a cycle inside session/
    ("baton/session/parts.py", "from . import core as _cycle\n", "No cycles are allowed in baton.session"),
])
def test_an_upward_import_or_a_cycle_breaks_a_contract(copy, module, line, broken):
    path = copy / module
    original = path.read_text()
    try:
        path.write_text(original + line)
        r = _lint(copy)
    finally:
        path.write_text(original)
    assert r.returncode != 0 and "BROKEN" in r.stdout and broken in r.stdout, r.stdout + r.stderr
