"""Tampering and faults, each against the local store, the S3 server and (where it applies) the Hub server:
a checkpoint is verified only if the store provably holds every byte, and a failure never moves the
pointer nor deletes the local copy."""

from __future__ import annotations

import json
import logging
import random

import pytest

from baton.checkpoint.cycle import POINTER, local_manifest, push_checkpoint, push_folder, read_windows, verify_remote
from baton.checkpoint.pull import read_pointer
from baton.errors import ResumeError, StoreError, VerificationError
from baton.store import RetryPolicy
from support.store_backends import FAST_RETRY

SIZES = {"model.safetensors": 400_000, "optimizer.safetensors": 300_000, "state.json": 200}
PREFIX = "run/ckpt/step-1"


def checkpoint_folder(path, step: int = 1):
    rnd = random.Random(step)
    path.mkdir(parents=True, exist_ok=True)
    for name, size in SIZES.items():
        data = json.dumps({"step": step, "pad": "x" * size})[:size].encode() if name.endswith(".json") \
            else rnd.randbytes(size)
        (path / name).write_bytes(data)
    return path


@pytest.fixture
def pushed(backend, tmp_path):
    folder = checkpoint_folder(tmp_path / "local" / "step-1")
    files, _ = push_folder(backend.store, folder, PREFIX, "sample")
    return backend, folder, files


def verify(backend, folder, files, seed: int = 7, mode: str = "sample"):
    verify_remote(backend.store, PREFIX, files, folder, mode, rng=random.Random(seed))


