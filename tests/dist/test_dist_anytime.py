"""Anytime mode on two ranks: rank 0 decides, every rank trains to the horizon it decided."""

from __future__ import annotations

import json

from support.distrun import ACCUM2

# A cap no forecast fits: the first decision with a measured rate (the checkpoint at step 4, the session's own
# rate) shortens the horizon to the shortest whose cooldown begins there, 5 steps (decay from step 4 of 5),
# whatever this machine's speed.
ANYTIME = ("--set", "budget.anytime=true", "--set", "budget.cap_hours=0.000001", "--set", "budget.session_hours=1",
           "--set", "train.ckpt_every=4")


def test_two_ranks_train_to_the_horizon_rank_0_decided(runs):
    r = runs.train("anytime2", "--nproc", "2", *ACCUM2, *ANYTIME)
    assert r.pointer["step"] == 5 and r.pointer["complete"]
    for rank in (0, 1):
        assert "TRAIN DONE step=5/5 " in r.log(rank)
    assert "anytime: at step 4 the 20-step horizon no longer fits budget.cap_hours = 1e-06 at P90" in r.log(0)
    (record,) = [json.loads(p.read_text()) for p in (r.store / "test" / "ledger").glob("*.json")]
    assert [(e["step"], e["action"], e["horizon_to"]) for e in record["anytime"]] == [(4, "shortened", 5)]
    assert [m["step"] for m in r.metrics] == [1, 2, 3, 4, 5] and r.summary["total_steps"] == 5
