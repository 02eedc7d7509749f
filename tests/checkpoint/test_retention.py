"""Retention's selection on a real local store: which checkpoint folders a finished push or a later session
removes, decided from the listing, the pointer's history and ``keep_last``."""

from __future__ import annotations

import pytest

from baton.checkpoint.cycle import apply_retention
from baton.checkpoint.names import ckpt_path
from baton.store.local import LocalStore


def _store(tmp_path, steps: list[int]) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    for s in steps:
        for name in ("model.safetensors", "state.json"):
            store.write_text(f"run/{ckpt_path(s)}/{name}", f"{s}")
    return store


def _left(store: LocalStore) -> list[int]:
    return sorted({int(k.split("/")[2].split("-")[1]) for k in store.list("run/ckpt/", checksums=False)})


@pytest.mark.parametrize(("steps", "keep", "current", "verified", "removed", "left"), [
    # The newest keep_last verified folders stay, the older verified ones go.
    ([10, 20, 30, 40], 2, 40, (10, 20, 30, 40), [10, 20], [30, 40]),
    # A folder at or below the current step that no pointer ever named (a cut-short upload) goes too.
    ([10, 15, 20, 30], 2, 30, (10, 20, 30), [10, 15], [20, 30]),
    # A folder above the current step is another session's upload in progress: left alone.
    ([10, 20, 30, 50], 1, 30, (10, 20, 30), [10, 20], [30, 50]),
    # keep_last beyond the history keeps all of it.
    ([10, 20], 5, 20, (10, 20), [], [10, 20]),
    # Without a history (an unreadable previous pointer), the newest keep_last folders by step stay.
    ([10, 20, 30, 40], 2, 40, None, [10, 20], [30, 40]),
    # The current checkpoint always stays, even when the history does not end with it.
    ([10, 20, 30], 1, 30, (10, 20), [10], [20, 30]),
    # A pointer naming a checkpoint the store does not hold: the older verified ones are all there is; none goes.
    ([10, 15], 1, 20, (10, 15, 20), [], [10, 15]),
    ([10, 15, 30], 1, 25, (10, 15, 25), [], [10, 15, 30]),
])
def test_retention_keeps_the_newest_verified_and_removes_the_rest(tmp_path, steps, keep, current, verified,
                                                                   removed, left):
    store = _store(tmp_path, steps)
    history = None if verified is None else tuple(ckpt_path(s) for s in verified)
    assert apply_retention(store, "run", keep, current=ckpt_path(current), verified=history) == \
        [ckpt_path(s) for s in removed]
    assert _left(store) == left


def test_retention_is_idempotent_and_reads_only_its_own_run(tmp_path):
    store = _store(tmp_path, [10, 20, 30])
    store.write_text("other/ckpt/step-10/state.json", "{}")
    history = tuple(ckpt_path(s) for s in (10, 20, 30))
    assert apply_retention(store, "run", 1, current=ckpt_path(30), verified=history) == [ckpt_path(10), ckpt_path(20)]
    assert apply_retention(store, "run", 1, current=ckpt_path(30), verified=history) == []
    assert store.read_text("other/ckpt/step-10/state.json") == "{}"


def test_a_pruned_folder_takes_what_a_killed_upload_left_beside_its_files(tmp_path):
    """A writer SIGKILLed mid-copy leaves its .partial file (its cleanup never ran); the local store's listing hides
    it, and the folder's deletion takes it too instead of leaving a model's worth of bytes behind for good."""
    store = _store(tmp_path, [10, 20, 30])
    folder = tmp_path / "store" / "run" / "ckpt" / "step-10"
    (folder / "model.safetensors.4243-abcdef.partial").write_bytes(b"\0" * 4096)
    (folder / "optimizer.safetensors.4244-fedcba.partial").write_bytes(b"\0" * 4096)  # of a key never written
    assert apply_retention(store, "run", 1, current=ckpt_path(30), verified=tuple(ckpt_path(s) for s in (10, 20, 30)))
    assert not folder.exists()
    assert _left(store) == [30]
