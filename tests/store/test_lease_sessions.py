"""Two `baton train` sessions of one run, as real processes on the real stores (a folder, moto's S3 server, the
local Hub): started together exactly one trains; a holder paused while another takes over stops without
touching anything of the new holder's; a killed holder's lease is taken once expired; a clean stop (a signal)
releases it at once. Each run ends bit-identical to an uninterrupted one and its pointer never goes back."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load

from baton.faults import PAUSE_ENV, TRACE_ENV
from support.helpers import assert_tensors_equal, store_checkpoint_tensors, write_config

LEASE_S = 4
ARGS = ["--no-progress", "--set", "train.ckpt_every=5", "--set", f"store.lease_seconds={LEASE_S}"]
REFUSED = "baton: error: run 'test' is being trained by session "


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_data, baton_cli):
    """The uninterrupted run: its final model and optimizer tensors."""
    base = tmp_path_factory.mktemp("reference")
    cfg = write_config(base / "cfg.toml", data_dir=prepared_data, store=base / "store", runs=base / "runs")
    r = baton_cli("train", "-c", str(cfg), *ARGS)
    assert r.returncode == 0, r.stderr
    model, optim, pointer = store_checkpoint_tensors(base / "store", "test")
    assert pointer["step"] == 20 and pointer["complete"]
    return model, optim


class Where:
    """One store kind as a session's flags and environment, and its raw bytes read behind baton's back."""

    def __init__(self, kind: str, make_backend, tmp_path: Path, hub_server=None):
        self.kind = kind
        self.env: dict[str, str] = {}
        if kind == "local":
            self.root = tmp_path / "store"
            self.url = str(self.root)
        else:
            self.backend = make_backend(kind)
            if kind == "s3":
                self.url = self.backend.url
            else:  # the Hub: its endpoint and token come from the environment, as for a user
                self.url = f"hf://{self.backend.repo}"
                self.env = {"HF_ENDPOINT": hub_server.url, "HF_TOKEN": hub_server.token}
        self.flags = ["--set", f"store.url={self.url}"]

    def raw(self, key: str) -> bytes | None:
        if self.kind == "local":
            p = self.root / key
            return p.read_bytes() if p.is_file() else None
        try:
            return self.backend.raw(key)
        except Exception:  # noqa: BLE001 - absent
            return None

    def pointer(self) -> dict | None:
        raw = self.raw("test/latest.json")
        return json.loads(raw) if raw else None

    def listing(self) -> dict[str, str]:
        """Every object of the run with the sha256 of its bytes."""
        store = self.backend.store if self.kind != "local" else None
        if store is None:
            from baton.store.local import LocalStore

            store = LocalStore(self.root)
        return {k: hashlib.sha256(self.raw(k)).hexdigest() for k in store.list("test/", checksums=False)}

    def final(self):
        p = self.pointer()
        folder = f"test/{p['path']}"
        return load(self.raw(f"{folder}/model.safetensors")), load(self.raw(f"{folder}/optimizer.safetensors")), p


def ledger(where: Where) -> list[dict]:
    keys = [k for k in where.listing() if k.startswith("test/ledger/")]
    return sorted((json.loads(where.raw(k)) for k in keys), key=lambda r: r["started_ts"])


def watch_pointer(where: Where, stop: threading.Event, seen: list[int]) -> threading.Thread:
    """Every step the pointer names while the sessions run, in order (to prove it never goes back)."""
    def poll() -> None:
        while not stop.is_set():
            try:
                p = where.pointer()
            except ValueError:  # a local file caught mid-replace cannot happen (rename); S3/Hub answer whole
                p = None
            if p is not None and (not seen or seen[-1] != p["step"]):
                seen.append(p["step"])
            time.sleep(0.02)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["local", "s3", "hub"])
def test_two_sessions_started_together_exactly_one_trains(kind, reference, make_backend, make_config, baton_cli,
                                                          tmp_path, request):
    """The relay's commonest human failure: a second session of the same run while the first still trains (a new
    notebook tab, a requeued job). One trains to the end; the other exits 2 naming the holder and writes nothing."""
    where = Where(kind, make_backend, tmp_path, request.getfixturevalue("hub_server") if kind == "hub" else None)
    cfg = str(make_config())
    # Whichever wins trains for longer than a lease's lifetime: on the Hub the other watches the lease that long.
    env = {**where.env, PAUSE_ENV: f"step@3={LEASE_S + 2}"}
    a = baton_cli.start("train", "-c", cfg, *ARGS, *where.flags, env=env)
    b = baton_cli.start("train", "-c", cfg, *ARGS, *where.flags, env=env)
    ra, rb = a.wait(300), b.wait(300)
    results = sorted([(ra.returncode, ra.stderr), (rb.returncode, rb.stderr)])
    assert [rc for rc, _ in results] == [0, 2], results
    refused = results[1][1]
    assert REFUSED in refused and "`baton train --take-over`" in refused, refused
    assert refused.count("baton: error:") == 1
    records = ledger(where)
    assert [(r["steps_from"], r["steps_to"], r["outcome"], r["epoch"]) for r in records] == [(0, 20, "completed", 1)]
    model, optim, pointer = where.final()
    assert pointer["complete"] and pointer["step"] == 20 and pointer["epoch"] == 1
    assert_tensors_equal(model, reference[0])
    assert_tensors_equal(optim, reference[1])
    assert json.loads(where.raw("test/lease"))["released"] is True


@pytest.mark.parametrize("kind", ["local", "s3", "hub"])
@pytest.mark.parametrize("how", ["take-over", "expired"])
def test_a_paused_holder_taken_over_stops_without_touching_the_new_holders_run(kind, how, reference, make_backend,
                                                                             make_config, baton_cli, tmp_path,
                                                                             prepared_data, request):
    """A is SIGSTOPped as it is about to roll the pointer to step 15 (a frozen VM, a machine cut off); B takes the
    run over, with --take-over at once or without asking once A's lease has expired by the store's clock, resumes
    from step 10 and finishes it; A is SIGCONTed: it stops at once (exit 2, one line), its pointer write and
    pruning never happen, nothing of B's changes, and the run equals the uninterrupted one bit for bit."""
    where = Where(kind, make_backend, tmp_path, request.getfixturevalue("hub_server") if kind == "hub" else None)
    cfg_a = str(make_config("a.toml"))
    cfg_b = str(write_config(tmp_path / "b.toml", data_dir=prepared_data, store=where.url,
                             runs=tmp_path / "runs-b"))  # another machine: its own disk
    trace = tmp_path / "trace"
    stop, seen = threading.Event(), []
    watcher = watch_pointer(where, stop, seen)
    a = baton_cli.start("train", "-c", cfg_a, *ARGS, *where.flags,
                        env={**where.env, TRACE_ENV: str(trace), PAUSE_ENV: "pointer@15=3"})
    deadline = time.monotonic() + 240
    while not (trace.is_file() and "pointer 15 " in trace.read_text()):
        assert a.alive() and time.monotonic() < deadline, a.wait(5).stderr[-3000:]
        time.sleep(0.01)
    a.kill(signal.SIGSTOP)
    try:
        assert where.pointer()["step"] == 10
        shown = baton_cli("status", "-c", cfg_b, *where.flags, env=where.env)
        lease_line = next(line for line in shown.stdout.splitlines() if line.startswith("lease: "))
        holder = json.loads(where.raw("test/lease"))["session"]
        # S3 and a folder date the lease by the store's clock; the Hub has none, so its expiry is a lifetime after
        # the last renewal a watcher sees.
        assert f"session {holder} on host " in lease_line and ("expires in" in lease_line
                                                               or lease_line.startswith("lease: expired:")
                                                               or f"expires {LEASE_S} s after a renewal" in lease_line
                                                               and kind == "hub"), lease_line
        b = baton_cli("train", "-c", cfg_b, *ARGS, *where.flags, *(["--take-over"] if how == "take-over" else []),
                      env=where.env)
        if how == "expired" and b.returncode == 2:  # within the lease's lifetime (a slower start comes after it)
            assert REFUSED in b.stderr, b.stderr
            time.sleep(LEASE_S + 1.5)  # S3 stamps to the second
            b = baton_cli("train", "-c", cfg_b, *ARGS, *where.flags, env=where.env)
        assert b.returncode == 0, b.stderr
        said = "asked with --take-over" if how == "take-over" else "its lease had expired"
        assert "took over run 'test' from session" in b.stderr and said in b.stderr, b.stderr
        held = {k: v for k, v in where.listing().items() if "/ledger/" not in k}
    finally:
        a.kill(signal.SIGCONT)
    ra = a.wait(120)
    stop.set()
    watcher.join(5)
    assert ra.returncode == 2, ra.stderr
    errors = [line for line in ra.stderr.splitlines() if line.startswith("baton: error:")]
    assert len(errors) == 1 and "this session is fenced and stopped without writing anything more" in errors[0], ra.stderr
    # Nothing A did after the fence is visible: every object B left is as B left it, and none is new.
    assert {k: v for k, v in where.listing().items() if "/ledger/" not in k} == held
    assert seen == sorted(seen) and seen[-1] == 20, seen
    model, optim, pointer = where.final()
    assert pointer["complete"] and pointer["epoch"] == 2
    assert_tensors_equal(model, reference[0])
    assert_tensors_equal(optim, reference[1])
    records = ledger(where)
    assert records[0]["outcome"].startswith("fenced: ") and records[0]["epoch"] == 1
    assert records[1]["outcome"] == "completed" and records[1]["epoch"] == 2
    assert records[1]["took_over"] == {"session": records[0]["session"], "host": records[0]["host"], "epoch": 1,
                                       "why": "--take-over" if how == "take-over" else "expired"}


