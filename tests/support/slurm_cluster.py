"""A real one-node SLURM cluster for the tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives in one temporary folder (configuration, state, spool, logs, the munge key and socket) and
on ports picked free, so the cluster touches nothing of the machine's own SLURM or munge, if any. The
daemons run in the foreground as children of the test process and are stopped by their process ids.

Settings that make a job's life short enough for a test, and why:

- ``AuthInfo=cred_expire=5``: a requeued job waits this long (plus one second) before it may start again
  (SLURM's default is 120 s);
- ``SchedulerParameters=sched_interval=1``: the main scheduler looks at pending jobs every second, so a
  requeued job starts as soon as it may (the default is every 60 s);
- ``OverSubscribe=FORCE``: jobs share the node's CPUs, as the tests' processes share the machine anyway.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client")
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "srun", "sinfo")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED")
START_TIMEOUT_S = 120.0


def missing_commands() -> list[str]:
    return [c for c in COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]


def install() -> str | None:
    """Install the packages with apt-get where they are absent; None when the commands are there, else why not."""
    if not missing_commands():
        return None
    if os.geteuid() != 0:
        return f"SLURM is not installed ({', '.join(missing_commands())} missing) and installing it needs root"
    if shutil.which("apt-get") is None:
        return "SLURM is not installed and this machine has no apt-get to install it with"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {(p.stderr or p.stdout).strip()[-400:]}"
    return None if not missing_commands() else f"still missing after apt-get: {', '.join(missing_commands())}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """One node with the machine's cores; ``env`` is what a client command (sbatch, scontrol, ...) needs."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in ("SLURM_JOB_ID", "SLURM_JOBID"):  # a test run inside a SLURM job must not look like one
            self.env.pop(name, None)

    # ------------------------------------------------------------------------------------- daemons
    def start(self) -> None:
        r = self.root
        munge = r / "munge"
        for d in (munge, r / "state", r / "spool"):
            d.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = munge / "socket"
        self._spawn([_sbin("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                     f"--pid-file={munge / 'pid'}", f"--log-file={munge / 'log'}", f"--seed-file={munge / 'seed'}"],
                    r / "munged.out")
        self._wait(lambda: sock.exists(), "munged to create its socket", munge / "log")
        node = self._node_line()
        name = node.split()[0].split("=", 1)[1]
        self.conf.write_text("\n".join([
            "ClusterName=baton-test",
            f"SlurmctldHost={name}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={sock},cred_expire=5",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "InactiveLimit=0",
            "KillWait=30",
            "MinJobAge=3600",
            "SlurmctldTimeout=60",
            "SlurmdTimeout=60",
            f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
            f"PartitionName=test Nodes={name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ]))
        self._spawn([_sbin("slurmctld"), "-D", "-f", str(self.conf)], r / "slurmctld.out")
        self._spawn([_sbin("slurmd"), "-D", "-N", name, "-f", str(self.conf)], r / "slurmd.out")
        self._wait(self._idle, "the node to come up idle", r / "slurmctld.log")

    def _node_line(self) -> str:
        # slurmd -C: this machine's NodeName line (sockets, cores, threads, memory) as slurmd itself sees it.
        out = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True, timeout=60).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
        return " ".join(w for w in line.split() if not w.startswith("RealMemory="))  # memory is not scheduled

    def _spawn(self, cmd: list[str], out: Path) -> None:
        with open(out, "ab") as f:
            self.procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                               start_new_session=True))

    def _idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
        return p.returncode == 0 and p.stdout.strip() in ("idle", "mixed")

    def _wait(self, ready, what: str, log: Path) -> None:
        t0 = time.monotonic()
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() - t0 > START_TIMEOUT_S:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
                self.stop()
                raise RuntimeError(f"SLURM test cluster: gave up waiting for {what}; {log}:\n{tail}")
            time.sleep(0.5)

    def stop(self) -> None:
        if len(self.procs) == 3 and self.procs[1].poll() is None:  # slurmctld is up
            self._cancel_all()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def _cancel_all(self) -> None:
        """A job still running (a failed test's) is cancelled and waited for: its processes are the test's."""
        try:
            self.run("scancel", "--user", pwd.getpwuid(os.getuid()).pw_name, check=False)
            t0 = time.monotonic()
            while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() - t0 < 60:
                time.sleep(1.0)
        except (OSError, subprocess.SubprocessError):
            pass  # the controller is gone already: nothing it could cancel

    # ----------------------------------------------------------------------------------------- jobs
    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr or p.stdout}")
        return p

    def sbatch(self, script: Path, env: dict[str, str] | None = None, *options: str, args: tuple[str, ...] = ()) -> str:
        """Submit ``script`` with ``args`` (its #SBATCH lines and, over them, ``options`` decide the rest) with
        this cluster's and ``env``'s variables; its job id."""
        p = subprocess.run(["sbatch", "--parsable", *options, str(script), *args], env={**self.env, **(env or {})},
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError(f"sbatch {script} exited {p.returncode}: {p.stderr}")
        return p.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        from baton.runtime.slurm import parse_show_job

        return parse_show_job(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def wait(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Poll the job until it ends (or ``until(fields)`` holds); its fields then. A ceiling, not a timing."""
        t0 = time.monotonic()
        while True:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if (until(fields) if until else state in TERMINAL):
                return fields
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"job {job_id} still {state} after {timeout:g} s: {fields}")
            time.sleep(1.0)
