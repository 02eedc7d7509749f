"""One real SLURM cluster for every SLURM test (``slurm_cluster``), installed where it is absent.

On a machine without SLURM the packages are installed with apt-get when the tests run as root (CI's fresh
Debian machines); elsewhere these tests are skipped, saying why. The jobs are checked by one test
(test_slurm_jobs.py), so under pytest-xdist one worker starts the cluster, once.
"""

from __future__ import annotations

import os

import pytest

from support.slurm_cluster import SlurmCluster, install


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = install() or (None if os.geteuid() == 0 else "the test cluster's slurmd and slurmctld run as root")
    if why:
        pytest.skip(f"no SLURM cluster for these tests: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()
