"""Stores, chosen by URL; remote backends are imported only when a URL names them."""

from __future__ import annotations

from .. import extras
from ..errors import ConfigError
from ..guard import local_store_root
from .base import ObjectInfo, RangeRead, Store, Versioned, delete_keys, delete_prefix, put_files, safe_key
from .retry import RetryPolicy

__all__ = ["ObjectInfo", "RangeRead", "RetryPolicy", "Store", "check_write_access", "delete_keys", "delete_prefix",
           "open_store", "put_files", "safe_key", "Versioned"]


def check_write_access(store: Store) -> None:
    """Before work that ends in a write: a store that can tell a credential may only read (the Hub's whoami)
    says so now. Other stores tell nothing cheaply; their first write reports it."""
    check = getattr(store, "check_write_access", None)
    if check is not None:
        check()


def open_store(url: str, retry: RetryPolicy | None = None, key: str = "store.url") -> Store:
    """The backend the URL names; remote ones are imported here, only when used. ``key``: the config key the
    URL came from, named in errors about it."""
    if url.startswith("s3://"):
        extras.require("boto3", f"store {url.split('?')[0]}")
        from .s3 import S3Store

        return S3Store.from_url(url, retry)
    if url.startswith("hf://"):
        from .hub import HubStore  # huggingface_hub comes with transformers: always there

        return HubStore.from_url(url, retry, key=key)
    if "://" in url and not url.startswith("file://"):
        raise ConfigError(f"{key} {url.split('://')[0]}:// is not supported (use a path, file://, s3:// or hf://)")
    from .local import LocalStore

    return LocalStore(str(local_store_root(url, key)), retry)
