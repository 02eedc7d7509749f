"""What the dataset relay shares: the store at ``data.url`` and the files a published dataset consists of.

A published dataset is a prepared data folder at the root of ``data.url``: the shards and the tokenizer,
then ``manifest.json``, written last, as the commit marker (a location without one holds no dataset).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import ConfigError
from ..store import RetryPolicy, Store, open_store
from .shards import HEADER_SIZE

ITEMSIZE = {"uint16": 2, "uint32": 4}


def data_store(cfg: Config) -> Store:
    if not cfg.data.url:
        raise ConfigError("data.url is not set: name where the prepared dataset lives (a folder, file://, "
                          "s3://bucket/prefix or hf://datasets/owner/name)")
    return open_store(cfg.data.url, RetryPolicy.from_config(cfg.store), key="data.url")


def dataset_files(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> {"sha256", "size"} of every file of the dataset but the manifest, shards first. A shard's size
    follows from its token count; the tokenizer's is not recorded (None)."""
    itemsize = ITEMSIZE.get(m["dtype"], 2)
    out = {s["file"]: {"sha256": s["sha256"], "size": HEADER_SIZE + int(s["tokens"]) * itemsize}
           for s in m["shards"]}
    tok = m["tokenizer"]
    out[tok.get("file", "tokenizer.json")] = {"sha256": tok.get("sha256"), "size": None}
    return out


def store_folder(store: Store) -> Path | None:
    """The folder a local store keeps its objects in (None for a remote store)."""
    root = getattr(store, "root", None)
    return Path(root) if isinstance(root, (str, os.PathLike)) else None


def same_folder(store: Store, local: Path) -> bool:
    """Whether ``local`` is the store's own folder: then the data is used where it lies, never copied onto itself."""
    root = store_folder(store)
    try:
        return root is not None and local.exists() and root.exists() and os.path.samefile(root, local)
    except OSError:
        return False
