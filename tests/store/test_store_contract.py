"""The contract every backend keeps: push, list with size and sha256, ranged read, pointer write/read-back,
delete, retention. One suite, run against the local store, the S3 server and the Hub server."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from baton.checkpoint.cycle import POINTER, push_checkpoint, write_pointer
from baton.checkpoint.names import REQUIRED
from baton.checkpoint.pointer import make_pointer
from baton.errors import StoreError
from baton.store import delete_prefix, put_files
from support.store_backends import AWS_TEST_KEY, AWS_TEST_SECRET


def make_files(folder: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    rnd = __import__("random").Random(seed)
    out = {}
    for name, size in sizes.items():
        data = rnd.randbytes(size)
        (folder / name).write_bytes(data)
        out[name] = data
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_push_list_read_get(backend, tmp_path):
    store = backend.store
    files = make_files(tmp_path / "src", {"model.safetensors": 300_000, "state.json": 120, "empty.bin": 0})
    put_files(store, [(tmp_path / "src" / n, f"run/ckpt/step-1/{n}", sha(d)) for n, d in files.items()])

    listing = store.list("run/ckpt/step-1/")
    assert sorted(listing) == sorted(f"run/ckpt/step-1/{n}" for n in files)
    for name, data in files.items():
        info = listing[f"run/ckpt/step-1/{name}"]
        assert info.size == len(data)
        assert info.sha256 == sha(data), info.source
        assert info.source
    # Keys only: no checksum needed, same keys and sizes.
    bare = store.list("run/ckpt/step-1/", checksums=False)
    assert {k: v.size for k, v in bare.items()} == {k: v.size for k, v in listing.items()}

    data = files["model.safetensors"]
    for a, b in [(0, 99), (1000, 70_000), (len(data) - 10, len(data) - 1), (5, 5)]:
        r = store.read_range("run/ckpt/step-1/model.safetensors", a, b)
        assert r.status == 206
        assert r.content_range == f"bytes {a}-{b}/{len(data)}"
        assert r.data == data[a : b + 1]

    store.get_file("run/ckpt/step-1/model.safetensors", tmp_path / "back" / "m.bin")
    assert (tmp_path / "back" / "m.bin").read_bytes() == data
    with pytest.raises(StoreError):
        store.get_file("run/ckpt/step-1/absent.bin", tmp_path / "back" / "x.bin")
    with pytest.raises(StoreError):
        store.read_range("run/ckpt/step-1/absent.bin", 0, 10)


def test_prefix_listing_is_exact(backend, tmp_path):
    store = backend.store
    make_files(tmp_path / "a", {"f.bin": 10})
    put_files(store, [(tmp_path / "a" / "f.bin", "run/ckpt/step-1/f.bin", sha((tmp_path / "a" / "f.bin").read_bytes())),
                      (tmp_path / "a" / "f.bin", "run/ckpt/step-10/f.bin", sha((tmp_path / "a" / "f.bin").read_bytes()))])
    assert list(store.list("run/ckpt/step-1/")) == ["run/ckpt/step-1/f.bin"]
    assert sorted(store.list("run/ckpt/", checksums=False)) == ["run/ckpt/step-1/f.bin", "run/ckpt/step-10/f.bin"]
    assert store.list("other/") == {}


def test_text_objects_and_pointer_read_back(backend):
    store = backend.store
    assert store.read_text("run/latest.json") is None
    store.write_text("run/notes.txt", "one ✓")
    assert store.read_text("run/notes.txt") == "one ✓"
    store.write_text("run/notes.txt", "two")
    assert store.read_text("run/notes.txt") == "two"
    files = {n: {"size": 1, "sha256": "0" * 64} for n in REQUIRED}
    pointer = make_pointer("run", 3, files, {"step": 3, "samples_consumed": 24}, ("ckpt/step-3",))
    write_pointer(store, pointer)
    assert json.loads(store.read_text(f"run/{POINTER}")) == pointer.to_json()


def test_a_text_object_that_is_not_utf8_is_named_not_decoded(backend, tmp_path):
    (tmp_path / "latin1").write_bytes(b'{"step": 3, "note": "caf\xe9"}')
    backend.store.put_file(tmp_path / "latin1", "run/latest.json", sha((tmp_path / "latin1").read_bytes()))
    with pytest.raises(StoreError) as err:
        backend.store.read_text("run/latest.json")
    assert str(err.value) == (f"run/latest.json in {backend.store.describe()} is not UTF-8 text "
                              "(invalid continuation byte at byte 24)")


def test_delete(backend, tmp_path):
    store = backend.store
    make_files(tmp_path / "d", {"a.bin": 50, "b.bin": 60})
    put_files(store, [(tmp_path / "d" / n, f"run/x/{n}", sha((tmp_path / "d" / n).read_bytes())) for n in ("a.bin", "b.bin")])
    store.delete("run/x/a.bin")
    store.delete("run/x/a.bin")  # absent: not an error
    assert list(store.list("run/x/", checksums=False)) == ["run/x/b.bin"]
    delete_prefix(store, "run/")
    assert store.list("run/") == {}


def test_refuses_keys_outside_the_store(backend, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    for bad in ("../escape", "run/../../x", "/abs/key"):
        with pytest.raises(StoreError):
            backend.store.put_file(tmp_path / "f", bad, sha(b"x"))


def test_describe_never_shows_credentials(backend):
    text = backend.store.describe()
    for secret in (AWS_TEST_KEY, AWS_TEST_SECRET, os.environ.get("HF_TOKEN") or "hf_never"):
        assert secret not in text
    hub_token = getattr(getattr(backend, "hub", None), "token", None)
    if hub_token:
        assert hub_token not in text


def test_cycle_and_retention(backend, tmp_path):
    """push -> verify -> pointer -> prune three times with keep_last=2: the oldest goes, the newest two stay."""
    store = backend.store
    for step in (2, 4, 6):
        folder = tmp_path / "runs" / f"step-{step}"
        make_files(folder, {"model.safetensors": 200_000, "optimizer.safetensors": 150_000, "state.json": 64},
                   seed=step)
        res = push_checkpoint(store, "run", folder, step, {"samples": step}, keep_last=2)
        assert res.verified and not folder.exists()  # pruned only after verification
        pointer = json.loads(store.read_text(f"run/{POINTER}"))
        assert pointer["step"] == step and pointer["path"] == f"ckpt/step-{step}"
        assert pointer["files"]["model.safetensors"]["size"] == 200_000
    steps = sorted({k.split("/")[2] for k in store.list("run/ckpt/", checksums=False)})
    assert steps == ["step-4", "step-6"]
    assert json.loads(store.read_text(f"run/{POINTER}"))["verified"] == ["ckpt/step-4", "ckpt/step-6"]


def test_s3_multipart_upload(make_backend, tmp_path):
    """Files past the threshold go up in parts (S3 caps a single PUT at 5 GiB); the result is the same object."""
    backend = make_backend("s3")
    store = backend.store
    store.multipart_threshold, store.part_size = 6 << 20, 5 << 20  # S3's smallest part is 5 MiB
    files = make_files(tmp_path / "big", {"optimizer.safetensors": (11 << 20) + 123})
    data = files["optimizer.safetensors"]
    store.put_file(tmp_path / "big" / "optimizer.safetensors", "run/ckpt/step-1/optimizer.safetensors", sha(data))
    assert sum(1 for s in backend.proxy.seen if s.method == "PUT" and "partNumber=" in s.path) == 3
    info = store.list("run/ckpt/step-1/")["run/ckpt/step-1/optimizer.safetensors"]
    assert (info.size, info.sha256) == (len(data), sha(data))
    assert backend.raw("run/ckpt/step-1/optimizer.safetensors") == data
