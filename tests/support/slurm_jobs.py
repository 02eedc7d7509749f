"""The SLURM tests' jobs: real sbatch jobs of the test config on the one-node cluster (support/slurm_cluster.py).

Each step of a job pauses a fixed time (``BATON_FAULT_PAUSE=step=S``, before the step runs), so a run lasts
longer than the job's time limit (two minutes) whatever the machine's speed: the sessions a job needs
vary with the machine, what the tests check does not.

Every job is submitted at once (``submit_all``) and they run side by side, as on a cluster; a thread sends the
outside signals when their jobs are mid-run. The jobs spend minutes mostly waiting, so a suite run under
pytest-xdist submits them from the controller as it starts (``Campaign``): they run while the workers run the
other tests, and the one test that checks them (tests/slurm/test_slurm_jobs.py, scheduled last) finds them done
or nearly. Run alone, the test's fixtures submit them and wait.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from support.helpers import read_metrics, write_config
from support.slurm_cluster import SlurmCluster, install

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 900  # a ceiling that catches a hang; a job here takes one to four minutes
# The controller's campaign for the workers: where its jobs' state is (a JSON file).
CAMPAIGN_ENV = "BATON_TEST_SLURM_CAMPAIGN"
# Short enough for a two-minute job: the session stops this long before the job's end time, plus the measured
# step and the checkpoint guess (a second or two for the test model).
BUDGET = """
[budget]
margin_minutes = 0.1
heartbeat_minutes = 0
"""

SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --time={time}
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={out}
#SBATCH --chdir={root}
exec {python} -m baton.cli train --config {cfg} --no-progress {args}
"""
EXAMPLES = ROOT / "examples" / "slurm"
# What an example asks and this machine cannot grant (GPUs, 16 cores): left out of the copy a job runs.
NOT_HERE = ("#SBATCH --gpus-per-node", "#SBATCH --cpus-per-task")


def make_config(base: Path, data: Path) -> Path:
    cfg = write_config(base / "cfg.toml", data_dir=data, store=base / "store", runs=base / "runs")
    cfg.write_text(cfg.read_text() + BUDGET)
    return cfg


def make_job(base: Path, data: Path, time: str = "1", args: str = "") -> Path:
    """A job script training the test config into ``base/store`` (config ``base/cfg.toml``)."""
    cfg = make_config(base, data)
    path = base / "job.sh"
    path.write_text(SCRIPT.format(name=base.name, time=time, out=base / "job.out", root=ROOT, python=sys.executable,
                                  cfg=cfg, args=args))
    return path


def example(name: str, base: Path) -> Path:
    """A copy of ``examples/slurm/<name>`` without what this machine cannot grant."""
    lines = (EXAMPLES / name).read_text().splitlines(keepends=True)
    path = base / name
    path.write_text("".join(line for line in lines if not line.startswith(NOT_HERE)))
    return path


