"""One answer to "which steps are verified": for a SIGKILL at every named moment of the checkpoint cycle and a
resume after it, `baton status`, `baton report`, `export --step` and `eval --step` agree on the verified
checkpoints, and that set is what the store itself proves (read here from its raw files, not through baton):
a checkpoint the pointer's verified list or a session's ledger record names, whose folder holds every file.

The kill that showed two answers: a background push rolled the pointer (``prune``), and the session died
before the next step boundary booked it in the ledger. The pointer's verified list names that step; the
ledger never will."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import baton
from baton.errors import BatonError
from baton.faults import PAUSE_ENV, POINTS, TRACE_ENV

ARGS = ["--no-progress", "--set", "train.steps=8", "--set", "train.ckpt_every=2"]
REQUIRED = ("model.safetensors", "optimizer.safetensors", "state.json")
# The points a training session passes, each with the step of the first kill aimed there (None: its first
# pass); ``resume.moved`` is passed only by a session finishing a push a killed one left. A kill at
# ``prune`` or ``pointer.readback`` of step 4 leaves step 4 in the pointer's verified list with no ledger
# record booking it, and the resumed session's checkpoint at 6 keeps it there (keep_last 2).
CYCLE = {"step": 3, "save": 4, "save.file": 4, "upload": None, "verify": None, "pointer": 4,
         "pointer.readback": 4, "prune": 4, "prune.delete": 2, "resume.moved": 4}
NOT_TRAINING = {"data.publish", "data.pull", "rollback", "rollback.loaded", "publish.card",  # other tests aim there
                "lease.written", "lease.acquired"}


def test_the_table_names_every_point_of_a_training_session():
    assert set(CYCLE) | NOT_TRAINING == set(POINTS)


def _kill_at(zygote, cfg: Path, tmp_path: Path, point: str, step: int | None, extra: list[str]) -> None:
    trace = tmp_path / f"trace-{point}"
    aim = f"{point}@{step}" if step is not None else point
    child = zygote.spawn(["train", "-c", cfg, *ARGS, *extra], tmp_path / "out",
                         env={TRACE_ENV: str(trace), PAUSE_ENV: f"{aim}=60"})
    want = f"{point} {step if step is not None else '-'} "
    deadline = time.monotonic() + 300
    while not (trace.is_file() and any(line.startswith(want) for line in trace.read_text().splitlines())):
        assert child.alive() and time.monotonic() < deadline, child.wait(5).stderr[-3000:]
        time.sleep(0.01)
    child.kill()
    assert child.wait(30).returncode == -9


def _proven(store: Path, run: str) -> set[int]:
    """What the store's own files say, without baton's code: named verified by the pointer or a ledger record,
    with every file of a checkpoint present."""
    named: set[int] = set()
    pointer = store / run / "latest.json"
    if pointer.is_file():
        p = json.loads(pointer.read_text())
        named |= {int(h.rsplit("-", 1)[1]) for h in p.get("verified", [])} | {p["step"]}
    for rec in (store / run / "ledger").glob("*.json"):
        named |= {c["step"] for c in json.loads(rec.read_text())["checkpoints"] if c["verified"]}
    whole = {int(d.name[5:]) for d in (store / run / "ckpt").glob("step-*")
             if all((d / f).is_file() for f in REQUIRED)}
    return named & whole


@pytest.mark.slow
@pytest.mark.parametrize("point", sorted(CYCLE))
def test_every_command_agrees_on_the_verified_checkpoints_after_a_kill(point, zygote, make_config, tmp_path):
    cfg = make_config()
    store = tmp_path / "store"
    if point == "resume.moved":  # a push left unfinished, then the session finishing it killed after the move
        _kill_at(zygote, cfg, tmp_path, "pointer", 4, [])
    _kill_at(zygote, cfg, tmp_path, point, CYCLE[point], [])
    again = zygote.run(["train", "-c", cfg, *ARGS, "--stop-after-steps", "6"], tmp_path / "out")
    assert again.returncode == 0, again.stderr[-3000:]

    c = baton.load_config(cfg)
    proven = _proven(store, "test")
    status = {r["step"] for r in baton.status(c)["checkpoints"] if r["verified"]}
    from baton.report.gather import gather

    reported = set(gather(c)["verified_steps"])
    folders = sorted(int(d.name[5:]) for d in (store / "test" / "ckpt").glob("step-*"))
    exported, evaluated = set(), set()
    for step in folders:
        try:
            baton.export(c, tmp_path / f"export-{step}", step=step)
            exported.add(step)
        except BatonError as e:
            assert f"step {step} is not a verified checkpoint" in str(e), e
        try:
            baton.eval(c, step=step, files=[], tasks=[])
            evaluated.add(step)
        except BatonError as e:
            assert f"step {step} is not a verified checkpoint" in str(e), e
    assert status == reported == exported == evaluated == proven, (point, status, reported, exported, proven)
    assert 6 in proven  # the resumed session's own checkpoint
    if point in ("prune", "pointer.readback"):  # verified by the pointer alone: no session booked it
        assert 4 in proven
