"""The quota ledger in the store: a killed session still bills to its last heartbeat; totals and caps."""

import json
import signal
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from baton.planning import ledger as L
from baton.planning.plan import HOUR, Quota
from baton.store.local import LocalStore


def _records(store_dir, run):
    return [json.loads(p.read_text()) for p in sorted((store_dir / run / "ledger").glob("*.json"))]


def test_killed_session_bills_to_its_last_heartbeat(make_config, baton_cli, tmp_path):
    cfg = str(make_config())
    store = tmp_path / "store"
    proc = baton_cli.start("train", "-c", cfg, "--no-progress", "--set", "train.steps=100000",
                           "--set", "train.ckpt_every=25", "--set", "budget.heartbeat_minutes=0")
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for two checkpoints, i.e. two heartbeats after the start
        recs = _records(store, "test") if (store / "test" / "ledger").is_dir() else []
        if recs and len(recs[0]["checkpoints"]) >= 2:
            break
        assert proc.poll() is None, proc.stderr_text()
        time.sleep(0.05)
    else:
        pytest.fail("no checkpoints within 120 s")
    proc.kill(signal.SIGKILL)
    assert proc.wait(timeout=30).returncode == -signal.SIGKILL

    (rec,) = _records(store, "test")
    assert rec["outcome"] == "open" and rec["ended"] is None
    assert rec["steps_from"] == 0 and rec["steps_to"] == rec["checkpoints"][-1]["step"] >= 50
    assert rec["heartbeat_ts"] > rec["started_ts"]
    want = (rec["heartbeat_ts"] - rec["started_ts"]) / HOUR * rec["bill_factor"]
    assert want > 0 and rec["bill_factor"] == 1.0  # one CPU process

    out = json.loads(baton_cli("ledger", "-c", cfg, "--json", check=True).stdout)
    (row,) = out["sessions"]
    assert row["session"] == rec["session"] and row["billed_hours"] == pytest.approx(want, rel=1e-12)
    assert out["totals"]["billed_hours"] == pytest.approx(want) and out["totals"]["open_sessions"] == 1
    text = baton_cli("ledger", "-c", cfg, "--set", "budget.cap_hours=1", check=True).stdout
    assert "no end recorded (running, or died: billed to heartbeat)" in text
    assert f"cap: {want:.4f} h of 1 h, {1 - want:.4f} h left" in text

    st = json.loads(baton_cli("status", "-c", cfg, "--json", "--set", "train.steps=100000", check=True).stdout)
    # The kill may land between the pointer roll and the ledger's heartbeat, or inside the next upload.
    assert st["pointer_step"] in (rec["steps_to"], rec["steps_to"] + 25)
    assert st["tokens_done"] == st["pointer_step"] * 256
    by_step = {c["step"]: c for c in st["checkpoints"]}
    assert by_step[st["pointer_step"]]["verified"] and by_step[st["pointer_step"]]["pointer"]
    for c in st["checkpoints"]:  # anything unverified is an upload the kill cut short, never an old one
        assert c["verified"] or c["step"] > st["pointer_step"]
    assert st["rate_tokens_per_s"] == rec["tokens_per_s"] > 0
    # What is left counts from the store's pointer, which the kill may have left one upload past the ledger.
    assert st["steps_left"] == 100000 - st["pointer_step"]
    assert st["stepping_hours_left"] == pytest.approx((100000 - st["pointer_step"]) * 256 / rec["tokens_per_s"] / HOUR)


def _rec(start: datetime, hours: float, ended: bool = True, bill: float = 1.0, **kw) -> L.LedgerRecord:
    s = start.timestamp()
    e = s + hours * HOUR
    return L.LedgerRecord.from_json(
        {"format": L.FORMAT, "session": kw.get("session", f"s{s}"), "run": "r", "started_ts": s, "started": str(start),
         "heartbeat_ts": e, "heartbeat": "", "ended_ts": e if ended else None, "ended": "x" if ended else None,
         "outcome": "completed" if ended else L.OPEN, "bill_factor": bill, "checkpoints": kw.get("checkpoints", []),
         "tokens_per_s": kw.get("rate")})


