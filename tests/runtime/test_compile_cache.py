"""train.compile_cache: the blob, its record in the store, and every way it can be unusable (missing, damaged,
truncated, for another key, unloadable), each a one-line note and a cold compile, never a failure
(baton/runtime/compile_cache.py, baton/runtime/compile_store.py, baton/session/warmstart.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

import baton
from baton.config import load_config
from baton.runtime import compile_cache as cc
from baton.runtime import compile_store, compiled
from baton.session.core import Session
from baton.store.local import LocalStore

KERNEL_A = "ab/c" + "a" * 51 + ".main.so"
KERNEL_B = "cd/c" + "b" * 51 + ".so"


def test_a_blob_unpacks_to_what_was_packed():
    blob = cc.pack(b"torch's artifacts", [(KERNEL_A, b"\x7fELF one"), (KERNEL_B, b"\x7fELF two")])
    assert cc.unpack(blob) == (b"torch's artifacts", [(KERNEL_A, b"\x7fELF one"), (KERNEL_B, b"\x7fELF two")])


@pytest.mark.parametrize(("damage", "said"), [
    (lambda b: b[:-1], "it holds"),  # truncated
    (lambda b: b + b"x", "it holds"),
    (lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:], "does not match its sha256"),  # one bit flipped in a part
    (lambda b: b"not a cache" + b, "wrong magic bytes"),
    (lambda b: b[:len(cc.MAGIC) + 4], "ends inside its header"),
    (lambda b: b[:len(cc.MAGIC) + 8] + b"x" + b[len(cc.MAGIC) + 9:], "header is unreadable"),
])
def test_a_damaged_blob_is_refused_in_one_line(damage, said):
    blob = cc.pack(b"artifacts", [(KERNEL_A, b"kernel")])
    with pytest.raises(cc.CacheUnusable, match=said) as e:
        cc.unpack(damage(blob))
    assert "\n" not in str(e.value)


def _with_header(header) -> bytes:
    """A blob whose header is ``header`` (raw JSON text), its parts' bytes after it as the header says."""
    head = header.encode()
    return cc.MAGIC + cc._LEN.pack(len(head)) + head + b"artifacts"


def _head(size: str, kernels: str = "[]") -> str:
    """A header's JSON text with the artifacts' size and the kernels' list written as given."""
    return '{"format": "' + cc.FORMAT + '", "artifacts": {"size": ' + size + ', "sha256": "x"}, "kernels": ' + kernels + "}"


@pytest.mark.parametrize("header", [
    _head("Infinity"), _head("9.0"), _head('"9"'), _head("9", kernels="3"), _head("9", kernels='["ab"]'),
    "[" * 100_000 + "]" * 100_000,
])
def test_a_header_of_the_wrong_shape_is_refused_in_one_line(header):
    # However its sha256 came to match its record (a push from a buggy or hostile writer), such a header is a
    # note and a cold compile, never an error that ends the session.
    with pytest.raises(cc.CacheUnusable, match="header is unreadable") as e:
        cc.unpack(_with_header(header))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("path", ["../evil.so", "/tmp/x.so", "ab/../../x.so", "ab/cabc.so", "ab/c" + "a" * 51 + ".py"])
def test_a_kernel_outside_inductors_layout_is_refused(path):
    with pytest.raises(cc.CacheUnusable, match="outside inductor's cache layout"):
        cc.unpack(cc.pack(b"artifacts", [(path, b"x")]))


def test_kernels_are_this_sessions_compiled_ones_and_probes_carry_their_markers(tmp_path):
    old, new, probe = tmp_path / "ab" / ("c" + "1" * 51 + ".so"), tmp_path / KERNEL_A, tmp_path / KERNEL_B
    for p in (old, new, probe):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"\x7fELF" + p.name.encode())
    (tmp_path / (KERNEL_B + ".load_ok")).write_text("")  # an instruction-set probe that loaded
    (tmp_path / "ab" / "notes.so.load_ok").write_text("")  # not inductor's layout: never carried
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    got = cc.native_kernels(time.time() - 60, tmp_path)
    assert got == [(KERNEL_A, new.read_bytes()), (KERNEL_B, probe.read_bytes()), (KERNEL_B + ".load_ok", b"")]
    # Put back on an empty machine under the same names, each probe's marker after its program; one already
    # there stays as it is. The count is of kernels, not markers.
    dest = tmp_path / "machine-2"
    (dest / "ab").mkdir(parents=True)
    assert cc.place_kernels(got, dest) == 2
    assert cc.place_kernels([(KERNEL_A, b"\x7fELFother")], dest) == 0
    assert (dest / KERNEL_A).read_bytes() == new.read_bytes()
    assert (dest / (KERNEL_B + ".load_ok")).read_bytes() == b""
    assert cc.unpack(cc.pack(b"artifacts", got))[1] == got  # a marker passes the blob's layout check


