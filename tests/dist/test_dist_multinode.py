"""Two "nodes" on one machine: two `baton train --nnodes 2 --nproc 1` launchers meeting at a c10d rendezvous.

It is the multi-node path exactly as on a cluster (each launcher starts its own torchrun agent, the agents
rendezvous, ranks are assigned across them) with both nodes on 127.0.0.1 and sharing one folder. The
same run (``stop2_nodes``) is the 2-rank checkpoint that the resume tests in test_dist_runs.py start from.
"""

from __future__ import annotations

from support.distrun import assert_exact_trace


def test_two_nodes_by_rendezvous_train_exactly_like_two_local_ranks(stop2_nodes, ref2):
    for node in stop2_nodes:
        assert "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" in node.proc.stderr
        assert "--standalone" not in node.proc.stderr
    run = stop2_nodes[0]
    logs = run.run_dir / "logs"
    assert sorted(p.name for p in logs.glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    # Two ranks are two ranks, however they were placed: the same numbers as the local 2-rank run.
    assert_exact_trace(run.metrics, ref2.metrics[:10])
    assert run.pointer["step"] == 10
    assert all(c["verified"] for c in run.summary["checkpoints"])
