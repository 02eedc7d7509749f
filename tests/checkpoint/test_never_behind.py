"""A verified checkpoint is never lost to a session that starts from the wrong place: a pointer whose checkpoint
is gone prunes nothing, and a folder older than the store's pointer (--resume PATH) neither rolls the pointer back
nor writes over verified checkpoints, unless the pointer's own checkpoint is damaged, where going on from an older
one is the recovery."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

CADENCE = ["--set", "train.ckpt_every=5", "--set", "store.keep_last=2", "--no-progress"]


def _digests(store: Path) -> dict[str, str]:
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file() and "ledger" not in p.parts and p.name != "lease"}


def _pointer(store: Path) -> dict:
    return json.loads((store / "test" / "latest.json").read_text())


def test_a_pointer_whose_checkpoint_is_gone_prunes_nothing(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store = tmp_path / "store"
    assert baton_cli("train", "-c", cfg, *CADENCE, "--stop-after-steps", "15").returncode == 0
    assert _pointer(store)["step"] == 15 and sorted(p.name for p in (store / "test" / "ckpt").iterdir()) == \
        ["step-10", "step-15"]
    shutil.rmtree(store / "test" / "ckpt" / "step-15")  # deleted outside baton
    r = baton_cli("train", "-c", cfg, *CADENCE, "--set", "store.keep_last=1")
    assert r.returncode == 2 and "holds nothing under it" in r.stderr and "ckpt/step-10" in r.stderr, r.stderr
    assert "removed" not in r.stderr
    assert (store / "test" / "ckpt" / "step-10" / "model.safetensors").is_file()  # what the error tells one to use


def test_an_older_folder_never_rolls_the_pointer_back_unless_the_pointers_checkpoint_is_damaged(make_config,
                                                                                               baton_cli, tmp_path):
    cfg = str(make_config())
    store = tmp_path / "store"
    assert baton_cli("train", "-c", cfg, *CADENCE, "--stop-after-steps", "15").returncode == 0
    older = tmp_path / "step-10"
    shutil.copytree(store / "test" / "ckpt" / "step-10", older)
    before = _digests(store)
    r = baton_cli("train", "-c", cfg, *CADENCE, "--resume", str(older), "--stop-after-steps", "15")
    assert r.returncode == 2, r.stderr
    assert ("step 10 of run 'test' is older than step 15, which the pointer in local store "
            f"{store} names and the store holds intact: going on from it would roll the pointer back") in r.stderr
    assert _digests(store) == before  # nothing written, nothing deleted

    # The pointer's checkpoint damaged (same size, other bytes): the older folder is the way back, and is taken.
    model = store / "test" / "ckpt" / "step-15" / "model.safetensors"
    raw = bytearray(model.read_bytes())
    raw[-3] ^= 0xFF
    model.write_bytes(bytes(raw))
    r = baton_cli("train", "-c", cfg, *CADENCE, "--resume", str(older), "--stop-after-steps", "15")
    assert r.returncode == 0, r.stderr
    assert "the pointer's checkpoint test/ckpt/step-15 is damaged" in r.stderr
    pointer = _pointer(store)
    assert pointer["step"] == 15
    assert pointer["files"]["model.safetensors"]["sha256"] == before["test/ckpt/step-15/model.safetensors"]
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before["test/ckpt/step-15/model.safetensors"]
    assert baton_cli("train", "-c", cfg, *CADENCE).returncode == 0  # and the run goes on from the store
    assert _pointer(store)["complete"]
