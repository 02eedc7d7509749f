"""Two ranks over gloo: same losses as one rank, exact resume, and resume on a different number of ranks.

Tolerance: runs with the same number of ranks must agree bit for bit. Runs with a different number of
ranks sum gradients in a different order (all-reduce of two halves vs. accumulation of two micro-batches)
so their losses may differ in the last float32 bits; over this 20-step run we allow 1e-5 absolute on the
loss and 1e-5 relative on the gradient norm (measured differences are around 3e-7). The samples read must
still be exactly the same in every step: ``batch_sha`` is compared exactly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from baton.faults import PAUSE_ENV, TRACE_ENV
from support.kills import kill_tree
from support.distrun import (ACCUM2, GLOBAL_BATCH, ROOT, Run, assert_close_trace, assert_complete_and_verified,
                     assert_exact_trace, baton_train, expected_batch_shas, rank_env)
from support.helpers import assert_tensors_equal, store_checkpoint_tensors


def test_two_ranks_match_one_rank(ref2, ref1, prepared_data):
    assert ref2.summary["world_size"] == 2 and ref1.summary["world_size"] == 1
    m2, m1 = ref2.metrics, ref1.metrics
    assert len(m2) == 20
    assert_close_trace(m2, m1)
    assert [r["batch_sha"] for r in m2] == expected_batch_shas(prepared_data, 20)
    assert m2[-1]["samples_consumed"] == 20 * GLOBAL_BATCH  # global, not per rank
    assert_complete_and_verified(ref2)
    assert_complete_and_verified(ref1)
    # The launcher ran torchrun (through baton's agent) with the training module, not a script path.
    assert re.search(r"baton\.runtime\.agent .*-m baton\.cli train ", ref2.output)


def test_every_rank_logs_and_peak_memory_is_the_max_over_ranks(ref2):
    peaks = {}
    for rank in (0, 1):
        text = ref2.log(rank)
        assert f"[rank {rank}]" in text
        assert re.search(rf"EXIT rank={rank} status=0$", text, re.M)
        m = re.search(rf"PEAK rank={rank} train_bytes=(\d+) eval_bytes=(\d+)", text)
        peaks[rank] = (int(m.group(1)), int(m.group(2)))
    s = ref2.summary
    assert s["peak_memory_train_bytes"] == max(p[0] for p in peaks.values()) > 0
    assert s["peak_memory_eval_bytes"] == max(p[1] for p in peaks.values()) > 0
    # Validation is split over the ranks and summed: every held-out window counted once.
    assert ref2.pointer["val_windows"] == 16


def test_two_ranks_stopped_wiped_and_resumed_equal_uninterrupted(runs, ref2, stop2):
    # stop2 is a 2-rank run made by two single-process nodes (test_dist_multinode.py); it resumes here on
    # one machine with --nproc 2.
    assert stop2.pointer["step"] == 10
    # A new folder with only the store copied: nothing local survives the "wipe".
    resumed = runs.train("resume2", "--nproc", "2", *ACCUM2, store_from=stop2.store)
    assert "resumed at step 10" in resumed.log(0) and "resumed at step 10" in resumed.log(1)
    assert_exact_trace(resumed.metrics, ref2.metrics)
    m_a, o_a, p_a = store_checkpoint_tensors(resumed.store, "test")
    m_b, o_b, p_b = store_checkpoint_tensors(ref2.store, "test")
    assert p_a["step"] == p_b["step"] == 20
    assert_tensors_equal(m_a, m_b)
    assert_tensors_equal(o_a, o_b)
    assert_complete_and_verified(resumed)


def test_checkpoint_from_two_ranks_resumes_on_one(runs, ref2, stop2):
    one = runs.train("resume-2to1", store_from=stop2.store)
    assert "checkpoint was written by 2 ranks, this run has 1" in one.log(0)
    assert "accumulation is now 2 micro-batches per rank" in one.log(0)
    assert_close_trace(one.metrics, ref2.metrics)
    assert_complete_and_verified(one)


def test_checkpoint_from_one_rank_resumes_on_two(runs, ref1, ref2):
    first = runs.train("stop1", "--stop-after-steps", "10")
    assert_exact_trace(first.metrics, ref1.metrics[:10])
    two = runs.train("resume-1to2", "--nproc", "2", store_from=first.store)
    for rank in (0, 1):
        assert "checkpoint was written by 1 ranks, this run has 2" in two.log(rank)
    assert_close_trace(two.metrics, ref1.metrics)
    assert_close_trace(two.metrics, ref2.metrics)
    assert_complete_and_verified(two)


def test_two_ranks_killed_before_the_pointer_finish_that_push_and_end_equal(runs, ref2):
    """SIGKILL to the launcher, torchrun and both ranks while rank 0 holds a verified upload of step 8 but
    has not written the pointer; the next 2-rank session pushes that checkpoint, resumes there, and ends
    equal to the uninterrupted run."""
    base, cfg, store = runs.new("killed-at-pointer")
    trace = base / "trace"
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", "train", "--config", str(cfg), "--no-progress",
                             "--nproc", "2", *ACCUM2, "--stop-after-steps", "8"], cwd=ROOT,
                            env=rank_env({TRACE_ENV: str(trace), PAUSE_ENV: "pointer=60"}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (trace.is_file() and "pointer 8 " in trace.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the session ended before its pointer"
            time.sleep(0.05)
    finally:
        kill_tree(proc.pid)  # the launcher, torchrun's agent and both ranks (each in a session of its own)
        proc.wait(30)
    assert not (store / "test" / "latest.json").exists()

    p = baton_train(cfg, "--nproc", "2", *ACCUM2)
    resumed = Run(base, cfg, store, base / "runs" / "test", p, 0.0)
    assert p.returncode == 0, resumed.output
    assert "checkpoint step 8 was saved on this disk" in resumed.log(0)
    assert "resumed at step 8" in resumed.log(0) and "resumed at step 8" in resumed.log(1)
    assert_exact_trace(resumed.metrics, ref2.metrics)
    m_a, o_a, _ = store_checkpoint_tensors(store, "test")
    m_b, o_b, _ = store_checkpoint_tensors(ref2.store, "test")
    assert_tensors_equal(m_a, m_b)
    assert_tensors_equal(o_a, o_b)
    assert_complete_and_verified(resumed)