def test_the_key_changes_with_what_the_code_was_compiled_for(make_config):
    def key(*sets):
        cfg = load_config(make_config(), ["train.compile=true", *sets])
        return cc.cache_key(cc.key_parts(cfg, torch.device("cpu"), 1))

    base = key()
    assert key() == base
    others = {key("train.micro_batch=2"), key("data.seq_len=16"), key("train.compile_scope=model"),
              key("model.n_layers=3"), key("train.precision=bf16"), key("train.parallel=fsdp")}
    assert base not in others and len(others) == 6
    assert cc.cache_key({**cc.key_parts(load_config(make_config()), torch.device("cpu"), 1), "world": 2}) != base


def test_the_cpu_key_holds_what_inductors_kernel_names_leave_out(make_config):
    # Inductor names a C++ kernel by its source and command line, which says -march=native and includes the
    # thread count; the instructions meant, the compiler and the C library are in the key instead.
    cfg = load_config(make_config(), ["train.compile=true"])
    threads = torch.get_num_threads()
    try:
        parts = cc.key_parts(cfg, torch.device("cpu"), 1)
        torch.set_num_threads(1 if threads != 1 else 2)
        other = cc.key_parts(cfg, torch.device("cpu"), 1)
    finally:
        torch.set_num_threads(threads)
    assert parts["device"]["threads"] == threads and cc.cache_key(other) != cc.cache_key(parts)
    assert set(parts["device"]) >= {"flags", "compiler", "libc", "threads"}


# ------------------------------------------------------------------------------------------- the store


def _push(store, key="k" * 32, blob=None):
    blob = blob if blob is not None else cc.pack(b"artifacts", [(KERNEL_A, b"kernel")])
    return compile_store.push(store, "run", key, {"torch": "x"}, blob, 1, "full", "session-1"), blob


def test_a_pushed_blob_is_verified_and_pulled_back_byte_for_byte(tmp_path):
    store = LocalStore(tmp_path / "store")
    rec, blob = _push(store)
    assert (rec.size, rec.kernels, rec.session) == (len(blob), 1, "session-1")
    assert json.loads(store.read_text(compile_store.record_key("run", "k" * 32)))["sha256"] == rec.sha256
    got = compile_store.pull(store, "run", "k" * 32, tmp_path / "machine" / "k.bin")
    assert got.path is not None and got.path.read_bytes() == blob and got.record == rec
    assert got.note.startswith("compile cache: pulled ")


