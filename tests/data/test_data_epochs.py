"""Past one pass, each epoch reads every training window once in a new order, and a session resumed at an
epoch boundary or inside a later epoch (a new process, from the saved cursor) reads exactly what an
uninterrupted run reads."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np

from baton.data.reader import WindowDataset, micro_batches

SEQ, GB, MB, WORLD = 32, 64, 16, 2

RESUMED = f"""
import hashlib, json, sys
from baton.data.reader import Cursor, WindowDataset, micro_batches
results = []
for folder, val, saved, steps in json.loads(sys.stdin.read()):
    cursor = Cursor.from_dict(saved)
    ds = WindowDataset(folder, cursor.seq_len, cursor.shuffle_seed, val)
    ds.check_cursor(cursor)
    out = []
    for step in range(cursor.step, cursor.step + steps):
        h = hashlib.sha256()
        for rank in range({WORLD}):
            for x, y in micro_batches(ds.rank_rows(step, {GB}, rank, {WORLD}), {MB}):
                h.update(x.numpy().tobytes()); h.update(y.numpy().tobytes())
        out.append(h.hexdigest())
    results.append(out)
print(json.dumps(results))
"""


def _digests(ds: WindowDataset, first: int, count: int) -> list[str]:
    out = []
    for step in range(first, first + count):
        h = hashlib.sha256()
        for rank in range(WORLD):
            for x, y in micro_batches(ds.rank_rows(step, GB, rank, WORLD), MB):
                h.update(x.numpy().tobytes())
                h.update(y.numpy().tobytes())
        out.append(h.hexdigest())
    return out


def test_resume_at_and_after_epoch_boundaries_reads_what_an_uninterrupted_run_reads(prepared_data):
    n_windows = WindowDataset(prepared_data, SEQ, 7, 0).n_windows
    jobs, expected = [], []
    # One geometry where the epoch ends exactly at a step, one where it ends inside a step.
    for val, aligned in ((n_windows % GB + GB, True), (16, False)):
        ds = WindowDataset(prepared_data, SEQ, 7, val)
        assert (ds.n_train % GB == 0) == aligned
        boundary = ds.n_train // GB  # the first step that reads the second epoch
        total = 2 * boundary + 6
        uninterrupted = _digests(ds, 0, total)
        for step in (boundary, boundary + 1, boundary + 5, 2 * boundary, 2 * boundary + 1):
            saved = json.loads(json.dumps(ds.cursor(step * GB, step).to_dict()))  # as a checkpoint keeps it
            count = min(4, total - step)
            jobs.append([str(prepared_data), val, saved, count])
            expected.append(uninterrupted[step : step + count])
    # Every resume happens in a new process, from nothing but the saved cursor.
    out = subprocess.run([sys.executable, "-c", RESUMED], input=json.dumps(jobs), capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out)
    for job, g, e in zip(jobs, got, expected):
        assert g == e, f"resumed at step {job[2]['step']} (val_windows {job[1]}) reads other windows"


def test_each_epoch_is_a_new_permutation_of_all_training_windows(prepared_data):
    ds = WindowDataset(prepared_data, SEQ, 7, 16)
    n = ds.n_train
    ids = ds.train_window_ids(0, 3 * n)
    epochs = [ids[e * n : (e + 1) * n] for e in range(3)]
    for e in epochs:
        assert np.array_equal(np.sort(e), np.arange(n))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    # Slicing across the boundary matches the whole: no state but the sample counter.
    assert np.array_equal(ds.train_window_ids(n - 5, 10), ids[n - 5 : n + 5])