@pytest.mark.parametrize("aim", ["kill@pointer.readback@10=30", "kill@lease.written=30", "signal@step@12=2"])
def test_the_next_session_after_a_kill_or_a_stop_takes_the_run(aim, reference, make_config, baton_cli, tmp_path):
    """A killed holder (SIGKILL mid pointer write, or inside the lease's own conditional write) never releases its
    lease: the next session on the same machine sees that its process has ended and takes the run at once (logged,
    in the ledger; from another machine it waits for the expiry, as above). A holder stopped by a signal releases
    it: the next session starts at once, no takeover."""
    how, _, pause = aim.partition("@")
    point = pause.partition("=")[0]
    cfg = str(make_config())
    store = tmp_path / "store"
    trace = tmp_path / "trace"
    stop, seen = threading.Event(), []
    where = Where("local", None, tmp_path)
    watcher = watch_pointer(where, stop, seen)
    a = baton_cli.start("train", "-c", cfg, *ARGS, env={TRACE_ENV: str(trace), PAUSE_ENV: pause})
    name, _, step = point.partition("@")
    want = f"{name} {step or '-'} " if name != "lease.written" else "lease.written "
    deadline = time.monotonic() + 240
    while not (trace.is_file() and any(line.startswith(want) for line in trace.read_text().splitlines())):
        assert a.alive() and time.monotonic() < deadline, a.wait(5).stderr[-3000:]
        time.sleep(0.01)
    if how == "kill":
        a.kill(signal.SIGKILL)
        assert a.wait(30).returncode == -signal.SIGKILL
        lease = json.loads((store / "test" / "lease").read_text())
        said = baton_cli("status", "-c", cfg).stdout
        assert (f"lease: abandoned: session {lease['session']} on host {lease['host']} (pid {lease['pid']}), epoch "
                f"{lease['epoch']} ended without releasing it") in said, said  # not "expires in 60 s"
        b = baton_cli("train", "-c", cfg, *ARGS)
    else:
        a.kill(signal.SIGTERM)
        ra = a.wait(120)
        assert ra.returncode == 0, ra.stderr
        assert json.loads((store / "test" / "lease").read_text())["released"] is True
        b = baton_cli("train", "-c", cfg, *ARGS)
    stop.set()
    watcher.join(5)
    assert b.returncode == 0, b.stderr
    records = ledger(where)
    last = records[-1]
    if how == "kill":
        assert "its process had ended on this machine" in b.stderr
        assert last["took_over"] == {"session": lease["session"], "host": lease["host"], "epoch": lease["epoch"],
                                     "why": "gone"}
    else:
        assert last["took_over"] is None and "took over" not in b.stderr
    assert last["outcome"] == "completed"
    assert seen == sorted(seen) and seen[-1] == 20, seen
    model, optim, pointer = store_checkpoint_tensors(store, "test")
    assert pointer["complete"] and pointer["epoch"] == last["epoch"]
    assert_tensors_equal(model, reference[0])
    assert_tensors_equal(optim, reference[1])


