"""The optional libraries: one table names the extra for each, and one message says what to install."""

from __future__ import annotations

import sys

import pytest

from baton import extras
from baton.errors import BatonError


def test_a_missing_library_is_one_line_naming_its_extra(monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"] + ["matplotlib", "matplotlib.pyplot"]:
        monkeypatch.setitem(sys.modules, name, None)  # an import fails as when it is not installed
    with pytest.raises(extras.MissingExtra) as e:
        extras.require("matplotlib.pyplot", "the bench plot")
    assert isinstance(e.value, BatonError)
    assert str(e.value) == 'the bench plot needs matplotlib, which is not installed: pip install "baton[plot]"'


def test_every_extra_named_is_one_pyproject_declares():
    from baton.config import tomllib
    from support.compat_envs import ROOT

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (package, extra) in extras.EXTRAS.items():
        assert extra in declared, (module, extra)
        assert any(dep.lower().startswith(package.lower()) for dep in declared[extra]), (module, package, extra)


def test_a_library_that_fails_inside_its_own_import_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "__init__.py").write_text("import a_module_wandb_needs_and_lacks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with pytest.raises(ModuleNotFoundError, match="a_module_wandb_needs_and_lacks"):
        extras.require("wandb", "log.backends wandb")


def test_plots_left_out_are_said_once_where_they_are_left_out(monkeypatch, caplog):
    monkeypatch.setattr(extras, "available", lambda module: False)
    assert extras.plotting("the report's plots") is False
    assert [r.getMessage() for r in caplog.records] == [
        'the report\'s plots left out: matplotlib is not installed (pip install "baton[plot]")']

