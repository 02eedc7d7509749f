"""FSDP2 (``fully_shard``) on 2 CPU ranks over gloo: train, checkpoint, resume sharded and in one process.

torch 2.13's gloo backend carries FSDP2's all-gather and reduce-scatter on CPU, so this runs without a GPU.
FSDP reduces gradients with a reduce-scatter instead of DDP's all-reduce: same samples, same math, float
differences in the last bits, so the trace is compared with the DDP run within the DDP-vs-1-rank tolerance.
"""

from __future__ import annotations

from support.distrun import ACCUM2, assert_close_trace
from support.helpers import store_checkpoint_tensors

# Two micro-batches per rank: the first accumulates without reduce-scatter, the second reduces.
FSDP = ("--set", "train.parallel=fsdp", *ACCUM2)


def test_fsdp_trains_checkpoints_full_state_and_resumes_sharded_or_single(runs, ref2):
    first = runs.train("fsdp-stop", "--nproc", "2", *FSDP, "--stop-after-steps", "10")
    assert first.pointer["step"] == 10
    # The checkpoint is the full, unsharded state in the same format as a DDP run's.
    m_f, o_f, _ = store_checkpoint_tensors(first.store, "test")
    m_d, o_d, _ = store_checkpoint_tensors(ref2.store, "test")
    assert {k: (v.shape, v.dtype) for k, v in m_f.items()} == {k: (v.shape, v.dtype) for k, v in m_d.items()}
    assert {k: (v.shape, v.dtype) for k, v in o_f.items()} == {k: (v.shape, v.dtype) for k, v in o_d.items()}

    sharded = runs.train("fsdp-resume", "--nproc", "2", *FSDP, store_from=first.store)
    single = runs.train("fsdp-to-single", store_from=first.store)
    for run in (sharded, single):
        assert "resumed at step 10" in run.log(0)
        assert_close_trace(run.metrics, ref2.metrics)
        assert run.pointer["step"] == 20 and run.pointer["complete"] is True
        assert all(c["verified"] for c in run.summary["checkpoints"])
    # The final model was gathered and exported whole.
    assert (sharded.store / "test" / "final" / "model.safetensors").is_file()
