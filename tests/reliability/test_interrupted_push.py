"""A session killed after saving a checkpoint and before the store verified it: the next session on the same
machine finishes that push (upload, verify, pointer) and resumes from it, instead of training its steps
again. Only a checkpoint that continues the pointer's line of work and fits the config is pushed."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from baton.faults import PAUSE_ENV, TRACE_ENV

ARGS = ["--no-progress", "--set", "train.steps=8", "--set", "train.ckpt_every=2"]


def _kill_at_pointer(zygote, cfg: Path, tmp_path: Path, step: int) -> None:
    """Train on, and SIGKILL the session when checkpoint ``step`` is saved, uploaded and verified but the
    pointer not yet written."""
    trace = tmp_path / f"trace-{step}"
    child = zygote.spawn(["train", "-c", cfg, *ARGS], tmp_path / "out",
                         env={TRACE_ENV: str(trace), PAUSE_ENV: "pointer=30"})
    deadline = time.monotonic() + 120
    while not (trace.is_file() and f"pointer {step} " in trace.read_text()):
        assert child.alive() and time.monotonic() < deadline, child.wait(5).stderr[-3000:]
        time.sleep(0.01)
    child.kill()
    assert child.wait(30).returncode == -9


def _killed_before_the_pointer(zygote, cfg: Path, tmp_path: Path) -> None:
    """A verified checkpoint at step 2; then a session killed before its pointer to step 4."""
    first = zygote.run(["train", "-c", cfg, *ARGS, "--stop-after-steps", "2"], tmp_path / "out")
    assert first.returncode == 0, first.stderr[-3000:]
    _kill_at_pointer(zygote, cfg, tmp_path, 4)


def _final(store: Path, run: str) -> dict[str, torch.Tensor]:
    p = json.loads((store / run / "latest.json").read_text())
    assert p["complete"], p
    return load_file(store / run / p["path"] / "model.safetensors")


def test_the_next_session_finishes_the_push_and_loses_no_step(zygote, make_config, tmp_path):
    store, runs = tmp_path / "store", tmp_path / "runs"
    ref = zygote.run(["train", "-c", make_config("ref.toml", run_name="ref"), *ARGS], tmp_path / "out")
    assert ref.returncode == 0, ref.stderr[-3000:]

    cfg = make_config()
    _killed_before_the_pointer(zygote, cfg, tmp_path)
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 2
    saved = (runs / "test" / "ckpt" / "step-4" / "model.safetensors").stat().st_ino

    again = zygote.run(["train", "-c", cfg, *ARGS], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint step 4 was saved on this disk by a session that ended before the store verified it" \
        in again.stderr
    assert "resumed at step 4" in again.stderr
    # Loaded from the very files just verified, not downloaded again.
    assert (runs / "test" / "resume" / "step-4" / "model.safetensors").stat().st_ino == saved
    assert not (runs / "test" / "ckpt" / "step-4").exists()
    steps = [json.loads(line)["step"] for line in (runs / "test" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    a, b = _final(store, "ref"), _final(store, "test")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_kill_right_after_the_finished_push_leaves_one_pulled_checkpoint(zygote, make_config, tmp_path):
    """The killed session's own pull (step 2, which it resumed from) goes before the finished push's folder
    moves in: a kill at that moment leaves one pulled checkpoint on disk, not two."""
    store, runs = tmp_path / "store", tmp_path / "runs"
    cfg = make_config()
    _killed_before_the_pointer(zygote, cfg, tmp_path)
    assert sorted(d.name for d in (runs / "test" / "resume").iterdir()) == ["step-2"]

    trace = tmp_path / "trace-moved"
    child = zygote.spawn(["train", "-c", cfg, *ARGS], tmp_path / "out",
                         env={TRACE_ENV: str(trace), PAUSE_ENV: "resume.moved=60"})
    deadline = time.monotonic() + 120
    while not (trace.is_file() and "resume.moved 4 " in trace.read_text()):
        assert child.alive() and time.monotonic() < deadline, child.wait(5).stderr[-3000:]
        time.sleep(0.01)
    child.kill()
    assert child.wait(30).returncode == -9
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 4
    assert sorted(d.name for d in (runs / "test" / "resume").iterdir()) == ["step-4"]


@pytest.mark.parametrize("damage", ["other parent", "no config", "not json"])
def test_a_local_checkpoint_off_the_pointers_line_or_unreadable_is_left_alone(damage, zygote, make_config,
                                                                              tmp_path):
    store, runs = tmp_path / "store", tmp_path / "runs"
    cfg = make_config()
    _killed_before_the_pointer(zygote, cfg, tmp_path)
    state = runs / "test" / "ckpt" / "step-4" / "state.json"
    st = json.loads(state.read_text())
    if damage == "other parent":  # as if another session had moved the run on
        st["parent"]["model_sha256"] = "0" * 64
    elif damage == "no config":
        del st["config"]["model"]
    state.write_text(json.dumps(st) if damage != "not json" else "{half a state")

    again = zygote.run(["train", "-c", cfg, *ARGS, "--stop-after-steps", "3"], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert ("does not continue the store's step 2" if damage == "other parent" else "not pushing") in again.stderr
    assert "resumed at step 2" in again.stderr
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 3
    assert state.is_file()  # left alone, not deleted either: it is not ours to judge


def test_a_local_checkpoint_that_does_not_fit_the_config_is_not_pushed(zygote, make_config, tmp_path):
    store, runs = tmp_path / "store", tmp_path / "runs"
    cfg = make_config()
    _killed_before_the_pointer(zygote, cfg, tmp_path)
    # The next session changes the shuffle seed: the local checkpoint is refused like any other drift, and
    # so is the pointer's, so the run stops with the drift error and the store is as it was.
    again = zygote.run(["train", "-c", cfg, *ARGS, "--set", "data.shuffle_seed=8"], tmp_path / "out")
    assert again.returncode == 2, again.stderr[-3000:]
    assert "not pushing" in again.stderr and "data.shuffle_seed" in again.stderr
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 2
    assert (runs / "test" / "ckpt" / "step-4" / "state.json").is_file()


def test_the_first_checkpoint_is_finished_too_while_the_store_knows_its_session(zygote, make_config, tmp_path):
    store = tmp_path / "store"
    cfg = make_config()
    _kill_at_pointer(zygote, cfg, tmp_path, 2)
    assert not (store / "test" / "latest.json").exists()
    again = zygote.run(["train", "-c", cfg, *ARGS, "--stop-after-steps", "3"], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint step 2 was saved on this disk" in again.stderr and "resumed at step 2" in again.stderr


def test_a_run_deleted_from_the_store_starts_afresh_despite_a_local_checkpoint(zygote, make_config, tmp_path):
    store = tmp_path / "store"
    cfg = make_config()
    _kill_at_pointer(zygote, cfg, tmp_path, 2)
    shutil.rmtree(store / "test")  # the user deleted the run to start it again: no ledger, no pointer
    again = zygote.run(["train", "-c", cfg, *ARGS, "--stop-after-steps", "3"], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "does not continue the store's run, which has no checkpoint" in again.stderr
    assert "starting run 'test' at step 0" in again.stderr
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 3
