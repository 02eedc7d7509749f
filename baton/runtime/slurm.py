"""SLURM: what the job says about this session (its id, array index, requeue count, end time) and its requeue.

A session inside a SLURM job (``SLURM_JOB_ID`` set) takes three things from it:

- its time budget: the job's end time (``SLURM_JOB_END_TIME`` where SLURM sets it, 23.02 and newer; else
  ``scontrol show job``'s EndTime), unless --session-hours or budget.session_hours says otherwise;
- its ledger record: the job id, the array index and the requeue count, so every session of a campaign of
  requeues is billed under the job that ran it;
- its successor: with ``train.requeue = "auto"``, a session that stopped for time or a signal with the run not
  complete requeues its own job (``scontrol requeue``) after the verified push, so the next session starts
  by itself. A completed run, a failed session (no summary: it raised) and a job at ``train.max_requeues``
  never requeue; a job SLURM is requeueing already (preemption, an outside ``scontrol requeue``) is left to it.

``scontrol requeue`` ends the running job at once (SLURM signals every process of it), so it is the last
thing a session does: after the verified push, the ledger's end record and the summary.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ..config import WARNING_SIGNALS
from ..errors import BatonError

log = logging.getLogger("baton")

SCONTROL_TIMEOUT_S = 60.0  # a controller that does not answer in a minute is down, not slow
RDZV_PORT_BASE = 29400  # torchrun's own default for the c10d rendezvous; a job's port is this + job id mod 1000


@dataclass(frozen=True)
class SlurmJob:
    """The SLURM job this process runs in, as its environment (and the controller) describe it."""

    job_id: str
    array_job_id: str | None = None  # the array's own id, for an array task
    array_task_id: int | None = None  # SLURM_ARRAY_TASK_ID
    restart_count: int = 0  # SLURM_RESTART_COUNT: how many times the job was requeued before this run
    end_ts: float | None = None  # when SLURM ends the job (epoch seconds); None: no time limit known
    node_list: str | None = None  # SLURM_JOB_NODELIST, compressed (node[01-04])
    num_nodes: int = 1
    proc_id: int = 0  # SLURM_PROCID: this task's rank in its srun step (0 in a batch script)
    batch: bool = True  # a batch job (sbatch); only those can be requeued

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _count(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return default
    if not (value.isascii() and value.isdigit()):
        raise BatonError(f"the environment variable {name}={value!r} is not a whole number (SLURM sets it for its "
                         "jobs; unset it outside one)")
    return int(value)


LAST_INSTANT = 221_845_392_000  # 9000-01-01T00:00Z in epoch seconds


def current_job(env: Mapping[str, str] | None = None, query: bool = True) -> SlurmJob | None:
    """This process's job, or None outside SLURM. ``query``: also ask the controller (``scontrol show job``) for
    the end time where the environment lacks it, and whether it is a batch job (a controller that cannot be
    asked leaves no end time, with a warning)."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    if not re.fullmatch(r"\d+", job_id):
        raise BatonError(f"the environment variable SLURM_JOB_ID={job_id!r} is not a job id (SLURM sets it for its "
                         "jobs; unset it outside one)")
    end = _count(env, "SLURM_JOB_END_TIME", None)
    if end is not None and not LAST_INSTANT >= end:  # an instant a calendar can print (the year 9000 at most)
        raise BatonError(f"the environment variable SLURM_JOB_END_TIME={end} is not a time before the year 9000 "
                         "(epoch seconds; SLURM sets it for its jobs; unset it outside one)")
    fields = show_job(job_id, strict=False) if query else {}
    end_ts = float(end) if end else end_time(fields)
    return SlurmJob(job_id=job_id, array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
                    array_task_id=_count(env, "SLURM_ARRAY_TASK_ID", None),
                    restart_count=_count(env, "SLURM_RESTART_COUNT", 0) or 0, end_ts=end_ts,
                    node_list=env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None,
                    num_nodes=_count(env, "SLURM_JOB_NUM_NODES", 1) or 1, proc_id=_count(env, "SLURM_PROCID", 0) or 0,
                    batch=fields.get("BatchFlag", "1") != "0")


# ------------------------------------------------------------------------------------------ scontrol


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("scontrol")
    if exe is None:
        raise BatonError("scontrol is not on PATH in this SLURM job: load the SLURM module (or add its bin folder "
                         "to PATH) in the batch script")
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BatonError(f"scontrol {' '.join(args)} did not answer in {SCONTROL_TIMEOUT_S:g} s: the SLURM "
                         "controller is unreachable") from None


def parse_show_job(text: str) -> dict[str, str]:
    """``scontrol show job`` (one line with -o, or several) as KEY -> VALUE; a value runs to the next KEY=."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s+[A-Za-z][\w:/]*=|\s*$)", text.strip(), re.S):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def show_job(job_id: str, strict: bool = True) -> dict[str, str]:
    """The controller's fields of the job; ``strict=False``: {} (and a warning) when it cannot be asked."""
    try:
        p = _scontrol("show", "job", "-o", job_id)
        if p.returncode != 0:
            raise BatonError(f"scontrol show job {job_id} failed: {(p.stderr or p.stdout).strip()}")
    except BatonError as e:
        if strict:
            raise
        log.warning("could not ask SLURM about job %s (%s)", job_id, e)
        return {}
    return parse_show_job(p.stdout)


