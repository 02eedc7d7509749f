"""Two "nodes" on one machine: two `baton train --nnodes 2 --nproc 1` launchers meeting at a c10d rendezvous.

It is the multi-node path exactly as on a cluster (each launcher starts its own torchrun agent, the
agents rendezvous, ranks are assigned across them) with both nodes on 127.0.0.1 and sharing one folder.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from distrun import ROOT, assert_exact_trace, rank_env
from helpers import read_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_by_rendezvous_train_like_two_local_ranks(runs, ref2):
    base, cfg, store = runs.new("two-nodes")
    endpoint = f"127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "-m", "baton.cli", "train", "--config", str(cfg), "--no-progress", "--nproc", "1",
           "--nnodes", "2", "--rdzv-endpoint", endpoint, "--stop-after-steps", "4"]
    nodes = [subprocess.Popen(cmd, cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        outs = [n.communicate(timeout=180) for n in nodes]
    finally:
        for n in nodes:
            if n.poll() is None:
                n.kill()
    for n, (out, err) in zip(nodes, outs):
        assert n.returncode == 0, out + err
        assert f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint {endpoint}" in err
    logs = base / "runs" / "test" / "logs"
    assert sorted(p.name for p in logs.glob("rank-*.log")) == ["rank-0.log", "rank-1.log"]
    # Two ranks are two ranks, however they were placed: the same numbers as the local 2-rank run.
    assert_exact_trace(read_metrics(base / "runs" / "test"), ref2.metrics[:4])
    assert json.loads((store / "test" / "latest.json").read_text())["step"] == 4