def outside_windows(size: int, seed: int = 7) -> int:
    """An offset no read-back window of ``verify(seed=seed)`` covers for this file (same rng draws)."""
    rng = random.Random(seed)
    windows = read_windows(size, "sample", rng)
    for off in range(size // 2, size):
        if not any(a <= off <= b for a, b in windows):
            return off
    raise AssertionError("no offset outside the windows")


def test_clean_checkpoint_passes(pushed):
    backend, folder, files = pushed
    verify(backend, folder, files)
    verify(backend, folder, files, mode="full")


def test_flip_inside_a_window_fails(pushed):
    backend, folder, files = pushed
    # The store's own claims stay as they were: only the bytes read back can tell.
    backend.flip(f"{PREFIX}/model.safetensors", 100, service_checksum=False)
    with pytest.raises(VerificationError, match="model.safetensors"):
        verify(backend, folder, files)
    if backend.kind != "local":  # the local store's listing rehashes, so it fails there first
        with pytest.raises(VerificationError, match="bytes 0-65535 read back differ"):
            verify(backend, folder, files)


def test_flip_outside_every_window_fails_on_the_listed_sha256(pushed):
    backend, folder, files = pushed
    off = outside_windows(SIZES["optimizer.safetensors"])
    backend.flip(f"{PREFIX}/optimizer.safetensors", off, service_checksum=True)
    with pytest.raises(VerificationError, match=r"optimizer.safetensors: store lists sha256 .*, pushed"):
        verify(backend, folder, files)


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_flip_no_listing_reports_is_caught_by_full_verification(make_backend, tmp_path, kind):
    """A server that keeps only the sha256 baton reported, over bytes that changed: only rereading shows it."""
    backend = make_backend(kind)
    folder = checkpoint_folder(tmp_path / "step-1")
    files, _ = push_folder(backend.store, folder, PREFIX, "sample")
    off = outside_windows(SIZES["optimizer.safetensors"])
    backend.flip(f"{PREFIX}/optimizer.safetensors", off, service_checksum=False)
    with pytest.raises(VerificationError, match="optimizer.safetensors: bytes .* read back differ"):
        verify(backend, folder, files, mode="full")


def test_missing_file_fails(pushed):
    backend, folder, files = pushed
    backend.remove(f"{PREFIX}/state.json")
    with pytest.raises(VerificationError, match="state.json: not listed by the store"):
        verify(backend, folder, files)


def test_server_ignoring_range_fails(pushed):
    backend, folder, files = pushed
    backend.fault("ignore_range")
    with pytest.raises(VerificationError, match=r"status 200, not 206"):
        verify(backend, folder, files)


def test_right_length_from_the_wrong_offset_fails_on_content_range(pushed):
    backend, folder, files = pushed
    backend.fault("shift_range", match=lambda m, p: "model" in p or "lfs-blob" in p)
    with pytest.raises(VerificationError, match=r"asked for bytes 0-65535/400000, server answered Content-Range "
                                                r"'bytes 4096-69631/400000'"):
        verify(backend, folder, files)


def test_wrong_bytes_under_a_truthful_looking_content_range_fail(pushed):
    backend, folder, files = pushed
    backend.fault("lie_range", match=lambda m, p: "model" in p or "lfs-blob" in p)
    with pytest.raises(VerificationError, match="model.safetensors: bytes 0-65535 read back differ"):
        verify(backend, folder, files)


def test_failed_verification_keeps_pointer_and_local_copy(backend, tmp_path):
    store = backend.store
    first = checkpoint_folder(tmp_path / "l" / "step-1", 1)
    push_checkpoint(store, "run", first, 1, {"n": 1}, keep_last=1)
    pointer = json.loads(store.read_text(f"run/{POINTER}"))
    second = checkpoint_folder(tmp_path / "l" / "step-2", 2)
    before = local_manifest(second)
    backend.fault("ignore_range")
    with pytest.raises(VerificationError):
        push_checkpoint(store, "run", second, 2, {"n": 2}, keep_last=1)
    backend.clear_faults()
    assert json.loads(store.read_text(f"run/{POINTER}")) == pointer  # unmoved
    assert local_manifest(second) == before  # the local copy is whole
    # keep_last=1 did not prune the verified step 1 for an unverified step 2
    assert any(k.startswith("run/ckpt/step-1/") for k in store.list("run/ckpt/", checksums=False))


def test_pointer_outside_the_run_is_refused(backend):
    store = backend.store
    for path in ("../other/ckpt/step-1", "/abs/ckpt/step-1", "ckpt/../../x", "ckpt/step-1/../..",
                 "../run2/ckpt/step-4", "other/step-1", "ckpt\\..\\x"):
        pointer = {"run": "run", "step": 1, "path": path, "cursor": {},
                   "files": {n: {"size": 1, "sha256": "0" * 64} for n in SIZES}}
        store.write_text(f"run/{POINTER}", json.dumps(pointer))
        with pytest.raises(ResumeError, match="outside the run"):
            read_pointer(store, "run")


def retry_hook(backend, on_retry):
    """Call ``on_retry`` when the store logs its first retry (a deterministic point inside the outage)."""
    class Hook(logging.Handler):
        fired = False

        def emit(self, record):
            if not self.fired and "retry 1/" in record.getMessage():
                self.fired = True
                on_retry()

    h = Hook()
    logging.getLogger("baton.store.retry").addHandler(h)
    return h


def go_down_mid_upload(backend):
    """The store fails from the optimizer file on: the model file has gone up already."""
    if backend.kind == "local":
        store = backend.store
        original = store.put_file

        def put_file(local, key, sha, create=False):
            if "optimizer" in key:
                backend.go_down()
            return original(local, key, sha, create=create)

        store.put_file = put_file
    elif backend.kind == "s3":
        backend.fault("drop", match=lambda m, p: m == "PUT" and "optimizer" in p)
    else:  # the Hub commits a checkpoint in one request; the library retries LFS transfers on its own
        backend.fault("drop", match=lambda m, p: m == "POST" and "/commit/" in p)


def test_store_down_mid_upload_fails_clearly_and_keeps_everything(backend, tmp_path):
    store = backend.store
    first = checkpoint_folder(tmp_path / "l" / "step-1", 1)
    push_checkpoint(store, "run", first, 1, {"n": 1})
    pointer = store.read_text(f"run/{POINTER}")
    second = checkpoint_folder(tmp_path / "l" / "step-2", 2)
    before = local_manifest(second)
    go_down_mid_upload(backend)
    with pytest.raises(StoreError) as err:
        push_checkpoint(store, "run", second, 2, {"n": 2})
    msg = str(err.value)
    assert "after 3 attempt(s)" in msg and store.describe() in msg and "looks down" in msg
    backend.come_back()
    assert store.read_text(f"run/{POINTER}") == pointer
    assert local_manifest(second) == before


def test_store_down_briefly_is_retried_and_the_push_succeeds(make_backend, tmp_path):
    for kind in ("local", "s3", "hub"):
        backend = make_backend(kind, RetryPolicy(attempts=4, max_seconds=10, base=0.02, cap=0.1))
        go_down_mid_upload(backend)
        hook = retry_hook(backend, backend.come_back)
        try:
            folder = checkpoint_folder(tmp_path / kind / "step-1", 1)
            res = push_checkpoint(backend.store, "run", folder, 1, {"n": 1})
        finally:
            logging.getLogger("baton.store.retry").removeHandler(hook)
        assert hook.fired, kind
        assert res.verified and not folder.exists()
        assert json.loads(backend.store.read_text(f"run/{POINTER}"))["step"] == 1


def test_permanent_errors_stop_at_once_and_say_what_to_check(moto_server, hub_server, tmp_path):
    from baton.store.hub import HubStore
    from baton.store.s3 import S3Store

    (tmp_path / "f").write_bytes(b"x")
    slow = RetryPolicy(attempts=5, base=0.5)
    retried = retry_hook(None, lambda: None)
    s3 = S3Store.from_url(f"s3://no-such-bucket-baton/p?endpoint={moto_server.url}", slow)
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-baton' does not exist"):
        s3.put_file(tmp_path / "f", "k", "0" * 64)
    hub = HubStore.from_url("hf://nobody/missing", slow, endpoint=hub_server.url, token=hub_server.token)
    with pytest.raises(StoreError, match="repository nobody/missing was not found.*hf repo create"):
        hub.read_text("run/latest.json")
    hub_server.create_repo("baton-test/auth")
    bad = HubStore.from_url("hf://baton-test/auth", slow, endpoint=hub_server.url, token="hf_wrong_token_0000")
    with pytest.raises(StoreError, match="rejected the token") as err:
        bad.put_file(tmp_path / "f", "k", "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881")
    assert "hf_wrong_token_0000" not in str(err.value)
    logging.getLogger("baton.store.retry").removeHandler(retried)
    assert not retried.fired  # permanent errors are not retried


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_server_that_goes_silent_is_timed_out_and_retried_not_waited_on(make_backend, tmp_path, kind):
    backend = make_backend(kind, RetryPolicy(attempts=2, max_seconds=30, base=0.01, cap=0.05, request_timeout=1.0))
    # The upload (S3: the object PUT; the Hub: the commit) gets its answer only after a minute. Without a
    # client timeout the push would wait that minute and then succeed, and this test would fail.
    upload = (lambda m, p: m == "PUT") if kind == "s3" else (lambda m, p: m == "POST" and "/commit/" in p)
    stall = backend.fault("stall", match=upload)
    folder = checkpoint_folder(tmp_path / "l" / "step-1", 1)
    before = local_manifest(folder)
    with pytest.raises(StoreError, match=r"after 2 attempt\(s\) .*looks down") as err:
        push_checkpoint(backend.store, "run", folder, 1, {"n": 1})
    assert backend.store.describe() in str(err.value)
    assert stall.hits >= 2
    backend.clear_faults()
    assert backend.store.read_text(f"run/{POINTER}") is None
    assert local_manifest(folder) == before

    # One silent answer, then a normal one: the retry carries the push through.
    stall = backend.fault("stall", match=upload, times=1)
    res = push_checkpoint(backend.store, "run", folder, 1, {"n": 1})
    assert stall.hits == 1 and res.verified
    assert json.loads(backend.store.read_text(f"run/{POINTER}"))["step"] == 1


def test_a_clock_the_server_finds_skewed_is_said_at_once_not_retried_as_a_dead_store(make_backend, tmp_path):
    backend = make_backend("s3", RetryPolicy(attempts=5, base=0.5))
    retried = retry_hook(None, lambda: None)
    backend.fault("status", status=403, code="RequestTimeTooSkewed")
    try:
        with pytest.raises(ResumeError, match=r"this machine.s clock is off by more than 15 minutes; set it right "
                                             r"\(NTP"):
            read_pointer(backend.store, "run")
    finally:
        logging.getLogger("baton.store.retry").removeHandler(retried)
    assert not retried.fired


@pytest.mark.parametrize("env", [{"AWS_PROFILE": "no-such-profile"},
                                 {"AWS_SHARED_CREDENTIALS_FILE": "{tmp}/credentials", "AWS_PROFILE": "default"}])
def test_aws_configuration_that_cannot_be_used_is_one_store_error(env, moto_server, tmp_path, monkeypatch):
    from baton.store.s3 import S3Store

    (tmp_path / "credentials").write_text("[default\naws_access_key_id = AKIAEXAMPLEKEY\n")  # a broken section header
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(tmp=tmp_path))
    with pytest.raises(StoreError, match=r"the AWS configuration could not be used \(.*\): check AWS_PROFILE") as e:
        S3Store.from_url(f"s3://bucket/p?endpoint={moto_server.url}")
    assert "AKIAEXAMPLEKEY" not in str(e.value)


