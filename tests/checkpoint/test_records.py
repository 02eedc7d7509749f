"""The records that carry the baton, each through its one parser: the records written by earlier versions
still load (tests/assets/records), each round-trips exactly, and a wrong value is one line naming it."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.checkpoint.names import ckpt_path, parse_step
from baton.checkpoint.pointer import Lineage, Pointer
from baton.checkpoint.record import CheckpointState, Stats, read_state
from baton.errors import ResumeError
from baton.evaluate.record import EvalRecord
from baton.planning.ledger import LedgerRecord, billed_hours

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "records"


def _load(name: str):
    return json.loads((ASSETS / name).read_text())


def test_records_of_an_earlier_version_load_with_every_value():
    mid = Pointer.from_json(_load("pointer-v1-midrun.json"), "test", "latest.json")
    assert (mid.step, mid.path, mid.complete, mid.verified) == (4, "ckpt/step-4", False, ("ckpt/step-4",))
    done = Pointer.from_json(_load("pointer-v1-complete.json"), "test", "latest.json")
    assert done.complete and done.final is not None and done.final["path"] == "final"
    assert done.verified == ("ckpt/step-4", "ckpt/step-8") and done.verified_steps() == {4, 8}
    assert done.val_loss == pytest.approx(5.8772, abs=1e-4) and done.val_windows == 16

    state = CheckpointState.from_json(_load("state-v1.json"), "state.json")
    assert (state.step, state.total_steps, state.params) == (8, 8, 106816)
    assert state.parent == Lineage(4, _load("pointer-v1-midrun.json")["files"]["model.safetensors"]["sha256"])
    assert state.cursor["samples_consumed"] == 64 and state.data.tokens_per_step == 256
    assert len(state.stats.spike_window) == 8 and state.stats.rollbacks == [] and state.scaler is None
    assert state.session is not None and len(state.rng_ranks) == 1

    ledger = LedgerRecord.from_json(_load("ledger-v1.json"))
    assert (ledger.steps_from, ledger.steps_to, ledger.verified_steps()) == (0, 4, {4})
    assert billed_hours(ledger) == pytest.approx(ledger.billed_hours, abs=1e-5)

    ev = EvalRecord.from_json(_load("eval-v1.json"))
    assert ev is not None and ev.step == 8 and ev.heldout["windows"] == 16 and ev.tasks == {}


@pytest.mark.parametrize("name", ["pointer-v1-midrun.json", "pointer-v1-complete.json"])
def test_a_pointer_round_trips_exactly(name):
    raw = _load(name)
    assert Pointer.from_json(raw, "test", "k").to_json() == raw


def test_state_ledger_and_eval_records_round_trip_exactly():
    raw = _load("state-v1.json")
    back = CheckpointState.from_json(raw, "s").to_json()
    # ``scheduler`` was written and never read: it is no longer written.
    assert back == {k: v for k, v in raw.items() if k != "scheduler"}
    raw = _load("ledger-v1.json")
    # ``kind``: preflight stages' own; the SLURM job's fields, the resolved settings, the lease, the cooldown branch,
    # the forecast, anytime mode's decisions and the start-up's split are written since; an old record reads as
    # outside SLURM, with no settings recorded, as a session that held no lease of the run, of the main run, that
    # forecast nothing, made no anytime decision and measured its start-up whole.
    assert LedgerRecord.from_json(raw).to_json() == {**raw, "kind": None, "slurm_job": None, "slurm_array_task": None,
                                                     "slurm_restarts": None, "requeued": False, "settings": {},
                                                     "epoch": None, "took_over": None, "branch": None,
                                                     "forecast": None, "anytime": [], "startup": None}
    raw = _load("eval-v1.json")
    ev = EvalRecord.from_json(raw)
    assert ev is not None and ev.to_json() == raw


def test_a_state_with_hub_commits_round_trips_and_one_without_records_none():
    raw = _load("state-v1.json")
    assert "hub" not in raw["data"] and CheckpointState.from_json(raw, "s").data.hub is None
    pinned = {**raw, "data": {**raw["data"], "hub": [None, "owner/corpus@" + "ab" * 20]}}
    state = CheckpointState.from_json(pinned, "s")
    assert state.data.hub == (None, "owner/corpus@" + "ab" * 20)
    assert state.to_json() == {k: v for k, v in pinned.items() if k != "scheduler"}


def test_the_state_file_reader_names_the_wrong_value(tmp_path):
    good = _load("state-v1.json")
    cases = {
        "step is not a count": ("step", "8"),
        "cursor.skipped is not a list of ranges": ("cursor", {**good["cursor"], "skipped": [[1]]}),
        "stats.rollbacks is not a list of rollback records": ("stats", {"rollbacks": [{"skip": "x"}]}),
        "parent is not a lineage": ("parent", {"step": "4"}),
        "config is not a table": ("config", {"model": 3}),
        "rng.ranks is not a list of tables": ("rng", {"ranks": []}),
        "data.hub is not a list of owner/name@commit": ("data", {**good["data"], "hub": ["owner/name", None]}),
    }
    for why, (key, value) in cases.items():
        bad = {**copy.deepcopy(good), key: value}
        (tmp_path / "state.json").write_text(json.dumps(bad))
        with pytest.raises(ResumeError) as e:
            read_state(tmp_path)
        assert why in str(e.value) and "\n" not in str(e.value) and "resume from an earlier checkpoint" in str(e.value)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["step", "path", "files", "cursor", "verified", "final", "val_loss", "run"]),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=8), st.floats(allow_nan=True),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                             max_size=2)))
def test_a_pointer_with_any_wrong_value_is_refused_in_one_line(key, value):
    raw = _load("pointer-v1-complete.json")
    if raw.get(key) == value or (key in ("final", "val_loss") and value is None):
        return  # the pointer as written, or an optional value left out: nothing wrong
    try:
        p = Pointer.from_json({**raw, key: value}, "test", "latest.json")
    except ResumeError as e:
        assert "\n" not in str(e) and "pointer latest.json" in str(e)
        return
    # Accepted only where the value is a valid one of its kind.
    if key == "cursor":  # a table whose values its reader checks (data.reader.Cursor), naming no other step
        assert isinstance(value, dict) and value.get("step", 8) == 8 and p.cursor == value
        return
    assert key == "val_loss" and isinstance(value, (int, float)) and not isinstance(value, bool)
    assert p.val_loss == value or math.isnan(value)


def test_a_checkpoint_folder_name_has_one_parser():
    assert [parse_step(n) for n in ("step-4", "ckpt/step-12", "step-", "step-4.partial", "x/step-4", "step-04x")] \
        == [4, 12, None, None, None, None]
    assert [parse_step(n, tail=True) for n in ("step-4.partial", "step-7-node1", "step-7-node1.partial", "step-x")] \
        == [4, 7, 7, None]
    assert parse_step(ckpt_path(31)) == 31


def test_stats_from_an_earlier_version_drop_counters_no_longer_kept():
    s = Stats.from_json({"nonfinite_skips": 2, "checkpoints": [{"step": 1}], "rollbacks": []})
    assert s.nonfinite_skips == 2 and "checkpoints" not in s.to_json()


def test_the_trackers_record_of_an_earlier_version_loads_and_round_trips():
    from baton.tracking.trackers import TrackerState

    raw = _load("trackers-v1.json")
    state = TrackerState.from_json(raw)
    assert state.complete_step == 8 and state.runs == {} and state.to_json() == raw
    with_run = {**raw, "mlflow": {"run_id": "abc", "logged_to": 6}}
    assert TrackerState.from_json(with_run).to_json() == with_run
    for bad in ({**raw, "mlflow": {"logged_to": "6"}}, {**raw, "complete_step": "8"}, {"format": "x"}):
        with pytest.raises(ValueError):
            TrackerState.from_json(bad)
