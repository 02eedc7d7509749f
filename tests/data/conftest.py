"""Fixtures of the data tests: a real three-source mix (JSONL, Parquet, text folder), prepared once."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.mixdata import write_mix, write_mix_config


@pytest.fixture(scope="session")
def mix_paths(tmp_path_factory) -> dict[str, Path]:
    return write_mix(tmp_path_factory.mktemp("mix-sources"))


@pytest.fixture(scope="session")
def mix_prepared(tmp_path_factory, mix_paths) -> tuple[Path, Path]:
    """(config, data folder) of the mix prepared once in this process; read-only by convention."""
    from baton.config import load_config
    from baton.data.prepare import prepare

    base = tmp_path_factory.mktemp("mix-prepared")
    cfg = write_mix_config(base / "mix.toml", base / "data", mix_paths, data={"shard_tokens": 8000})
    prepare(load_config(cfg), progress=False)
    return cfg, base / "data"
