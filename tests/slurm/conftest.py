"""One real SLURM cluster for every SLURM test (``slurm_cluster``), installed where it is absent.

On a machine without SLURM the packages are installed with apt-get when the tests run as root (CI's fresh
Debian machines); elsewhere these tests are skipped, saying why. The jobs are checked by one test
(test_slurm_jobs.py), so under pytest-xdist one cluster runs them: the controller's, started as the suite starts
(support/slurm_jobs.py), which a worker's fixture attaches to; run without xdist, the fixture starts one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.slurm_cluster import SlurmCluster
from support.slurm_jobs import CAMPAIGN_ENV, campaign_jobs, cluster_unavailable


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    if CAMPAIGN_ENV in os.environ:  # the controller's cluster, running its jobs already: attached, not owned
        jobs = campaign_jobs(Path(os.environ[CAMPAIGN_ENV]))
        if isinstance(jobs, str):
            pytest.skip(f"no SLURM cluster for these tests: {jobs}")
        yield jobs.cluster
        return
    why = cluster_unavailable()
    if why:
        pytest.skip(f"no SLURM cluster for these tests: {why}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()
