"""The run's lease on every store, against the real servers (a folder, moto's S3 server, the local Hub): its
conditional writes, a race for it, expiry by the store's clock (or by watching), takeover, fencing of the
pointer, and a write whose answer was lost."""

from __future__ import annotations

import json
import threading
import time

import pytest

from baton.errors import Fenced, LeaseHeld, StoreError, WriteConflict
from baton.hashing import sha256_file
from baton.store import put_files
from baton.store.hub import HubStore
from baton.store.lease import FencedStore, Lease, LeaseRecord, read_lease
from baton.store.local import LocalStore
from baton.store.s3 import S3Store
from support.store_backends import FAST_RETRY

POINTER = "r/latest.json"
TTL = 2.0  # the shortest lifetime store.lease_seconds allows


def another_client(backend):
    """A second, independent client of the same store: what a second session on another machine holds."""
    if backend.kind == "local":
        return LocalStore(backend.link, FAST_RETRY)
    if backend.kind == "s3":
        return S3Store.from_url(backend.url, FAST_RETRY)
    return HubStore.from_url(f"hf://{backend.repo}", FAST_RETRY, endpoint=backend.proxy.url, token=backend.hub.token)


def test_conditional_writes_refuse_a_stale_version_and_a_second_create(backend):
    store = backend.store
    assert store.read_versioned("r/x") is None
    v1 = store.write_if("r/x", "one", None)
    with pytest.raises(WriteConflict):
        another_client(backend).write_if("r/x", "other", None)
    got = store.read_versioned("r/x")
    assert got.text == "one"
    v2 = store.write_if("r/x", "two", got.version)
    with pytest.raises(WriteConflict):
        another_client(backend).write_if("r/x", "three", v1)  # the version it saw is gone
    assert store.read_text("r/x") == "two"
    assert store.read_versioned("r/x").version == v2 or backend.kind == "hub"  # the Hub's is the branch head


def test_a_write_whose_answer_was_lost_is_found_done_on_retry(backend):
    """The write lands, then the connection drops before the answer (the crash between a write and its
    read-back): the retry finds its own bytes there, which is success, not a conflict."""
    if backend.kind == "local":
        pytest.skip("a folder has no answer to lose; its compare-and-rename is under a lock")
    store = backend.store
    def lose_one():
        return backend.fault("lose_answer", match=lambda m, p: m in ("PUT", "POST") and ("r/x" in p or "/commit/" in p),
                             times=1)

    lost = lose_one()
    store.write_if("r/x", "one", None)
    assert lost.hits == 1 and store.read_text("r/x") == "one"
    v = store.read_versioned("r/x").version
    lost = lose_one()
    store.write_if("r/x", "two", v)
    assert lost.hits == 1 and store.read_text("r/x") == "two"


def test_of_sessions_racing_for_a_run_exactly_one_wins(backend):
    """Four contenders at once, each with its own client: one holds the run, the others are refused with the
    holder named (on the Hub, after watching it renew)."""
    contenders = [Lease(another_client(backend), "r", f"s{i}", TTL) for i in range(4)]
    won, refused, go = [], [], threading.Barrier(4)

    def contend(lease: Lease) -> None:
        go.wait()
        try:
            lease.acquire()
            lease.start()
            won.append(lease)
        except LeaseHeld as e:
            refused.append(str(e))

    threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert len(won) == 1, (won, refused)
        assert len(refused) == 3
        holder = won[0]
        assert all(f"run 'r' is being trained by session {holder.session} on host " in r for r in refused)
        assert all("`baton train --take-over`" in r for r in refused)
        rec, _ = read_lease(backend.store, "r")
        assert (rec.session, rec.epoch) == (holder.session, 1)
    finally:
        for lease in won:
            lease.release()


def test_an_expired_lease_is_taken_over_and_its_holder_fenced_from_the_pointer(backend):
    """A holds the run and rolls the pointer, then stops renewing (paused, killed). After its lifetime B takes the
    lease without asking, seals the pointer; A's renewal and A's pointer write are refused and A is fenced."""
    a = Lease(backend.store, "r", "A", TTL)
    a.acquire()
    a.seal(POINTER)
    a_store = FencedStore(backend.store, a)
    a_store.roll(POINTER, json.dumps({"step": 5}))
    b = Lease(another_client(backend), "r", "B", TTL)
    if backend.kind != "hub":
        with pytest.raises(LeaseHeld):
            b.acquire()  # younger than its lifetime by the store's clock
        time.sleep(TTL + 1.1)  # S3 stamps to the second
    b.acquire()  # A never renewed: expired (by the store's clock; on the Hub, watched for a lifetime)
    assert b.took_over == {"session": "A", "host": a.record.host, "epoch": 1, "why": "expired"}
    assert b.epoch == 2
    b.seal(POINTER)
    assert json.loads(backend.store.read_text(POINTER)) == {"step": 5, "epoch": 2}
    with pytest.raises(Fenced, match="lapsed|taken over"):
        a_store.roll(POINTER, json.dumps({"step": 10}))
    assert json.loads(backend.store.read_text(POINTER)) == {"step": 5, "epoch": 2}
    assert a.renew() is False and a.lost
    FencedStore(another_client(backend), b).roll(POINTER, json.dumps({"step": 10, "epoch": 2}))
    b.release()