def end_time(fields: Mapping[str, str]) -> float | None:
    """The job's EndTime (the controller writes it in this machine's local time, without a zone), or None for
    a job without a time limit."""
    if fields.get("TimeLimit", "").upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT"):
        return None
    text = fields.get("EndTime", "")
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()  # naive: local time, as scontrol prints
    except ValueError:
        return None  # Unknown, None: no end known


def hostnames(node_list: str) -> list[str]:
    """The host names of a compressed node list (``node[01-03]``), as ``scontrol show hostnames`` expands it."""
    p = _scontrol("show", "hostnames", node_list)
    names = p.stdout.split()
    if p.returncode != 0 or not names:
        raise BatonError(f"scontrol show hostnames {node_list!r} failed: {(p.stderr or p.stdout).strip()}")
    return names


# ------------------------------------------------------------------------------------------- requeue


def requeue_decision(mode: str, max_requeues: int, job: SlurmJob | None, stopped_by: str | None, step: int,
                     total_steps: int, first_step: int) -> tuple[bool, str]:
    """(requeue?, why): only a job's session that stopped for time or a signal before the horizon, having trained
    from ``first_step`` to ``step``, under the cap.

    Pure: the controller's view (is SLURM requeueing the job already?) is ``already_requeued``'s."""
    if job is None:
        return False, "not a SLURM job"
    if mode != "auto":
        return False, "train.requeue is off"
    if step >= total_steps:
        return False, "the run is complete"
    if not stopped_by:
        return False, "the session stopped at --stop-after-steps, as asked"
    if not job.batch:
        return False, "not a batch job (only sbatch jobs can be requeued)"
    if step <= first_step:
        # Its start took the whole budget (or the signal came before the first step): the next run of the same
        # job would do the same, so requeueing would only loop until the cap.
        return False, (f"the session trained no step (it stopped at step {step} for {stopped_by}): a requeue would "
                       "do the same; give the job a longer --time, or see what delays its start")
    if job.restart_count >= max_requeues:
        return False, (f"the job was requeued {job.restart_count} times already, train.max_requeues="
                       f"{max_requeues}: resubmit it with sbatch to go on")
    return True, f"stopped for {stopped_by} at step {step} of {total_steps}"


def already_requeued(job: SlurmJob, fields: Mapping[str, str]) -> str | None:
    """Why SLURM itself brings the job back (preemption, an outside ``scontrol requeue``), or None."""
    restarts = fields.get("Restarts", "")
    if restarts.isdigit() and int(restarts) > job.restart_count:
        return f"SLURM requeued job {job.job_id} already (Restarts={restarts})"
    state = fields.get("JobState", "")
    if state.startswith(("PENDING", "REQUEUE")):
        return f"job {job.job_id} is {state} already"
    if state.startswith("CANCELLED"):
        # scancel signalled the job: the person ended it, and a requeue would undo that.
        return f"job {job.job_id} is {state}: it was cancelled, and stays so"
    return None


def requeue(job: SlurmJob) -> bool:
    """``scontrol requeue`` the job, unless SLURM brings it back already; True when this call requeued it.

    SLURM signals the whole job as soon as the requeue is accepted: call it last."""
    fields = show_job(job.job_id, strict=False)
    why = already_requeued(job, fields) if fields else None
    if why:
        log.info("requeue: %s; not requeued again", why)
        return False
    p = _scontrol("requeue", job.job_id)
    if p.returncode != 0:
        raise BatonError(f"scontrol requeue {job.job_id} failed ({(p.stderr or p.stdout).strip()}); the checkpoint "
                         "is verified in the store: resubmit the job with sbatch (and give it --requeue)")
    log.info("requeued SLURM job %s (requeue %d): the next session resumes from the store's pointer", job.job_id,
             job.restart_count + 1)
    return True


def warning_signal(name: str) -> signal.Signals:
    """train.slurm_signal (``USR1``, ``SIGUSR1``, ``usr1``; checked by the config) as a signal."""
    short = name.strip().upper().removeprefix("SIG")
    assert short in WARNING_SIGNALS, name
    return signal.Signals[f"SIG{short}"]


# ----------------------------------------------------------------------------------------- multi-node


def rendezvous_port(job_id: str) -> int:
    """The rendezvous port of a job: two jobs whose first hosts are the same node (a shared node) meet on
    different ports, below the kernel's ephemeral range."""
    return RDZV_PORT_BASE + int(job_id) % 1000


def rendezvous(env: Mapping[str, str] | None = None, port: int | None = None) -> tuple[str, str, str]:
    """(nnodes, host:port, rendezvous id) of an ``srun`` step that runs one ``baton train`` per node: the
    nodes meet at the first host of the step's node list (on ``port``, else the job's), under the job id."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if not (job_id and nodes and tasks):
        raise BatonError("--nnodes slurm runs inside an srun step of a SLURM job (one task per node: srun "
                         "--ntasks-per-node=1 baton train ...); SLURM_JOB_ID, SLURM_STEP_NODELIST and "
                         "SLURM_STEP_NUM_TASKS are not all set here")
    if not tasks.isdigit() or int(tasks) < 1:
        raise BatonError(f"SLURM_STEP_NUM_TASKS={tasks!r} is not a task count")
    return tasks, f"{hostnames(nodes)[0]}:{port or rendezvous_port(job_id)}", f"slurm-{job_id}"