def test_totals_split_a_session_across_the_quota_reset():
    reset = datetime(2026, 9, 26, tzinfo=timezone.utc)
    q = Quota(30.0, timedelta(days=7), reset)
    recs = [_rec(reset - timedelta(hours=10), 6.0, bill=2.0),  # all in the old week: 12 h billed
            _rec(reset - timedelta(hours=2), 5.0),  # 2 h before the reset, 3 h after
            _rec(reset + timedelta(hours=20), 1.5, ended=False)]  # died: billed to its heartbeat
    t = L.totals(recs, q, cap_hours=20.0, now=reset + timedelta(days=1))
    assert t.billed_hours == pytest.approx(12 + 5 + 1.5)
    assert t.period_start == reset and t.period_hours == pytest.approx(3 + 1.5)
    assert t.quota_left == pytest.approx(30 - 4.5)
    assert t.cap_left == pytest.approx(20 - 18.5) and t.open_sessions == 1
    before = L.totals(recs, q, now=reset - timedelta(minutes=1))
    assert before.period_hours == pytest.approx(12 + 2)


def test_the_table_marks_an_overdrawn_quota_and_a_record_without_steps():
    reset = datetime(2026, 9, 26, tzinfo=timezone.utc)
    recs = [replace(_rec(reset, 2.0), steps_from=None, steps_to=None, outcome="preflight data pass"),
            replace(_rec(reset + timedelta(hours=3), 1.0), steps_from=0, steps_to=20)]
    text = L.format_ledger(recs, L.totals(recs, Quota(2.5, timedelta(days=7), reset), cap_hours=2.0,
                                          now=reset + timedelta(hours=5)))
    rows = text.splitlines()
    assert rows[2].endswith("| 2.0000 | preflight data pass | — | None x1.0 |") and "| 0 → 20 |" in rows[3]
    assert "3.0000 h of 2.5 h, -0.5000 h left  OVER THE QUOTA" in text and "OVER THE CAP" in text


def test_records_are_separate_objects_and_a_damaged_one_is_reported(tmp_path):
    store = LocalStore(tmp_path / "store")
    t0 = time.time()
    a = L.SessionLedger(store, "r", t0 - 100, "cpu", 1, 1.0, tokens_per_step=256)
    b = L.SessionLedger(store, "r", t0 - 50, "cuda:0", 2, 2.0, tokens_per_step=256)
    a.resumed(0)
    b.resumed(40)
    a.checkpoint(40, 1.5, True, stepping_seconds=10.0)
    b.end("stopped: SIGTERM", 60, stepping_seconds=5.0)
    store.write_text("r/ledger/garbage.json", "{not json")
    records, problems = L.read_ledger(store, "r")
    assert [r.session for r in records] == [a.id, b.id] and a.id != b.id
    assert (records[0].checkpoints[0].step, records[0].checkpoints[0].verified) == (40, True)
    assert records[0].tokens_per_s == pytest.approx(40 * 256 / 10.0)
    assert records[1].outcome == "stopped: SIGTERM" and records[1].steps_to == 60
    assert records[1].tokens_per_s == pytest.approx(20 * 256 / 5.0)
    assert len(problems) == 1 and "garbage.json" in problems[0]
    assert L.measured_rate(records)[0] == records[1].tokens_per_s  # the most recent measurement
    assert L.checkpoint_seconds(records) == 1.5
    assert L.billed_hours(records[1]) == pytest.approx((records[1].ended_ts - (t0 - 50)) / HOUR * 2.0)


def _started(start: datetime, startup: float, split: dict | None = None) -> L.LedgerRecord:
    raw = _rec(start, 1.0).to_json()
    return L.LedgerRecord.from_json({**raw, "startup_seconds": startup, "startup": split})


def test_the_start_up_split_round_trips_and_a_bad_one_is_named():
    t0 = datetime(2026, 9, 26, tzinfo=timezone.utc)
    split = {"pull": 12.5, "build": 20.0, "first_step": 81.0, "compile": "cold", "compile_seconds": 80.0,
             "note": "compile cache: none in the store"}
    rec = _started(t0, 32.5, split)
    assert rec.startup == L.StartupSplit(12.5, 20.0, 81.0, "cold", 80.0, "compile cache: none in the store")
    assert rec.startup.total == 112.5 and L.LedgerRecord.from_json(rec.to_json()) == rec
    for bad, said in (({**split, "pull": "x"}, "startup.pull is not a number"),
                      ({**split, "compile": "tepid"}, "startup.compile is not one of off, cold, warm"),
                      ({k: v for k, v in split.items() if k != "build"}, "startup.build is not a number"),
                      ([1, 2], "startup is not a table")):
        with pytest.raises(ValueError, match=said):
            _started(t0, 1.0, bad)