def test_take_over_fences_a_live_holder_whose_next_write_is_refused(backend):
    """--take-over of a lease renewed a moment ago: the old holder's clock says its lease is fine, but its
    pointer write is conditional on a version the new holder has replaced: refused, and the holder is fenced."""
    a = Lease(backend.store, "r", "A", 60.0)
    a.acquire()
    a.seal(POINTER)
    a_store = FencedStore(backend.store, a)
    a_store.roll(POINTER, json.dumps({"step": 5}))
    b = Lease(another_client(backend), "r", "B", 60.0)
    with pytest.raises(LeaseHeld, match=r"expires in \d+ s unless renewed|expires 60 s after its last renewal"):
        Lease(another_client(backend), "r", "C", 60.0, sleep=lambda s: a.renew() and None).acquire()
    b.acquire(take_over=True)
    b.seal(POINTER)
    assert b.took_over["why"] == "--take-over" and b.epoch == 2
    assert a.lost is None  # nothing has told A yet
    with pytest.raises(Fenced, match=r"taken over by session B on host .* \(epoch 2\)"):
        a_store.roll(POINTER, json.dumps({"step": 10}))
    assert json.loads(backend.store.read_text(POINTER)) == {"step": 5, "epoch": 2}
    with pytest.raises(Fenced):
        a_store.write_text("r/ledger/x.json", "{}")  # every later write is refused without a request
    assert backend.store.read_text("r/ledger/x.json") is None
    with pytest.raises(Fenced):
        a.verify()
    a.release()  # a fenced session leaves the lease alone
    assert read_lease(backend.store, "r")[0].session == "B"
    b.release()
    rec = read_lease(backend.store, "r")[0]
    assert rec.released and rec.epoch == 2
    c = Lease(another_client(backend), "r", "C", 60.0)
    c.acquire()  # a released lease is taken at once, no takeover
    assert c.epoch == 3 and c.took_over is None
    c.release()


def test_a_holder_that_cannot_renew_within_its_lifetime_fences_itself(tmp_path):
    """Paused (SIGSTOP, a suspended VM) or cut off from the store for a lifetime: another session may hold the run
    by now, so the holder counts itself fenced before its next write, without asking the store."""
    now = [0.0]
    lease = Lease(LocalStore(tmp_path), "r", "A", 30.0, clock=lambda: now[0])
    lease.acquire()
    now[0] = 29.0
    lease.check()
    now[0] = 30.5
    with pytest.raises(Fenced, match=r"lapsed: no renewal reached the store for 30 s"):
        lease.check()
    assert lease.renew() is False


@pytest.mark.parametrize("edit", ["{not json", {"pid": float("inf")}, {"pid": "12"}, {"renewals": float("inf")},
                                  {"ttl_s": float("nan")}, {"ttl_s": float("inf")}, {"ttl_s": 1e308}, {"ttl_s": 0}])
def test_a_damaged_lease_is_reported_with_the_fix(tmp_path, edit):
    store = LocalStore(tmp_path)
    if isinstance(edit, str):
        store.write_text("r/lease", edit)
    else:  # a lease as a session wrote it, one value edited by hand (json writes NaN and Infinity as such)
        Lease(store, "r", "A", 30.0).acquire()
        record = json.loads(store.read_text("r/lease"))
        store.write_text("r/lease", json.dumps({**record, **edit}))
    with pytest.raises(StoreError, match=r"the lease r/lease is damaged .*delete it once no session of the run is "
                                         "running"):
        Lease(store, "r", "B", 30.0).acquire()
    with pytest.raises(StoreError, match=r"the lease r/lease is damaged"):
        LeaseRecord.from_text(store.read_text("r/lease"), "r/lease")