def test_a_host_that_never_resolved_is_said_at_once_and_one_that_did_is_retried(make_backend, monkeypatch, caplog):
    """A store host with no address (a typo, a machine with no DNS) is one line at once, not minutes of retries
    and of the Hub library's own retry lines; once the store has answered, a name that stops resolving is a
    resolver's hiccup, retried like a dropped connection."""
    import socket

    from baton.store.hub import HubStore
    from baton.store.s3 import S3Store

    real = socket.getaddrinfo
    down: set[str] = set()

    def getaddrinfo(host, *args, **kwargs):
        if host in down:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    slow = RetryPolicy(attempts=5, base=0.5)
    stores = {"127.0.0.1": [make_backend(kind, FAST_RETRY).store for kind in ("s3", "hub")],
              "store.example.invalid": [S3Store.from_url("s3://b/p?endpoint=http://store.example.invalid:9", slow),
                                        HubStore.from_url("hf://baton-test/dns", slow,
                                                          endpoint="http://store.example.invalid:9")]}
    down.add("store.example.invalid")
    retried = retry_hook(None, lambda: None)
    with caplog.at_level(logging.WARNING):
        for store in stores["store.example.invalid"]:
            with pytest.raises(StoreError, match=r"the host store.example.invalid does not resolve \(.*Name or service "
                                                 r"not known\): check the host name \(store.url, its endpoint\) and "
                                                 "this machine's network and DNS"):
                store.read_text("run/latest.json")
    assert not retried.fired
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    for store in stores["127.0.0.1"]:
        assert store.read_text("run/latest.json") is None  # answered: the name resolves
    down.add("127.0.0.1")
    for store in stores["127.0.0.1"]:
        with pytest.raises(StoreError, match=r"after 3 attempt\(s\).*looks down"):
            store.read_text("run/latest.json")
    logging.getLogger("baton.store.retry").removeHandler(retried)
    assert retried.fired


def test_a_listed_object_whose_read_back_fails_fails_verification(make_backend, tmp_path):
    """E-023: the listing names the file with its size and sha256, but reading it back errors (here a 404 on the
    ranged GET): the push is not verified, whatever the listing says."""
    backend = make_backend("s3", FAST_RETRY)
    folder = checkpoint_folder(tmp_path / "l" / "step-1", 1)
    files = push_folder(backend.store, folder, PREFIX, "sample", create=True)[0]
    verify(backend, folder, files)  # as pushed: verified
    backend.fault("status", status=404, code="NoSuchKey", match=lambda m, p: m == "GET" and "model" in p)
    with pytest.raises(VerificationError, match=r"model.safetensors: read-back failed: StoreError"):
        verify(backend, folder, files)