def test_plans_take_the_warm_start_up_once_sessions_have_one():
    t0 = datetime(2026, 9, 26, tzinfo=timezone.utc)
    cold = {"pull": 10.0, "build": 20.0, "first_step": 80.5, "compile": "cold", "compile_seconds": 80.0}
    warm = {"pull": 11.0, "build": 19.0, "first_step": 10.5, "compile": "warm", "compile_seconds": 10.0}
    recs = [_started(t0, 30.0, cold), _started(t0 + timedelta(hours=2), 30.0, warm),
            _started(t0 + timedelta(hours=4), 30.0, {**warm, "compile_seconds": 12.0})]
    seconds, why = L.startup_seconds(recs)
    assert seconds == 11.0 + 19.0 + 12.0  # the slowest warm one, the cold first session left out
    assert why.startswith("measured warm (ledger, session ") and why.endswith(
        ": pull 11.0 s, build 19.0 s, compile 12.0 s warm)")
    # Sessions that never compiled warm: the slowest of them, its compile counted; records from before the split
    # count their whole start-up.
    assert L.startup_seconds(recs[:1])[0] == 110.0
    assert L.startup_seconds([_started(t0, 42.0)]) == (42.0, f"measured (ledger, session s{t0.timestamp()})")
    assert L.startup_figure(5.0, recs) == (300.0, "config")


def test_a_session_that_finds_the_run_complete_is_billed_at_the_runs_step(make_config, capsys):
    """It trains nothing, and its record says so at the step the run ended on (4 -> 4), not 0 -> 0, which
    read as a session that started the run over."""
    import baton
    from baton.cli import main
    from baton.config import load_config

    cfg = load_config(make_config(), ["train.steps=4"])
    baton.train(cfg, progress=False)
    assert baton.train(cfg, progress=False)["complete"] is True
    records, problems = L.read_ledger(LocalStore(cfg.store.url), "test")
    assert not problems and len(records) == 2
    assert (records[1].steps_from, records[1].steps_to, records[1].outcome) == \
        (4, 4, "nothing to do: the run is complete")
    capsys.readouterr()
    assert main(["ledger", "-c", str(make_config()), "--set", "train.steps=4"]) == 0
    assert "| 4 → 4 |" in capsys.readouterr().out


def test_a_session_killed_before_its_first_heartbeat_is_billed_its_start_up(tmp_path):
    """The record is written at the resume with a heartbeat: a session killed after half an hour of pulling, before
    its first step's heartbeat, is billed that half hour, not nothing."""
    import time as clock

    store = LocalStore(tmp_path)
    led = L.SessionLedger(store, "r", clock.time() - 1800, device="cpu", accelerators=1, bill_factor=1.0,
                          tokens_per_step=64)
    led.resumed(0)
    (rec,), problems = L.read_ledger(store, "r")
    assert not problems and rec.outcome == "open" and rec.ended_ts is None
    assert L.billed_hours(rec) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("where", ["build", "setup", "train"])
def test_a_session_that_fails_is_billed_with_its_failure(where, make_config, monkeypatch):
    """A failure after the ledger record is opened (building the optimizer: a GPU out of memory; setting up the
    session; a run gone non-finite) ends the record with the failure and bills the session to there."""
    import baton
    from baton.config import load_config
    from baton.errors import BatonError

    overrides = ["train.steps=4"]
    if where == "build":
        from baton.session import parts

        monkeypatch.setattr(parts, "build_optimizer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    elif where == "setup":
        from baton.session import core

        monkeypatch.setattr(core, "Checkpointer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    else:
        overrides += ["optim.lr=1e12", "train.max_nonfinite=1", "optim.grad_clip=0"]
    cfg = load_config(make_config(), overrides)
    with pytest.raises((RuntimeError, BatonError)):
        baton.train(cfg, progress=False)
    (rec,), problems = L.read_ledger(LocalStore(cfg.store.url), "test")
    assert not problems and rec.ended_ts is not None and L.billed_hours(rec) > 0
    assert rec.outcome.startswith("failed: BatonError: 1 consecutive steps" if where == "train" else
                                  "failed: RuntimeError: boom"), rec.outcome