def _damage_store(tmp_path, store, how):
    blob_file = tmp_path / "store" / compile_store.blob_key("run", "k" * 32)
    if how == "missing":
        for p in (tmp_path / "store" / "run" / compile_store.CACHE_DIR).iterdir():
            p.unlink()
    elif how == "corrupt":
        data = bytearray(blob_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob_file.write_bytes(bytes(data))
    elif how == "truncated":
        blob_file.write_bytes(blob_file.read_bytes()[:-10])
    elif how == "wrong key":  # the record and blob of another key, found under this one
        _push(store, "w" * 32)
        base = tmp_path / "store" / "run" / compile_store.CACHE_DIR
        for ext in ("bin", "json"):
            (base / f"{'w' * 32}.{ext}").replace(base / f"{'k' * 32}.{ext}")
    elif how == "record unreadable":
        (tmp_path / "store" / compile_store.record_key("run", "k" * 32)).write_text("{not json")
    elif how == "blob gone":
        blob_file.unlink()


NOTES = {"missing": "compile cache: none in ", "corrupt": "(damaged or truncated); compiling cold",
         "truncated": "(damaged or truncated); compiling cold",
         "wrong key": f"is for key {'w' * 12}, not this session's {'k' * 12}",
         "record unreadable": "is unreadable", "blob gone": "could not be downloaded"}


@pytest.mark.parametrize("how", list(NOTES))
def test_an_unusable_cache_in_the_store_is_a_note_and_nothing_to_load(tmp_path, how):
    store = LocalStore(tmp_path / "store")
    _push(store)
    _damage_store(tmp_path, store, how)
    dest = tmp_path / "machine" / "k.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"left by an earlier session")
    got = compile_store.pull(store, "run", "k" * 32, dest)
    assert got.path is None and NOTES[how] in got.note and "\n" not in got.note
    assert got.missing == (how == "missing")  # only a cache never pushed is how every run starts, not a problem
    assert not dest.exists()  # nothing stale is left to be loaded


def test_older_keys_are_pruned_the_newest_kept(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    monkeypatch.setattr(compile_store, "KEEP", 10)  # the pushes themselves prune nothing here
    for i, key in enumerate(("a" * 32, "b" * 32, "c" * 32, "d" * 32)):
        _push(store, key)
        rec = json.loads(store.read_text(compile_store.record_key("run", key)))
        rec["created"] = f"2026-01-0{i + 1}T00:00:00+00:00"  # pushed a day apart
        store.write_text(compile_store.record_key("run", key), json.dumps(rec))
    compile_store.prune(store, "run", keep=3, current="a" * 32)
    left = sorted(Path(k).name for k in store.list(f"run/{compile_store.CACHE_DIR}/", checksums=False))
    assert left == sorted(f"{k * 32}.{e}" for k in "acd" for e in ("bin", "json"))


def test_a_kernel_that_is_no_shared_library_is_refused_and_nothing_is_placed(tmp_path):
    """Damaged before it was packed, its sha256 matches: placed, it would fail every compile that loads it, in this
    run and any other on the machine. Refused whole: the session compiles cold."""
    kernels = [(KERNEL_A, b"\x7fELF" + b"\0" * 64), (KERNEL_B, b"junk")]
    with pytest.raises(cc.CacheUnusable, match=f"its kernel {KERNEL_B} is not a shared library"):
        cc.place_kernels(kernels, tmp_path)
    assert not list(tmp_path.rglob("*.so"))


def test_a_warm_session_whose_compile_fell_back_takes_back_its_kernels_and_the_blob(make_config, monkeypatch,
                                                                                    tmp_path):
    """Loaded, yet the compile fell back to eager (a kernel that does not load): neither this machine's cache nor
    the store keeps what it loaded, so the next session compiles cold instead of running eagerly for good."""
    from types import SimpleNamespace

    from baton.session import warmstart

    sets = ["train.compile=true", "train.steps=2", "run.name=cached"]
    s = Session(load_config(make_config(), sets), resume="never", progress=False)
    try:
        ws = s.parts.compile_cache
        store = LocalStore(tmp_path / "store")
        compile_store.push(store, "cached", ws.key, {}, cc.pack(b"artifacts", []), 0, "full", None)
        placed = tmp_path / "inductor" / KERNEL_A
        placed.parent.mkdir(parents=True)
        placed.write_bytes(b"\x7fELF")
        ws.kind, ws._placed = "warm", [placed]
        monkeypatch.setattr(warmstart, "compiled_parts", lambda micro_loss: [SimpleNamespace(fell_back=True)])
        ws.after_first_step(store, None, None)
        assert ws.kind == "cold" and not placed.exists() and ws.pushed is None
        assert store.read_text(compile_store.record_key("cached", ws.key)) is None
        assert not (tmp_path / "store" / compile_store.blob_key("cached", ws.key)).exists()
        assert "fell back to eager after loading it" in ws.push_note and "next session compiles cold" in ws.push_note
    finally:
        s.close()


def test_bytes_torch_cannot_load_are_refused_in_one_line():
    with pytest.raises(cc.CacheUnusable, match="torch could not load its artifacts") as e:
        cc.load(cc.pack(b"these are not torch's artifacts", []))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------- a session


def _session_key(cfg_path, sets):
    s = Session(load_config(cfg_path, sets), resume="never", progress=False)
    try:
        return s.parts.compile_cache.key
    finally:
        s.close()


@pytest.mark.parametrize("how", ["corrupt", "truncated", "wrong key", "unloadable"])
def test_a_session_with_an_unusable_cache_notes_it_and_trains_cold(make_config, monkeypatch, tmp_path, capfd, how):
    """dynamo traces for real (the "eager" backend: no minutes of code generation); the store holds a cache for the
    session's own key that is damaged in one of the ways a store can damage it."""
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    sets = ["train.compile=true", "train.steps=2", "run.name=cached"]
    path = make_config()
    key = _session_key(path, sets)
    store = LocalStore(tmp_path / "store")
    blob = cc.pack(b"not torch's artifacts", [])
    compile_store.push(store, "cached", key, {}, blob, 0, "full", None)
    blob_file = tmp_path / "store" / compile_store.blob_key("cached", key)
    if how == "corrupt":
        blob_file.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    elif how == "truncated":
        blob_file.write_bytes(blob[: len(blob) // 2])
    elif how == "wrong key":
        rec = json.loads(store.read_text(compile_store.record_key("cached", key)))
        store.write_text(compile_store.record_key("cached", key), json.dumps({**rec, "key": "0" * 32}))
    capfd.readouterr()
    summary = baton.train(load_config(path, sets), progress=False)
    cache = summary["compile_cache"]
    assert summary["steps_done"] == 2 and cache["kind"] == "cold" and summary["compile_fallbacks"] == []
    expected = {"corrupt": "damaged or truncated", "truncated": "damaged or truncated",
                "wrong key": "is for key 000000000000", "unloadable": "torch could not load its artifacts"}[how]
    assert expected in cache["note"] and cache["note"].endswith("compiling cold")
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if expected in line] == [cache["note"]]  # said once, in one line
    assert "Traceback" not in err and "un-pickle" not in err  # and nothing of torch's own report
    assert summary["startup"]["compile"] == "cold"


def test_a_session_without_compile_pulls_nothing(make_config, tmp_path):
    summary = baton.train(load_config(make_config(), ["train.steps=2"]), progress=False)
    assert summary["compile_cache"] == {"enabled": False, "kind": "off", "key": None, "note": None, "push_note": None,
                                        "pushed": None}
    assert summary["startup"]["compile"] == "off" and summary["startup"]["compile_seconds"] is None
    assert not (tmp_path / "store" / "test" / compile_store.CACHE_DIR).exists()


@pytest.mark.parametrize("fails", [False, True])
def test_the_first_compiled_step_pushes_in_the_background_and_a_failed_push_is_a_note(make_config, monkeypatch,
                                                                                       tmp_path, fails):
    monkeypatch.setattr(compiled, "BACKEND", "eager")  # dynamo traces; torch then has no artifacts of its own
    blob = cc.pack(b"what torch would hand over", [(KERNEL_A, b"kernel")])
    monkeypatch.setattr(cc, "collect", lambda since: blob)
    if fails:
        def refuse(*a, **k):
            raise compile_store.BatonError("the store said no (HTTP 503)")

        monkeypatch.setattr(compile_store, "push_folder", refuse)
    summary = baton.train(load_config(make_config(), ["train.compile=true", "train.steps=3"]), progress=False)
    cache = summary["compile_cache"]
    assert summary["steps_done"] == 3 and cache["kind"] == "cold"
    rec = LocalStore(tmp_path / "store").read_text(compile_store.record_key("test", cache["key"]))
    if fails:
        assert cache["pushed"] is None and rec is None
        assert cache["push_note"] == ("compile cache: the push of 0.0 MiB failed (BatonError: the store said no "
                                      "(HTTP 503)); the next session compiles cold")
        return
    assert cache["pushed"]["bytes"] == len(blob) and cache["pushed"]["kernels"] == 1
    assert json.loads(rec)["sha256"] == compile_store.sha256_bytes(blob)
    assert (tmp_path / "store" / compile_store.blob_key("test", cache["key"])).read_bytes() == blob
    assert summary["startup"]["note"].endswith(f"as {compile_store.blob_key('test', cache['key'])}")
