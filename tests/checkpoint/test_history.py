"""The decisions the relay makes over a store's contents, on hand-built stores: which checkpoints are verified
(checkpoint.history) and which ones retention deletes (checkpoint.cycle.apply_retention)."""

from __future__ import annotations

import json

import pytest

from baton.checkpoint.cycle import apply_retention
from baton.checkpoint.history import locate, newest_validation, read_history
from baton.checkpoint.names import REQUIRED, ckpt_path
from baton.checkpoint.pointer import make_pointer, write_pointer
from baton.errors import BatonError, ResumeError
from baton.planning import ledger as L
from baton.store.local import LocalStore

SHA = "0" * 64


def _store(tmp_path, steps: dict[int, tuple[str, ...]], pointer_step: int | None, verified: tuple[int, ...] = (),
           booked: tuple[int, ...] = ()) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    for step, names in steps.items():
        for n in names:
            store.write_text(f"r/{ckpt_path(step)}/{n}", "x")
    if pointer_step is not None:
        files = {n: {"size": 1, "sha256": SHA} for n in REQUIRED}
        cursor = {"step": pointer_step, "samples_consumed": 8 * pointer_step, "dataset_fingerprint": "d",
                  "permutation_fingerprint": "p"}
        write_pointer(store, make_pointer("r", pointer_step, files, cursor,
                                          tuple(ckpt_path(s) for s in verified) or (ckpt_path(pointer_step),)))
    if booked:
        led = L.SessionLedger(store, "r", 1.0e9, "cpu", 1, 1.0, tokens_per_step=8)
        for s in booked:
            led.checkpoint(s, 1.0, True, 0.0)
        led.checkpoint(99, 1.0, False, 0.0)  # a failed verification books nothing
    return store


def test_verified_is_named_by_the_pointer_or_the_ledger_and_whole_in_the_store(tmp_path):
    whole = REQUIRED
    store = _store(tmp_path, {2: whole, 4: whole, 6: whole, 8: REQUIRED[:2], 10: whole, 99: whole},
                   pointer_step=6, verified=(4, 6), booked=(2,))
    h = read_history(store, "r")
    # 2: booked by a session (retention could not delete it); 4, 6: the pointer's list; 8: a file missing;
    # 10: above the pointer, never named; 99: its verification failed.
    assert h.verified_steps() == [2, 4, 6]
    assert [(c.step, c.booked, c.whole, c.pointer) for c in h.checkpoints] == [
        (2, True, True, False), (4, True, True, False), (6, True, True, True), (8, False, False, False),
        (10, False, True, False), (99, False, True, False)]
    assert locate(store, "r", 4).step == 4 and locate(store, "r").step == 6
    with pytest.raises(BatonError, match=r"step 10 is not a verified checkpoint of run 'r' .*verified there: 2, 4, 6"):
        locate(store, "r", 10)


def test_a_store_without_a_pointer_has_no_checkpoint_to_name(tmp_path):
    store = _store(tmp_path, {2: REQUIRED}, pointer_step=None, booked=(2,))
    with pytest.raises(BatonError, match="holds no checkpoint for run 'r' \\(train first\\)"):
        locate(store, "r", 2)
    store.write_text("r/latest.json", "{broken")
    with pytest.raises(ResumeError, match="is not valid JSON"):
        read_history(store, "r")
    assert "is not valid JSON" in (read_history(store, "r", strict=False).pointer_problem or "")


@pytest.mark.parametrize("keep_last, verified, removed", [
    (2, (4, 6), [2]),  # the newest two verified stay; an older one goes
    (1, (4, 6), [2, 4]),
    (2, (6,), [2, 4]),  # only the pointer's own is known verified: the others up to it go
    (3, (2, 4, 6), []),
])
def test_retention_keeps_the_newest_verified_and_never_a_folder_above_the_pointer(tmp_path, keep_last, verified,
                                                                                  removed):
    store = _store(tmp_path, {s: REQUIRED for s in (2, 4, 6, 8)}, pointer_step=6, verified=verified)
    assert apply_retention(store, "r", keep_last, ckpt_path(6), tuple(ckpt_path(s) for s in verified)) == \
        [ckpt_path(s) for s in removed]
    left = sorted({int(k.split("/")[2][5:]) for k in store.list("r/ckpt/")})
    assert left == [s for s in (2, 4, 6, 8) if s not in removed]  # 8 is above the pointer: an upload elsewhere


def test_without_a_known_history_retention_goes_by_step_order(tmp_path):
    store = _store(tmp_path, {s: REQUIRED for s in (2, 4, 6)}, pointer_step=6)
    assert apply_retention(store, "r", 2, ckpt_path(6), None) == [ckpt_path(2)]


def test_the_newest_validation_is_the_horizon_s_else_the_newest_row(tmp_path):
    rows = [{"step": 4, "val_loss": 3.0, "val_ppl": 20.0, "val_windows": 16}, {"step": 5, "loss": 2.9},
            {"step": 8, "val_loss": 2.5, "val_ppl": 12.2, "val_windows": 16}, {"step": 9, "loss": 2.4}]
    assert newest_validation(rows) == {"val_loss": 2.5, "val_ppl": 12.2, "val_windows": 16, "val_step": 8}
    assert newest_validation([{"step": 1, "loss": 3.0}]) is None
    store = _store(tmp_path, {9: REQUIRED}, pointer_step=9)
    p = read_history(store, "r").pointer
    assert p is not None
    done = p.completed({"model.safetensors": {"size": 1, "sha256": SHA}}, {"val_loss": 2.0, "val_ppl": 7.4,
                                                                           "val_windows": 16})
    assert newest_validation(rows, done) == {"val_loss": 2.0, "val_ppl": 7.4, "val_windows": 16, "val_step": 9}
    assert json.loads(json.dumps(done.to_json()))["complete"] is True