def test_on_the_hub_every_commit_names_its_parent_and_a_fenced_sessions_commit_is_refused(make_backend, tmp_path):
    """The Hub has no create-only upload: there every commit of a session holding the lease names the commit it
    made last. Alone, its checkpoint, pointer and renewal commits chain without a single refusal; once another
    session takes the run over, its next checkpoint commit is refused (412), it learns it is fenced, and the
    new holder's files are untouched."""
    backend = make_backend("hub")
    a = Lease(backend.store, "r", "A", 60.0)
    a.acquire()
    backend.store.fence(a.on_moved)
    a.seal(POINTER)
    a_store = FencedStore(backend.store, a)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 4096)
    put_files(a_store, [(weights, "r/ckpt/step-5/model.safetensors", sha256_file(weights))])
    a_store.roll(POINTER, json.dumps({"step": 5}))
    assert a.renew()
    put_files(a_store, [(weights, "r/ckpt/step-10/model.safetensors", sha256_file(weights))])
    a_store.roll(POINTER, json.dumps({"step": 10}))
    assert not [s for s in backend.proxy.seen if s.status == 412]
    b_client = another_client(backend)
    b = Lease(b_client, "r", "B", 60.0)
    b.acquire(take_over=True)
    b_client.fence(b.on_moved)
    b.seal(POINTER)
    theirs = tmp_path / "theirs.safetensors"
    theirs.write_bytes(b"\1" * 4096)
    put_files(FencedStore(b_client, b), [(theirs, "r/ckpt/step-15/model.safetensors", sha256_file(theirs))])
    with pytest.raises(Fenced, match="taken over by session B"):
        put_files(a_store, [(weights, "r/ckpt/step-15/model.safetensors", sha256_file(weights))])
    assert backend.raw("r/ckpt/step-15/model.safetensors") == b"\1" * 4096
    assert json.loads(backend.raw(POINTER)) == {"step": 10, "epoch": 2}
    b.release()


def test_reading_the_stores_clock_leaves_a_writers_lock_held(tmp_path):
    """A holder's push thread reads the lease (its verify) while its renewal thread is inside the folder's
    compare-and-rename: closing any descriptor of the locked file would drop the process's fcntl lock, and a
    second machine's conditional write could then win on the same version as the renewal."""
    import subprocess
    import sys

    import baton.store.local as local

    store = LocalStore(tmp_path)
    store.write_text("r/lease", "v0")
    v0 = store.read_versioned("r/lease").version
    inside, go = threading.Event(), threading.Event()
    real = local._write_atomically

    def held(dst, fill, *rest):
        inside.set()
        assert go.wait(60)
        return real(dst, fill, *rest)

    local._write_atomically = held
    try:
        writer = threading.Thread(target=lambda: store.write_if("r/lease", "renewed", v0))
        writer.start()
        assert inside.wait(60)
        assert store.read_versioned("r/lease").text == "v0"  # the other thread's read, mid-write
        probe = ("import fcntl, sys\nwith open(sys.argv[1], 'a+b') as f:\n    try:\n"
                 "        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except OSError:\n"
                 "        print('held')\n    else:\n        print('free')\n")
        got = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "r" / ("lease" + local.LOCK_SUFFIX))],
                             capture_output=True, text=True, timeout=120)
        assert got.stdout.strip() == "held", got.stderr
    finally:
        go.set()
        writer.join(60)
        local._write_atomically = real
    assert store.read_text("r/lease") == "renewed"
    assert list(store.list("r/")) == ["r/lease"]  # neither the lock nor the clock file is listed


def test_a_lease_stamped_in_the_future_is_watched_not_held_for_the_skew(tmp_path):
    """A stamp ahead of the store's clock (the file server's clock stepped back, a store copied with its
    timestamps) tells no age: the contender watches the lease for one lifetime, as where a store has no
    clock, and takes it when no renewal comes, instead of refusing for as long as the skew lasts."""
    import os

    store = LocalStore(tmp_path)
    Lease(store, "r", "A", 30.0).acquire()  # A is alive (this process) and never renews
    future = time.time() + 7200
    os.utime(tmp_path / "r" / "lease", (future, future))
    assert store.read_versioned("r/lease").age is None
    now = [0.0]

    def sleep(s):
        now[0] += s

    b = Lease(LocalStore(tmp_path), "r", "B", 30.0, clock=lambda: now[0], sleep=sleep)
    b.acquire()
    assert b.took_over["why"] == "expired" and now[0] >= 30.0
    b.release()


def test_a_session_taken_over_between_renewals_uploads_no_checkpoint(backend, tmp_path):
    """--take-over lands between two renewals of the old holder (a third of a lifetime apart): its next push
    reads the lease first and is fenced before a byte of a checkpoint reaches the new holder's run."""
    from baton.checkpoint.cycle import push_checkpoint

    a = Lease(backend.store, "r", "A", 60.0)
    a.acquire()
    a.seal(POINTER)
    b = Lease(another_client(backend), "r", "B", 60.0)
    b.acquire(take_over=True)
    assert a.lost is None  # A has not renewed since: nothing has told it yet
    folder = tmp_path / "step-5"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "state.json").write_text(json.dumps({"step": 5}))
    with pytest.raises(Fenced, match=r"taken over by session B"):
        push_checkpoint(FencedStore(backend.store, a), "r", folder, 5, {"n": 5})
    assert not [k for k in backend.store.list("r/") if "/ckpt/" in k]
    assert folder.is_dir()  # the local copy stays
    b.release()