def job_env(pause: float) -> dict[str, str]:
    # The examples call `baton`: this interpreter's, importing this checkout.
    return {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
            "BATON_FAULT_PAUSE": f"step={pause}", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_done(base: Path) -> int:
    metrics = base / "runs" / "test" / "metrics.jsonl"
    return len(read_metrics(metrics.parent)) if metrics.exists() else 0


class Jobs:
    """The jobs by name: their ids and run folders; the outside signals sent (``signalled``) and what went wrong
    sending them (``errors``), kept in ``root/signals.json`` so that another process can read them."""

    def __init__(self, cluster: SlurmCluster, root: Path, data: Path):
        self.cluster, self.root, self.data = cluster, root, data
        self.ids: dict[str, str] = {}
        self.bases: dict[str, Path] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ shared with other processes
    def save(self) -> Path:
        path = self.root / "jobs.json"
        path.write_text(json.dumps({"cluster": str(self.cluster.root), "data": str(self.data), "ids": self.ids,
                                    "bases": {k: str(v) for k, v in self.bases.items()}}))
        return path

    @classmethod
    def load(cls, path: Path) -> Jobs:
        doc = json.loads(path.read_text())
        jobs = cls(SlurmCluster(Path(doc["cluster"])), path.parent, Path(doc["data"]))
        jobs.ids, jobs.bases = doc["ids"], {k: Path(v) for k, v in doc["bases"].items()}
        return jobs

    def _signals(self) -> dict[str, dict[str, str]]:
        path = self.root / "signals.json"
        return json.loads(path.read_text()) if path.exists() else {"sent": {}, "errors": {}}

    def _record(self, kind: str, name: str, text: str) -> None:
        with self._lock:
            doc = self._signals()
            doc[kind][name] = text
            tmp = self.root / "signals.json.tmp"
            tmp.write_text(json.dumps(doc))
            tmp.replace(self.root / "signals.json")

    @property
    def signalled(self) -> dict[str, str]:
        return self._signals()["sent"]

    # ---------------------------------------------------------------------------------------- submitting
    def submit(self, name: str, pause: float, **kw) -> None:
        base = self.bases[name] = self.root / name
        base.mkdir()
        self.ids[name] = self.cluster.sbatch(make_job(base, self.data, **kw), job_env(pause))

    def submit_example(self, name: str, script: str, pause: float, args: tuple[str, ...] = (),
                       options: tuple[str, ...] = (), after: str | None = None) -> None:
        """``examples/slurm/<script>`` as it is (``options`` over its #SBATCH lines); ``after``: a job of the same
        run folder that must end well first (this one resumes from it)."""
        base = self.bases[name] = self.bases[after] if after else self.root / name
        base.mkdir(exist_ok=after is not None)
        cfg = make_config(base, self.data)
        if after:
            options = (*options, f"--dependency=afterok:{self.ids[after]}")
        self.ids[name] = self.cluster.sbatch(example(script, base), job_env(pause), f"--output={base / 'job.out'}",
                                             f"--chdir={ROOT}", *options, args=(str(cfg), *args))

    def signal_mid_run(self, name: str, *cmd: str) -> None:
        """Send ``cmd`` (with the job id appended) once the job trained 3 steps: the signal comes mid-run."""
        def watch():
            try:
                t0 = time.monotonic()
                while steps_done(self.bases[name]) < 3:
                    if time.monotonic() - t0 > JOB_TIMEOUT_S:
                        raise AssertionError(f"job {name} never reached step 3")
                    time.sleep(0.2)
                self.cluster.run(*cmd, self.ids[name])
                self._record("sent", name, " ".join(cmd))
            except BaseException as e:  # said by the test that waits for this job
                self._record("errors", name, repr(e))

        threading.Thread(target=watch, name=f"signal-{name}", daemon=True).start()

    # ------------------------------------------------------------------------------------------ checking
    def base(self, name: str) -> Path:
        return self.bases[name]

    def wait(self, name: str) -> tuple[str, dict[str, str], str]:
        """(job id, the job's final fields, its output) once it ended."""
        end = self.cluster.wait(self.ids[name], JOB_TIMEOUT_S)
        errors = self._signals()["errors"]
        assert not errors, errors
        return self.ids[name], end, (self.base(name) / "job.out").read_text()


def submit_all(j: Jobs) -> Jobs:
    # 20 steps of at least 6 s each cannot fit two minutes: the job's end time stops each session in time to
    # push, and the session requeues its own job, until the last one completes the run. (Two minutes, not
    # SLURM's shortest one: with every job starting at once on two cores, a start alone can take a minute.)
    j.submit("short", pause=6.0, time="2")
    # What the example's --signal=B:USR1@600 delivers before its time limit, sent by hand to the batch shell,
    # which is baton itself (exec).
    j.submit_example("usr1", "one-node.sbatch", pause=0.5)
    j.signal_mid_run("usr1", "scancel", "--signal=USR1", "--batch")
    # A preemption-style requeue from outside: SLURM sends SIGTERM and brings the job back by itself.
    j.submit("outside", pause=0.5, time="10")
    j.signal_mid_run("outside", "scontrol", "requeue")
    j.submit("config-error", pause=0.0, time="1", args="--set optim.lr=-1")
    # --stop-after-steps is a stop the user asked for: no requeue, though the run is not complete.
    j.submit("stop-after", pause=0.0, time="5", args="--stop-after-steps 2")
    # Two srun tasks as two nodes: the first job stops at step 10, the second (after it) resumes to the end.
    # The example's two nodes are two tasks on the one machine here, meeting on a port picked free (the job's
    # own, 29400 + its id mod 1000, may be another process's on a machine the tests share).
    nodes = ("--nodes=1", "--ntasks-per-node=2")
    j.submit_example("nodes", "multi-node.sbatch", pause=0.0, options=nodes,
                     args=("--stop-after-steps", "10", "--rdzv-endpoint", f"x:{free_port()}"))
    j.submit_example("nodes-after", "multi-node.sbatch", pause=0.0, options=nodes, after="nodes",
                     args=("--rdzv-endpoint", f"x:{free_port()}"))
    return j


def cluster_unavailable() -> str | None:
    """Why no test cluster can run here (installing the packages first where they are absent), or None."""
    return install() or (None if os.geteuid() == 0 else "the test cluster's slurmd and slurmctld run as root")


class Campaign:
    """The jobs started by pytest-xdist's controller as the suite starts, when the run includes the SLURM tests.

    The workers are told where the jobs' state will be (``CAMPAIGN_ENV``) before they start; once they have
    started (``workers_started``: started together, the jobs' sessions and the workers' imports slow each other
    down by half a minute), a thread installs SLURM where absent, prepares the jobs' data, starts the cluster and
    submits the jobs, so nothing waits for it but the one test that checks the jobs. It leaves ``jobs.json``, or ``unavailable.txt`` (why the
    test skips) or ``error.txt``. The controller stops the cluster at the end."""

    def __init__(self, base: Path) -> None:
        self.base, self.cluster = base, None
        self.folder = base / "jobs"
        self.folder.mkdir()
        self.thread = threading.Thread(target=self._run, name="slurm-campaign", daemon=True)
        self.go = threading.Event()

    @staticmethod
    def wanted(config) -> bool:
        """Under xdist, in the controller, when the selection surely runs the SLURM test: no -k, no -m that
        leaves it out, and an argument that is tests/slurm or a folder above it (a guess never starts jobs that
        no test checks)."""
        if getattr(config, "workerinput", None) is not None or not config.getoption("numprocesses", None):
            return False
        markexpr = config.getoption("markexpr") or ""
        if config.getoption("keyword") or "not slurm" in markexpr or (markexpr and "slurm" not in markexpr):
            return False
        here = ROOT / "tests" / "slurm"
        args = [Path(a.split("::")[0]).resolve() for a in config.args] or [ROOT / "tests"]
        return any(a == here or a in here.parents or here in a.parents for a in args)

    def start(self) -> None:
        os.environ[CAMPAIGN_ENV] = str(self.folder / "jobs.json")  # before the workers start: they inherit it
        self.thread.start()

    def workers_started(self) -> None:
        self.go.set()

    def _run(self) -> None:
        # A ceiling, not a wait the run needs: a worker that never reports its collection still gets its jobs.
        self.go.wait(timeout=120)
        try:
            why = cluster_unavailable()
            if why:
                (self.folder / "unavailable.txt").write_text(why)
                return
            from baton.config import load_config
            from baton.data.prepare import prepare

            b = self.base
            cfg = write_config(b / "prep.toml", data_dir=b / "corpus", store=b / "store", runs=b / "runs")
            prepare(load_config(cfg), progress=False)
            self.cluster = SlurmCluster(b / "cluster")
            self.cluster.root.mkdir()
            self.cluster.start()
            submit_all(Jobs(self.cluster, self.folder, b / "corpus")).save()
        except BaseException as e:  # said by the test, which would otherwise wait for jobs that never come
            import traceback

            (self.folder / "error.txt").write_text("".join(traceback.format_exception(e)))

    def stop(self) -> None:
        self.thread.join(timeout=JOB_TIMEOUT_S)
        if self.cluster is not None:
            self.cluster.stop()


def campaign_jobs(path: Path) -> Jobs | str:
    """The controller's jobs once submitted, or why there are none (the reason the test skips); raises what
    went wrong submitting them."""
    t0 = time.monotonic()
    while not path.exists():
        if (path.parent / "unavailable.txt").exists():
            return (path.parent / "unavailable.txt").read_text()
        if (path.parent / "error.txt").exists():
            raise RuntimeError(f"the SLURM jobs were not submitted:\n{(path.parent / 'error.txt').read_text()}")
        if time.monotonic() - t0 > JOB_TIMEOUT_S:
            raise RuntimeError(f"the SLURM jobs were not submitted after {JOB_TIMEOUT_S} s (no {path})")
        time.sleep(0.5)
    return Jobs.load(path)
