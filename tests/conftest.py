"""Shared fixtures: a small prepared corpus (made once per session) and configs that point into tmp dirs.

The corpus is real: the first few hundred KB of the running Python's standard library, tokenized by a
freshly trained byte-level BPE, written by `baton prepare` like any user's data.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.helpers import write_config

ROOT = Path(__file__).resolve().parent.parent
# Variables that torch, transformers or huggingface_hub read once, at import: a zygote imported them already,
# so a command that sets one differently from the zygote's environment starts a fresh interpreter.
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_", "OMP_", "MKL_")
# A suite run inside a SLURM job must not train as that job's sessions (its end time as their budget, a requeue
# of the job after a test's stop): the SLURM tests start a cluster of their own and set what their jobs need.
for _name in [k for k in os.environ if k.startswith("SLURM_")]:
    del os.environ[_name]
# Two workers share two cores, and each torch process runs a thread per core: an OpenMP thread that spins while it
# waits for work takes the core from the process beside it. Waiting threads sleep instead (a user's setting stays).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The test Hub serves the classic LFS path, and huggingface_hub reads this switch at import: set for every test,
# so a test's commands and the zygote's agree on it.
os.environ["HF_HUB_DISABLE_XET"] = "1"
# Importing transformers' Llama sets TORCHINDUCTOR_CACHE_DIR (torch's inductor does, at import): imported before
# the environment is captured, or every test's environment would differ from the zygote's in a READ_AT_IMPORT
# variable and each command would pay a fresh interpreter.
import transformers.models.llama.modeling_llama  # noqa: E402,F401  (isort: after the variable above)

# The environment the tests started in, before any test's monkeypatch: the zygote's, whichever test starts it.
START_ENV = dict(os.environ)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test ends with the environment it started with, whatever it or a library it imported set (lm_eval's
    import sets HF_XET_HIGH_PERFORMANCE). A READ_AT_IMPORT variable left behind would make every later command on
    that worker start a fresh interpreter instead of forking the zygote."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


_CAMPAIGN = None


def pytest_sessionstart(session):
    """Under pytest-xdist, the controller submits the SLURM tests' jobs as the suite starts (support/slurm_jobs.py):
    minutes of jobs that mostly wait then run beside the other tests, not on a worker that waits for them."""
    global _CAMPAIGN
    from support.slurm_jobs import Campaign

    if Campaign.wanted(session.config):
        _CAMPAIGN = Campaign(session.config._tmp_path_factory.mktemp("slurm-campaign"))
        _CAMPAIGN.start()


def pytest_xdist_node_collection_finished(node, ids):
    if _CAMPAIGN is not None:
        _CAMPAIGN.workers_started()


def pytest_sessionfinish(session):
    if _CAMPAIGN is not None:
        _CAMPAIGN.stop()


def pytest_addoption(parser):
    parser.addoption("--compat", action="store_true",
                     help="run the tests marked compat too (the commands on other library versions, tests/compat): "
                          "they build virtual environments, so the default run leaves them out")


def pytest_collection_modifyitems(config, items):
    """The slow end-to-end tests first: spread over workers (pytest-xdist), they then run beside the rest
    instead of after it. The check of jobs submitted at the start (pytest_sessionstart) goes last instead: its
    jobs run meanwhile. A stable sort, so the order is otherwise the collection order on every worker.
    The compat tests run only when asked for (--compat), and then first of all: building their environments
    mostly waits on downloads and disks, which the other tests' computing fills."""
    from support.slurm_jobs import CAMPAIGN_ENV

    compat = config.getoption("--compat")
    keep = [i for i in items if compat or not i.get_closest_marker("compat")]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep

    early = CAMPAIGN_ENV in os.environ

    def rank(item) -> int:
        if early and item.get_closest_marker("slurm"):
            return 2
        if item.get_closest_marker("compat"):
            return -1
        return 0 if item.get_closest_marker("slow") else 1

    items.sort(key=rank)


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """A prepared data folder shared by every test (read-only by convention)."""
    base = tmp_path_factory.mktemp("data")
    cfg = write_config(base / "prep.toml", data_dir=base / "corpus", store=base / "store", runs=base / "runs")
    from baton.config import load_config
    from baton.data.prepare import prepare

    prepare(load_config(cfg), progress=False)
    return base / "corpus"


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """The local Hub (support/store_hub_server.py) of the store and the data tests."""
    from support.store_hub_server import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub-data")).start()
    yield server
    server.stop()


@pytest.fixture
def make_config(tmp_path, prepared_data):
    """make_config(name, store, run_name) -> path of a TOML config using the shared data, a tmp store and tmp runs."""

    def make(name: str = "cfg.toml", store: str | Path | None = None, run_name: str = "test") -> Path:
        return write_config(tmp_path / name, data_dir=prepared_data, store=store or tmp_path / "store",
                            runs=tmp_path / "runs", run_name=run_name)

    return make


@pytest.fixture(scope="session")
def baton_cli(tmp_path_factory):
    """Run the real `baton` command in a process of its own; returns CompletedProcess.

    By default the process is forked from a pre-imported zygote (support/zygote.py, one per test process,
    started on first use): the CLI's own code with this test's environment and working folder, without paying
    the torch and transformers imports again. ``fresh=True`` starts `python -m baton.cli` from scratch instead,
    for what only a new interpreter shows (the entry point itself, a clock that starts before Python imports
    anything, a hash seed of its own). ``baton_cli.start(...)`` takes the same arguments and returns the running
    process (``poll``, ``send_signal``, ``kill``, ``wait``, ``stderr_text``), for a test that signals or kills it."""
    from support.zygote import FreshChild, Zygote

    zygotes: list[Zygote] = []

    def start(*args: str, cwd: Path | None = None, env: dict | None = None, fresh: bool = False):
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if not fresh and not zygotes:
            zygotes.append(Zygote(env=START_ENV, unset=tuple(k for k in os.environ if k not in START_ENV)))
        zygote = None if fresh else zygotes[0]
        if zygote is not None and any(full_env.get(k) != zygote.env.get(k) for k in {*full_env, *zygote.env}
                                      if k.startswith(READ_AT_IMPORT)):
            zygote = None
        if zygote is not None:
            return zygote.spawn(list(args), tmp_path_factory.mktemp("cli-out"), env=full_env, cwd=cwd or ROOT,
                                replace_env=True)
        run.fresh_starts += 1  # type: ignore[attr-defined]
        out = tmp_path_factory.mktemp("cli-out")
        return FreshChild(list(args), out / "fresh.out", out / "fresh.err", full_env, cwd or ROOT)

    def run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600, check: bool = False,
            fresh: bool = False):
        r = start(*args, cwd=cwd, env=env, fresh=fresh).wait(timeout)
        p = subprocess.CompletedProcess(["baton", *args], r.returncode, r.stdout, r.stderr)
        if check and p.returncode != 0:
            raise AssertionError(f"baton {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    run.fresh_starts = 0  # type: ignore[attr-defined]  # commands that paid a new interpreter (tests/test_harness.py)
    run.start = start  # type: ignore[attr-defined]
    yield run
    for z in zygotes:
        z.close()
