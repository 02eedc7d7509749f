"""Real multi-process runs: `baton train --nproc 2` (torchrun, gloo on CPU), shared across the tests.

Every run here is a real launcher process starting torchrun and two worker processes, so each costs a few
seconds of process start-up. Runs that several tests compare against are session-scoped and made once.
"""

from __future__ import annotations

import pytest

from support.distrun import ACCUM2, Run, Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory, prepared_data) -> Runs:
    return Runs(tmp_path_factory.mktemp("dist"), prepared_data)


@pytest.fixture(scope="session")
def ref2(runs) -> Run:
    """The uninterrupted 2-rank run of the test config: 20 steps, global batch 8 = 2 ranks x 2 micro-batches
    of 2 (so each step has a micro-batch without gradient sync and one with)."""
    return runs.train("ref2", "--nproc", "2", *ACCUM2)


@pytest.fixture(scope="session")
def ref1(runs) -> Run:
    """The same run in one process: accumulation 2 keeps the global batch at 8."""
    return runs.train("ref1")


@pytest.fixture(scope="session")
def stop2_nodes(runs) -> list[Run]:
    """A 2-rank run stopped at step 10 with a verified checkpoint, made by two single-process "nodes" that
    meet at a c10d rendezvous (the multi-node path); one launcher's view per node."""
    return runs.train_nodes("stop2", 2, "--stop-after-steps", "10", *ACCUM2)


@pytest.fixture(scope="session")
def stop2(stop2_nodes) -> Run:
    """The run of ``stop2_nodes``; branch from it with store_from=stop2.store."""
    return stop2_nodes[0]
