"""Loss-spike rollback through the data: garbage written over the windows one step reads makes the loss
spike; under spike_policy = "rollback" the run goes back to the checkpoint before it, skips that stream
range and finishes. Killed (SIGKILL) before the spike, during the rollback and after it, then resumed, it
ends bit-identical to the uninterrupted run, with the skipped range in metrics.jsonl, state.json and
`baton status`."""

from __future__ import annotations

import json
import random
import time

import pytest

from support.helpers import assert_tensors_equal, store_checkpoint_tensors
from support.spiked_corpus import spiked_corpus

GB = 8  # the test config's global batch
SPIKE_STEP = 17  # its update (0-based 16) reads stream samples [128, 136), the garbage
GARBAGE = range((SPIKE_STEP - 1) * GB, SPIKE_STEP * GB)
SETTINGS = ["train.steps=30", "train.ckpt_every=5", "train.spike_policy=rollback", "train.spike_window=8",
            "train.log_every=50"]
TIMING = ("tokens_per_s", "step_seconds", "mfu")


@pytest.fixture
def spiked(prepared_data, make_config, tmp_path, zygote):
    """train(run, *settings, env=None, wait=True) on the spiked corpus, and the store."""
    corpus = tmp_path / "spiked"
    spiked_corpus(prepared_data, corpus, GARBAGE, seq_len=32, shuffle_seed=7, val_windows=16)
    cfg = make_config()

    def train(name: str, *settings: str, env: dict | None = None, wait: bool = True, cmd: str = "train"):
        sets = [a for s in (*SETTINGS, f"data.dir={corpus}", f"run.name={name}", *settings) for a in ("--set", s)]
        argv = [cmd, "-c", cfg, *sets, *(["--no-progress"] if cmd == "train" else [])]
        if wait:
            return zygote.run(argv, tmp_path / "out", timeout=300)
        return zygote.spawn(argv, tmp_path / "out", env=env)

    return train, tmp_path / "store", tmp_path / "runs"


def _rows(run_dir) -> list[dict]:
    """metrics.jsonl as far as it is readable now (a line being written is left for the next look)."""
    rows = []
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def _kill_when(child, ready, what: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert child.alive(), f"the run ended before {what}:\n{child.stderr_text()[-3000:]}"
        assert time.time() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)
    child.kill()
    assert child.wait(60).returncode == -9


def _trace(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in _rows(run_dir)]


def test_rollback_skips_the_garbage_and_resumes_exactly_when_killed(spiked, tmp_path):
    train, store, runs = spiked
    a = train("a")
    assert a.returncode == 0, a.stderr[-3000:]
    assert "loss spike: loss" in a.stderr and f"at step {SPIKE_STEP}" in a.stderr
    trace_a = _trace(runs / "a")
    (event,) = [r for r in trace_a if r.get("event") == "rollback"]
    assert event["step"] == event["to_step"] == 15 and event["spike_step"] == SPIKE_STEP
    assert event["skip"] == [GARBAGE.start, GARBAGE.stop] and event["skipped_ranges"] == [[128, 136]]
    steps = [r["step"] for r in trace_a if "event" not in r]
    assert steps == [*range(1, 16), *range(16, 31)]  # the spiking step's row went with its lost work
    assert not any("spike_score" in r for r in trace_a)  # after the skip, nothing spikes
    # The session started at step 0: the rollback's reload does not make the summary (or a requeue) say otherwise.
    assert json.loads((runs / "a" / "run_summary.json").read_text())["resumed_from_step"] is None

    rng = random.Random()
    k1, k3 = rng.randint(6, 12), rng.randint(18, 26)
    point = rng.choice(["rollback", "rollback.loaded"])
    where = f"(kills at step {k1}, at the '{point}' point, at step {k3})"
    slow = {"BATON_FAULT_PAUSE": "step=0.05"}

    # 1: before the spike.
    b = train("b", env=slow, wait=False)
    _kill_when(b, lambda: any(r.get("step", 0) >= k1 for r in _rows(runs / "b")), f"step {k1} {where}")
    # 2: inside the rollback, held at one of its points while it is killed.
    trace = tmp_path / "faults.trace"
    b = train("b", env={"BATON_FAULT_PAUSE": f"step=0.02,{point}=120", "BATON_FAULT_TRACE": str(trace)}, wait=False)
    _kill_when(b, lambda: trace.exists() and any(line.split()[0] == point for line in trace.read_text().splitlines()),
               f"the {point} point {where}")
    assert store_checkpoint_tensors(store, "b")[2]["step"] == 15, where
    # 3: after the rollback, on the new line of work.
    b = train("b", env=slow, wait=False)

    def past_rollback() -> bool:
        rows = _rows(runs / "b")
        i = next((i for i, r in enumerate(rows) if r.get("event") == "rollback"), None)
        return i is not None and any(r.get("step", 0) >= k3 for r in rows[i:])

    _kill_when(b, past_rollback, f"step {k3} after the rollback {where}")
    last = train("b")
    assert last.returncode == 0, last.stderr[-3000:]

    model_a, optim_a, pa = store_checkpoint_tensors(store, "a")
    model_b, optim_b, pb = store_checkpoint_tensors(store, "b")
    assert pa["step"] == pb["step"] == 30 and pa["complete"] and pb["complete"]
    assert_tensors_equal(model_a, model_b)
    assert_tensors_equal(optim_a, optim_b)
    assert _trace(runs / "b") == trace_a, where  # exact floats, the rollback row included
    assert pa["cursor"]["skipped"] == pb["cursor"]["skipped"] == [[128, 136]]
    state = json.loads((store / "b" / pb["path"] / "state.json").read_text())
    assert state["cursor"]["skipped"] == [[128, 136]]
    (rec,) = state["stats"]["rollbacks"]
    assert rec == {k: event[k] for k in rec} and rec["skip"] == [128, 136]

    status = train("b", cmd="status")
    assert status.returncode == 0, status.stderr[-2000:]
    assert "skipped after loss spikes: 1 stream range(s) [128, 136), 8 windows" in status.stdout


def test_stop_policy_and_the_rollback_cap_end_the_run_with_the_reason(spiked):
    train, store, _ = spiked
    r = train("stop", "train.spike_policy=stop")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (err,) = [line for line in r.stderr.splitlines() if line.startswith("baton: error:")]
    assert f"at step {SPIKE_STEP} is" in err and "train.spike_policy='stop' ended the run" in err
    assert "The pointer names step 15" in err
    assert store_checkpoint_tensors(store, "stop")[2]["step"] == 15

    r = train("cap", "train.max_rollbacks=0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (err,) = [line for line in r.stderr.splitlines() if line.startswith("baton: error:")]
    assert "a rollback would be number 1, over train.max_rollbacks=0, so the run stops" in err


def test_a_spike_before_any_checkpoint_is_logged_and_the_run_goes_on(spiked):
    train, store, runs = spiked
    r = train("early", "train.ckpt_every=0", "train.steps=20")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"cannot roll back from the spike at step {SPIKE_STEP}: this run has no verified checkpoint before it"
            in r.stderr)
    rows = _rows(runs / "early")
    assert [r["step"] for r in rows] == list(range(1, 21)) and "spike_score" in rows[SPIKE_STEP - 1]
    assert store_checkpoint_tensors(store, "early")[2]["cursor"]["skipped"] == []
