"""Rank 0's store work outside the step's collective: a publish (publish.every) that lasts far longer than
train.dist_timeout keeps the other rank waiting in the long object-group wait, not in the step's all-reduce,
so a slow upload or an lm-eval task does not kill a multi-GPU run."""

from __future__ import annotations

import re

from baton.faults import PAUSE_ENV


def test_a_publish_slower_than_the_collective_timeout_does_not_stop_the_other_rank(runs):
    # The revision of step 2 pauses 12 s on rank 0 before its model card; a step's collective gives up after 4 s.
    run = runs.train("slow-publish", "--nproc", "2", "--set", "train.steps=4", "--set", "train.ckpt_every=2",
                     "--set", "train.dist_timeout=4", "--set", f"publish.url={runs.root / 'slow-publish' / 'pub'}",
                     "--set", "publish.every=2", env={PAUSE_ENV: "publish.card@2=12"}, expect_ok=False)
    assert run.proc.returncode == 0, run.output[-4000:]
    assert run.pointer["complete"] and run.pointer["step"] == 4
    assert (runs.root / "slow-publish" / "pub" / "step-2" / "README.md").is_file()  # the revision, published
    for r in (0, 1):
        assert re.search(rf"EXIT rank={r} status=0$", run.log(r), re.M)
