"""On the CPU a rank's shares of the next steps are read, split and digested in one go
(baton/session/readahead.py): every step's micro-batches and digests are exactly those of reading the step
alone, whatever the world, across blocks, epochs, skipped ranges and jumps; a bad window still fails at the
step that reads it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from baton.data import reader as reader_mod
from baton.data.manifest import load_manifest
from baton.data.reader import WindowDataset, micro_batches
from baton.data.shards import HEADER_SIZE
from baton.errors import DataError
from baton.session import readahead


def alone(ds: WindowDataset, step: int, gb: int, rank: int, world: int, mb: int):
    rows = ds.rank_rows(step, gb, rank, world)
    return [(x, y) for x, y in micro_batches(rows, mb)], readahead.row_digests(rows.numpy())


def check(ahead: readahead.ShareAhead, ds: WindowDataset, ref: WindowDataset, step: int, gb, rank, world, mb):
    share = ahead.share(ds, step)
    assert share is not None
    want, digests = alone(ref, step, gb, rank, world, mb)
    got = list(readahead.micro_batches(share, mb))
    assert len(got) == len(want) and share.digests == digests
    # One rank's share is the whole global batch: its digest is known ahead; with several, after the collective.
    assert share.batch_sha == (readahead.batch_digest(digests) if world == 1 else None)
    for (x, y), (ex, ey) in zip(got, want):
        assert x.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x, ex) and torch.equal(y, ey)


@pytest.mark.parametrize(("world", "mb"), [(1, 4), (2, 2), (3, 4)])
def test_every_share_read_ahead_is_the_step_read_alone(prepared_data, monkeypatch, world, mb):
    monkeypatch.setattr(reader_mod, "ID_BLOCK", 40)  # id blocks that end inside steps and across epochs
    monkeypatch.setattr(readahead, "MAX_STEPS", 5)  # read-ahead blocks that end inside the run
    ds = WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)
    ref = WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)
    gb = 12
    for rank in range(world):
        ahead = readahead.ShareAhead(gb, rank, world, 32)
        assert ahead.steps == 5
        for step in range(0, ds.n_train // gb + 3):  # past the end of epoch 0
            check(ahead, ds, ref, step, gb, rank, world, mb)
        # A jump back (a resume, a rollback) and one forward, then skipped ranges: read again, never stale.
        for step in (3, 4, 40, 2):
            check(ahead, ds, ref, step, gb, rank, world, mb)
        for skipped in (((30, 50),), ((30, 50), (100, 101))):
            ds.set_skipped(skipped)
            ref.set_skipped(skipped)
            for step in (2, 3, 4, 5, 9):
                check(ahead, ds, ref, step, gb, rank, world, mb)


def test_a_bad_window_ahead_fails_at_the_step_that_reads_it(prepared_data, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(prepared_data, copy)
    good = WindowDataset(copy, 32, 7, 16)
    gb = 4
    bad_step = 6
    window = int(good.train_window_ids(bad_step * gb, gb)[1])  # read by step 6 only
    m = load_manifest(copy)
    # The window's 6th token, in whichever shard holds it.
    pos = window * 32 + 5
    k = int(np.searchsorted(good.stream.offsets, pos, side="right") - 1)
    local = pos - int(good.stream.offsets[k])
    victim = copy / m["shards"][k]["file"]
    raw = bytearray(victim.read_bytes())
    raw[HEADER_SIZE + 2 * local : HEADER_SIZE + 2 * local + 2] = (60000).to_bytes(2, "little")
    victim.write_bytes(bytes(raw))
    ds = WindowDataset(copy, 32, 7, 16)
    ahead = readahead.ShareAhead(gb, 0, 1, 32)
    assert ahead.steps > bad_step
    for step in range(bad_step):  # the steps before it train; their block held the bad window
        share = ahead.share(ds, step)
        assert share is None
        ds.rank_rows(step, gb, 0, 1)
    with pytest.raises(DataError, match=rf"^window {window} of {copy} holds token id 60000"):
        ds.rank_rows(bad_step, gb, 0, 1)
    # The block is not tried again for each step up to the bad window (a read of up to 4 MiB every step): its
    # steps are read one by one, and past its end blocks are read again.
    calls = []
    rows_ahead = ds.rank_rows_ahead
    ds.rank_rows_ahead = lambda *a: calls.append(a) or rows_ahead(*a)
    assert ahead.share(ds, bad_step + 1) is None and calls == []
    assert ahead.share(ds, ahead.steps) is not None and len(calls) == 1
