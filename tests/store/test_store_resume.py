"""`--resume auto` against every backend: no pointer is a fresh start; any other problem stops with a clear
error; a cold resume pulls into an empty folder and checks every byte."""

from __future__ import annotations

import json
import random

import pytest

from baton.checkpoint.cycle import POINTER, push_checkpoint
from baton.checkpoint.pull import pull_checkpoint, read_pointer
from baton.checkpoint.state import REQUIRED
from baton.errors import ResumeError

FILES = {"model.safetensors": 150_000, "optimizer.safetensors": 120_000, "state.json": 80}


def pushed_run(backend, tmp_path):
    folder = tmp_path / "local" / "step-3"
    folder.mkdir(parents=True)
    rnd = random.Random(3)
    originals = {}
    for name, size in FILES.items():
        originals[name] = rnd.randbytes(size) if not name.endswith(".json") else b'{"step": 3}'
        (folder / name).write_bytes(originals[name])
    push_checkpoint(backend.store, "run", folder, 3, {"samples_consumed": 24})
    return read_pointer(backend.store, "run"), originals


def test_no_pointer_is_a_fresh_start(backend):
    assert read_pointer(backend.store, "run") is None


def test_cold_resume_pulls_into_an_empty_folder(backend, tmp_path):
    pointer, originals = pushed_run(backend, tmp_path)
    dest = tmp_path / "resume" / "step-3"
    dest.mkdir(parents=True)
    (dest / "stale.bin").write_bytes(b"left over from an older session")
    pull_checkpoint(backend.store, "run", pointer, dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted(FILES)
    for name, data in originals.items():
        assert (dest / name).read_bytes() == data


MALFORMED = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"run": "run", "step": 3}', "lacks path, files, cursor"),
    ('{"run": "other", "step": 3, "path": "ckpt/step-3", "files": {}, "cursor": {}}', "belongs to run 'other'"),
    ('{"run": "run", "step": 3, "path": "ckpt/step-3", "files": {}, "cursor": {}}', "lists no files"),
    ('{"run": "run", "step": -1, "path": "ckpt/step-3", "files": {"a": {}}, "cursor": {}}', "invalid step"),
    ('{"run": "run", "step": 3, "path": "ckpt/step-3", "files": {"model.safetensors": {"size": 1, "sha256": "0"}},'
     ' "cursor": {}}', "without optimizer.safetensors"),
    *[(json.dumps({"run": "run", "step": 3, "path": "ckpt/step-3", "cursor": {},
                   "files": {n: {"size": 1, "sha256": "0" * 64} for n in REQUIRED} | change}), match) for change, match in [
        ({"model.safetensors": {"size": "1", "sha256": "0" * 64}}, "with size '1' and sha256 '0000"),
        ({"model.safetensors": {"size": -1, "sha256": "0" * 64}}, "not a byte count and a sha256 hex digest"),
        ({"state.json": {"size": 1, "sha256": 7}}, "'state.json' with size 1 and sha256 7"),
    ]],
    ('{"run": "run", "step": true, "path": "ckpt/step-1", "files": {"a": {}}, "cursor": {}}', "invalid step True"),
    ('{"run": "run", "step": 3, "path": "ckpt/step-4", "files": {"a": {}}, "cursor": {}}',
     "says step 3 but names 'ckpt/step-4'"),
    ('{"run": "run", "step": 3, "path": "ckpt/step-3", "files": {"a": {}}, "cursor": "x"}', "cursor that is not a table"),
]


def test_malformed_pointer_stops(backend):
    for text, match in MALFORMED:
        backend.store.write_text(f"run/{POINTER}", text)
        with pytest.raises(ResumeError, match=match):
            read_pointer(backend.store, "run")


def test_pointer_naming_a_missing_file_stops(backend, tmp_path):
    pointer, _ = pushed_run(backend, tmp_path)
    backend.remove("run/ckpt/step-3/optimizer.safetensors")
    with pytest.raises(ResumeError, match="names run/ckpt/step-3/optimizer.safetensors, but it could not be downloaded"):
        pull_checkpoint(backend.store, "run", pointer, tmp_path / "pull")


def test_downloaded_file_with_another_sha256_stops(backend, tmp_path):
    pointer, _ = pushed_run(backend, tmp_path)
    backend.flip("run/ckpt/step-3/model.safetensors", 77_777, service_checksum=False)
    with pytest.raises(ResumeError, match="model.safetensors downloaded with size 150000 and sha256 .* damaged"):
        pull_checkpoint(backend.store, "run", pointer, tmp_path / "pull")


def test_unreadable_pointer_stops(backend):
    backend.go_down()
    try:
        with pytest.raises(ResumeError, match="could not read the pointer run/latest.json"):
            read_pointer(backend.store, "run")
    finally:
        backend.come_back()


def test_pointer_json_round_trip(backend, tmp_path):
    pointer, _ = pushed_run(backend, tmp_path)
    assert pointer.step == 3 and pointer.path == "ckpt/step-3"
    assert pointer.cursor == {"samples_consumed": 24}
    assert set(pointer.files) == set(FILES)
    assert json.loads(backend.store.read_text(f"run/{POINTER}"))["baton_version"]
