"""A file:// URL names an absolute path; file://rel/x (host "rel") is refused, never taken as the folder rel/x."""

from __future__ import annotations

import re

import pytest

from baton.cli import main
from baton.config import load_config
from baton.errors import ConfigError
from baton.store import open_store


def _words(key: str, url: str) -> str:
    return (f"{key} {url} is a file:// URL without an absolute path (what follows file:// is read as a host): "
            "write file:///absolute/path or a plain path")


@pytest.mark.parametrize("key", ["store.url", "data.url", "publish.url"])
def test_config_refuses_a_relative_file_url(key):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}=file://rel/x"])
    assert _words(key, "file://rel/x") in str(e.value)


def test_opening_and_verify_data_refuse_it_and_an_absolute_one_opens(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel" / "x").mkdir(parents=True)  # the folder it would have been mistaken for
    with pytest.raises(ConfigError, match="^" + re.escape(_words("data.url", "file://rel/x")) + "$"):
        open_store("file://rel/x", key="data.url")
    assert main(["verify-data", "--dir", "file://rel/x"]) == 2
    assert capsys.readouterr().err.strip() == f"baton: error: {_words('--dir', 'file://rel/x')}"
    assert open_store(f"file://{tmp_path}/rel/x").describe() == open_store(str(tmp_path / "rel" / "x")).describe()


def test_a_file_url_is_percent_decoded_and_a_plain_path_is_as_typed(tmp_path):
    (tmp_path / "My Drive").mkdir()
    assert open_store(f"file://{tmp_path}/My%20Drive").describe() == open_store(str(tmp_path / "My Drive")).describe()
    assert open_store(str(tmp_path / "a%20b")).describe().endswith("a%20b")  # a path's own characters