def test_the_python_api_refuses_a_held_run_with_the_same_words(make_config, tmp_path):
    """A notebook gets the refusal as an exception (LeaseHeld, one line in a cell) with the words the CLI prints;
    take_over=True takes the run."""
    import baton
    from baton.config import load_config
    from baton.errors import LeaseHeld
    from baton.store.lease import Lease
    from baton.store.local import LocalStore

    cfg = load_config(make_config(), ["train.steps=4"])
    holder = Lease(LocalStore(tmp_path / "store"), "test", "other-notebook", 600.0)
    holder.acquire()
    with pytest.raises(LeaseHeld) as refused:
        baton.train(cfg, progress=False)
    said = str(refused.value)
    assert said.startswith("run 'test' is being trained by session other-notebook on host ")
    assert "the lease expires in" in said and "train(..., take_over=True) in Python" in said
    assert refused.value._render_traceback_() == [f"baton: error: {said}"]
    summary = baton.train(cfg, progress=False, take_over=True)
    assert summary["steps_done"] == 4
    assert holder.renew() is False and "taken over by session" in holder.lost


def test_a_sessions_last_write_to_the_run_is_the_release_of_its_lease(make_config, monkeypatch):
    """Whatever a session writes at its end (the ledger, the trackers' state) lands before its lease is released:
    a session that takes the freed run at once must find nothing of this one's still arriving."""
    import baton
    from baton.config import load_config
    from baton.store.local import LocalStore

    writes: list[tuple[str, str]] = []
    for name in ("write_text", "write_if", "put_file", "delete"):
        real = getattr(LocalStore, name)

        def recorded(self, *args, _real=real, _name=name, **kwargs):
            writes.append((_name, args[1] if _name == "put_file" else args[0]))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(LocalStore, name, recorded)
    cfg = load_config(make_config(), ["train.steps=4", "log.backends=['jsonl']"])
    assert baton.train(cfg, progress=False)["steps_done"] == 4
    assert ("write_text", "test/trackers.json") in writes
    assert writes[-1] == ("write_if", "test/lease"), writes[-6:]
    assert json.loads(LocalStore(cfg.store.url).read_text("test/lease"))["released"] is True


def test_a_held_run_is_refused_before_the_session_pulls_its_data(make_config, tmp_path):
    """The refusal comes from one read before the set-up: a second session on an empty machine does not first
    pull the dataset (gigabytes) only to be refused. Here the dataset is not there at all, and the refusal is
    still what the session says."""
    import baton
    from baton.config import load_config
    from baton.errors import LeaseHeld
    from baton.store.lease import Lease
    from baton.store.local import LocalStore

    cfg = load_config(make_config(), ["train.steps=4", f"data.dir={tmp_path / 'not-pulled-yet'}"])
    holder = Lease(LocalStore(tmp_path / "store"), "test", "other-session", 600.0)
    holder.acquire()
    with pytest.raises(LeaseHeld, match=r"^run 'test' is being trained by session other-session on host "):
        baton.train(cfg, progress=False)
    assert not (tmp_path / "not-pulled-yet").exists()
    holder.release()
