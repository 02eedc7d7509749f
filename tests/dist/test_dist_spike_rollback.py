"""A loss-spike rollback on 2 real ranks (torchrun, gloo): garbage written over the windows of one step
makes the all-reduced loss spike; every rank rolls back to the same verified checkpoint, skips the same
stream range, and the run finishes reading exactly the global order with that range stepped over."""

from __future__ import annotations

import json

from support.distrun import ACCUM2, expected_batch_shas
from support.spiked_corpus import spiked_corpus

GB = 8  # the test config's global batch
SPIKE_STEP = 17  # its update reads stream samples [128, 136), the garbage
GARBAGE = range((SPIKE_STEP - 1) * GB, SPIKE_STEP * GB)
STEPS = 20


def test_every_rank_rolls_back_to_the_same_step_and_skips_the_same_data(runs, prepared_data, tmp_path):
    corpus = tmp_path / "spiked"
    spiked_corpus(prepared_data, corpus, GARBAGE, seq_len=32, shuffle_seed=7, val_windows=16)
    run = runs.train("rollback2", "--nproc", "2", *ACCUM2, *(a for s in (
        f"data.dir={corpus}", f"train.steps={STEPS}", "train.ckpt_every=5", "train.spike_policy=rollback",
        "train.spike_window=8", "train.log_every=50") for a in ("--set", s)))

    said = "rollback 1: back to the verified checkpoint at step 15, skipping stream samples [128, 136) (8 windows)"
    for rank in (0, 1):
        assert said in run.log(rank), f"rank {rank} did not roll back with rank 0:\n{run.log(rank)[-3000:]}"
    rows = run.metrics
    (event,) = [r for r in rows if r.get("event") == "rollback"]
    assert event["to_step"] == 15 and event["spike_step"] == SPIKE_STEP and event["skipped_ranges"] == [[128, 136]]
    steps = [r for r in rows if "event" not in r]
    assert [r["step"] for r in steps] == [*range(1, 16), *range(16, STEPS + 1)]  # 16 and 17 were undone
    # batch_sha digests every rank's rows in global order: both ranks read exactly the order with the
    # garbage stepped over, from step 16 on [120, 128), then [136, 144), ...
    assert [r["batch_sha"] for r in steps] == expected_batch_shas(corpus, STEPS, ((128, 136),))
    assert not any("spike_score" in r for r in steps)

    pointer = run.pointer
    assert pointer["step"] == STEPS and pointer["complete"] and pointer["cursor"]["skipped"] == [[128, 136]]
    state = json.loads((run.store / "test" / pointer["path"] / "state.json").read_text())
    assert state["cursor"]["skipped"] == [[128, 136]] and state["stats"]["rollbacks"][0]["to_step"] == 15
