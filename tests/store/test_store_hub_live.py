"""The real Hugging Face Hub, only when asked: HF_TOKEN (write access) and BATON_HUB_TEST_REPO (an existing
scratch model repository, e.g. ``you/baton-scratch``) in the environment. Skipped otherwise.

It runs the whole cycle (one commit per checkpoint, verification against the Hub's listing and ranged reads
through its CDN, pointer, retention), a cold pull, then removes what it wrote. Uploads take the client's
default path (Xet when ``hf_xet`` is installed) unless BATON_HUB_TEST_NO_XET=1.
"""

from __future__ import annotations

import json
import os
import random
import uuid

import pytest

from baton.checkpoint.cycle import POINTER, push_checkpoint
from baton.checkpoint.pull import pull_checkpoint, read_pointer
from baton.store import delete_prefix

REPO = os.environ.get("BATON_HUB_TEST_REPO")
TOKEN = os.environ.get("HF_TOKEN")

pytestmark = pytest.mark.skipif(not (REPO and TOKEN), reason="set HF_TOKEN and BATON_HUB_TEST_REPO to run against "
                                                             "the real Hub")


def test_live_hub_cycle(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from baton.store.hub import HubStore

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", os.environ.get("BATON_HUB_TEST_NO_XET") == "1")
    store = HubStore.from_url(f"hf://{REPO}", token=TOKEN)
    run = f"baton-live-{uuid.uuid4().hex[:8]}"
    rnd = random.Random(0)
    try:
        for step in (1, 2):
            folder = tmp_path / f"step-{step}"
            folder.mkdir()
            (folder / "model.safetensors").write_bytes(rnd.randbytes(300_000))
            (folder / "optimizer.safetensors").write_bytes(rnd.randbytes(200_000))
            (folder / "state.json").write_text(json.dumps({"step": step}))
            res = push_checkpoint(store, run, folder, step, {"samples_consumed": step}, keep_last=1)
            assert res.verified and not folder.exists()
        pointer = read_pointer(store, run)
        assert pointer is not None and pointer.step == 2
        assert {k.split("/")[2] for k in store.list(f"{run}/ckpt/", checksums=False)} == {"step-2"}
        pulled = pull_checkpoint(store, run, pointer, tmp_path / "pulled")
        assert sorted(p.name for p in pulled.iterdir()) == ["model.safetensors", "optimizer.safetensors", "state.json"]
        assert TOKEN not in store.describe()
    finally:
        delete_prefix(store, f"{run}/")
    assert store.read_text(f"{run}/{POINTER}") is None
