"""The reader's guarantees on the prepared corpus (acceptance of the foundation issue)."""

import shutil

import numpy as np
import pytest
import torch

from baton.data.manifest import load_manifest
from baton.data.reader import WindowDataset, prefix_collisions
from baton.data.shards import HEADER_SIZE
from baton.data.verify import verify_data
from baton.errors import DataError


@pytest.fixture
def ds(prepared_data):
    return WindowDataset(prepared_data, seq_len=32, shuffle_seed=7, val_windows=16)


def test_resume_at_sample_n_reads_what_an_uninterrupted_pass_reads(ds):
    n, batch = 40, 8
    uninterrupted = [ds.train_batch(s, batch) for s in range(0, n + 3 * batch, batch)]
    x_all = torch.cat([x for x, _ in uninterrupted])
    resumed = torch.cat([ds.train_batch(s, batch)[0] for s in range(n, n + 3 * batch, batch)])
    assert torch.equal(resumed, x_all[n : n + 3 * batch])
    # A fresh reader (a new process after a wipe) agrees too: the order is a function of the seed only.
    again = WindowDataset(ds.data_dir, 32, 7, 16)
    assert torch.equal(again.train_batch(n, 3 * batch)[0], resumed)


def test_labels_are_next_token(ds):
    x, y = ds.train_batch(5, 4)
    assert torch.equal(x[:, 1:], y[:, :-1])
    ids = ds.train_window_ids(5, 4)
    for row, i in zip(y, ids):
        expected = ds.stream.read(int(i) * 32 + 1, 32).astype(np.int64)
        assert torch.equal(row, torch.from_numpy(expected))


def test_same_seed_same_order_other_seed_other_order(prepared_data, ds):
    same = WindowDataset(prepared_data, 32, 7, 16)
    other = WindowDataset(prepared_data, 32, 8, 16)
    a = ds.train_window_ids(0, 200)
    assert np.array_equal(a, same.train_window_ids(0, 200))
    assert not np.array_equal(a, other.train_window_ids(0, 200))
    assert sorted(a) != list(a)  # actually shuffled
    assert ds.permutation_fingerprint == same.permutation_fingerprint != other.permutation_fingerprint


def test_every_training_window_once_per_epoch_and_never_a_validation_window(ds):
    ids = ds.train_window_ids(0, ds.n_train)
    assert sorted(ids.tolist()) == list(range(ds.n_train))
    assert set(ids.tolist()).isdisjoint(ds.val_window_ids().tolist())


def test_no_validation_prefix_collides_with_training(ds):
    assert prefix_collisions(ds, k=64) == 0


def test_manifest_verification_passes_then_names_a_flipped_shard(prepared_data, tmp_path):
    assert verify_data(str(prepared_data)).ok
    copy = tmp_path / "copy"
    shutil.copytree(prepared_data, copy)
    m = load_manifest(copy)
    assert m["n_shards"] >= 2, "the test corpus should span several shards"
    victim = copy / m["shards"][1]["file"]
    raw = bytearray(victim.read_bytes())
    raw[HEADER_SIZE + 10] ^= 0x01
    victim.write_bytes(bytes(raw))
    report = verify_data(str(copy))
    assert not report.ok
    assert len(report.problems) == 1 and report.problems[0].startswith(m["shards"][1]["file"])


def test_shards_use_uint16_for_small_vocabularies(prepared_data):
    m = load_manifest(prepared_data)
    assert m["dtype"] == "uint16" and m["tokenizer"]["vocab_size"] <= 65536


def test_windows_span_shard_boundaries(prepared_data, ds):
    m = load_manifest(prepared_data)
    boundary = m["shards"][0]["tokens"]
    i = boundary // 32  # the window containing the first shard boundary
    row = ds.stream.read(i * 32, 33)
    whole = np.concatenate([ds.stream.shards[0][i * 32 :], ds.stream.shards[1][: 33 - (boundary - i * 32)]])
    assert np.array_equal(row, whole)


def test_a_token_outside_the_vocabulary_is_a_data_error_not_an_index_error(prepared_data, tmp_path):
    """Shards that match their manifest but hold a token id the tokenizer (and so the model) does not have."""
    copy = tmp_path / "copy"
    shutil.copytree(prepared_data, copy)
    m = load_manifest(copy)
    victim = copy / m["shards"][0]["file"]
    raw = bytearray(victim.read_bytes())
    raw[HEADER_SIZE + 2 * 40 : HEADER_SIZE + 2 * 41] = (60000).to_bytes(2, "little")  # token 40: window 1
    victim.write_bytes(bytes(raw))
    ds = WindowDataset(copy, 32, 7, 16)
    assert ds.rows(np.array([0])).shape == (1, 33)  # windows without it read as before
    with pytest.raises(DataError, match=rf"^window 1 of {copy} holds token id 60000, outside the tokenizer's "
                                        rf"{m['tokenizer']['vocab_size']} tokens: .*rerun `baton prepare`"):
        ds.rows(np.array([0, 1]))
