"""``baton train --nproc N``: torchrun over the training module, signals forwarded, every rank's failure shown.

The launcher adds three things to a bare ``torchrun -m baton.cli train``:

- It owns signal delivery. torchrun runs in its own session, so a terminal's Ctrl-C or a platform's
  SIGTERM reaches it exactly once, from here; torchrun passes it to every worker, the workers agree on
  one step boundary, checkpoint and exit 0, and then so does the launcher (torchrun itself reports a
  received signal as a failure).
- On failure it reads every rank's log file (``<run dir>/logs/rank-<r>.log``, the part this launch
  wrote) and prints each rank's tracebacks in full, the first to fail marked, instead of torchrun's
  summary that shows one rank and no traceback (``agent`` runs torchrun without it). When the ranks
  stopped on a user error, it prints that error's one line (each different one once) and where the logs are.
- Multi-node options pass through to torchrun unchanged in meaning.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, TextIO

from ..errors import BatonError
from .agent import USER_ERROR
from .logs import EXIT_RECORD, LAUNCHED, RECORD_START, TRACEBACK_HEAD

log = logging.getLogger("baton")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# torchrun must catch (and pass on) every signal the session treats as "checkpoint and stop".
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# What torchrun handles (and passes to its ranks) where it has no --signals-to-handle.
TORCHRUN_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_LEVEL_ERROR = re.compile(r"^\S+ \S+ \[rank \d+\] (ERROR|CRITICAL) ")


RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2", "static")  # torchrun's own registry


@dataclass
class LaunchSpec:
    """Where and how many: this machine's processes, and how the nodes find each other."""

    nproc: int = 1  # processes on this node (one per GPU)
    nnodes: str = "1"  # nodes, or MIN:MAX for an elastic range
    node_rank: int | None = None  # this node's rank (static rendezvous with --master-addr)
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None  # host:port of the c10d rendezvous (every node passes the same)
    rdzv_id: str | None = None  # job id shared by all nodes (default: the run name)
    rdzv_backend: str = "c10d"
    shutdown_timeout: int = 300  # seconds torchrun gives the ranks to checkpoint after a signal

    @property
    def multi_node(self) -> bool:
        return self.nnodes != "1" or bool(self.rdzv_endpoint or self.master_addr)

    def check(self) -> None:
        problems = []
        if self.nproc < 1:
            problems.append(f"--nproc must be a whole number >= 1, got {self.nproc}")
        if not re.fullmatch(r"\d+(:\d+)?", self.nnodes):
            problems.append(f"--nnodes must be N or MIN:MAX, got {self.nnodes!r}")
        else:
            low, _, high = self.nnodes.partition(":")
            lo, hi = int(low), int(high or low)
            if not 1 <= lo <= hi:
                problems.append(f"--nnodes {self.nnodes}: nodes must be at least 1, and MIN at most MAX")
            elif self.node_rank is not None and not 0 <= self.node_rank < hi:
                problems.append(f"--node-rank {self.node_rank} is not a node of --nnodes {self.nnodes} (0 to {hi - 1}): "
                                "the job would wait for a node that never comes")
        if self.rdzv_endpoint is not None:
            host, colon, port = self.rdzv_endpoint.rpartition(":")
            if not (colon and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
                problems.append(f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT with a port from 1 to 65535")
        if self.rdzv_backend not in RDZV_BACKENDS:
            problems.append(f"--rdzv-backend {self.rdzv_backend!r} is not one of {', '.join(RDZV_BACKENDS)}")
        if self.rdzv_endpoint and self.master_addr:
            problems.append("give either --rdzv-endpoint (c10d rendezvous) or --master-addr (static), not both")
        if self.multi_node and not (self.rdzv_endpoint or self.master_addr):
            problems.append(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (or --master-addr with "
                            "--node-rank) so the nodes can find each other")
        if self.master_addr and self.node_rank is None:
            problems.append("--master-addr needs --node-rank (0 on the master node, 1.. on the others)")
        if self.shutdown_timeout < 1:
            problems.append(f"--shutdown-timeout must be >= 1 second, got {self.shutdown_timeout}")
        if problems:
            raise BatonError("; ".join(problems))


def check_geometry(spec: LaunchSpec, global_batch: int, micro_batch: int | str) -> None:
    """Refuse, before starting any process, a global batch the ranks cannot split evenly."""
    if not spec.nnodes.isdigit():
        return  # an elastic node range: each rank checks when it knows the world
    world = spec.nproc * int(spec.nnodes)
    if not isinstance(micro_batch, int):  # auto picks a micro-batch that divides each rank's share, if there is one
        if global_batch % world:
            raise BatonError(f"train.global_batch={global_batch} does not split over {world} ranks ({spec.nproc} per "
                             f"node x {spec.nnodes} nodes): make it a multiple of {world}, or change the ranks")
        return
    if global_batch % (micro_batch * world):
        raise BatonError(
            f"train.global_batch={global_batch} is not divisible by micro_batch {micro_batch} x {world} ranks "
            f"({spec.nproc} per node x {spec.nnodes} nodes); change global_batch, micro_batch or the number of ranks"
        )


def check_devices(spec: LaunchSpec, device: str) -> None:
    """Refuse, before starting any process, more ranks on this node than it has GPUs (each rank takes the
    GPU of its local rank; the extra ones would each end in an "invalid device ordinal" traceback)."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return  # CPU ranks share the cores; any number runs (gloo)
    if not torch.cuda.is_available():
        from .device import pick_device

        pick_device(device)  # its one line: no CUDA GPU is visible
    visible = torch.cuda.device_count()  # without initialising CUDA in this process (NVML)
    if device.startswith("cuda:"):
        raise BatonError(f"train.device={device!r} names one GPU, and --nproc {spec.nproc} starts a process per GPU: "
                         "set train.device = \"cuda\" or \"auto\" (choose the GPUs with CUDA_VISIBLE_DEVICES)")
    if spec.nproc > visible:
        raise BatonError(f"--nproc {spec.nproc} starts a process per GPU, and this machine has {visible} CUDA "
                         f"GPU{'' if visible == 1 else 's'} visible: use --nproc {visible} or fewer (or check "
                         "CUDA_VISIBLE_DEVICES)")


@lru_cache(maxsize=1)
def _torchrun_options() -> frozenset[str]:
    # Some options (signals to handle, shutdown timeout) are newer than the oldest torch baton supports.
    from torch.distributed.run import get_args_parser

    return frozenset(o for a in get_args_parser()._actions for o in a.option_strings)


def torchrun_command(spec: LaunchSpec, train_args: list[str], run_name: str = "baton",
                     signals: tuple[int, ...] = ()) -> list[str]:
    """The torchrun command line (through ``agent``): the command-line *module* running ``train``
    (``-m baton.cli train``), never a script path. ``signals``: stop signals beyond the usual ones (SLURM's
    warning signal, train.slurm_signal)."""
    cmd = [sys.executable, "-m", "baton.runtime.agent", "--nproc-per-node", str(spec.nproc)]
    if not spec.multi_node:
        cmd.append("--standalone")  # a free port of its own: two runs on one machine do not collide
    elif spec.rdzv_endpoint:
        cmd += ["--nnodes", spec.nnodes, "--rdzv-backend", spec.rdzv_backend, "--rdzv-endpoint", spec.rdzv_endpoint,
                "--rdzv-id", spec.rdzv_id or run_name]
    else:
        cmd += ["--nnodes", spec.nnodes, "--node-rank", str(spec.node_rank), "--master-addr", str(spec.master_addr)]
        if spec.master_port is not None:
            cmd += ["--master-port", str(spec.master_port)]
    opts = _torchrun_options()
    if "--max-restarts" in opts:
        cmd += ["--max-restarts", "0"]  # a failed rank ends the session; the next one resumes from the store
    if "--signals-to-handle" in opts:
        extra = [signal.Signals(s).name for s in signals if signal.Signals(s).name not in TORCHRUN_SIGNALS.split(",")]
        cmd += ["--signals-to-handle", ",".join([TORCHRUN_SIGNALS, *extra])]
    if "--shutdown-timeout" in opts:
        cmd += ["--shutdown-timeout", str(spec.shutdown_timeout)]
    return [*cmd, "-m", "baton.cli", "train", *train_args]


def passed_on(signum: int) -> int:
    """The signal torchrun is sent for ``signum``. A torchrun without ``--signals-to-handle`` (before torch 2.9)
    handles only SIGTERM, SIGINT, SIGHUP and SIGQUIT and dies of any other (SLURM's warning signal, USR1),
    orphaning the ranks with no checkpoint: it is sent SIGTERM instead, which every rank also takes as "checkpoint
    and stop" (the session's reason then says SIGTERM)."""
    if "--signals-to-handle" in _torchrun_options() or signum in TORCHRUN_DEFAULT_SIGNALS:
        return signum
    return int(signal.SIGTERM)


# ---------------------------------------------------------------------------------------- rank logs


@dataclass
class RankLog:
    rank: int
    path: Path
    tracebacks: list[str] = field(default_factory=list)  # each with the record that introduced it
    errors: list[str] = field(default_factory=list)  # error records without a traceback (user errors)
    exit_status: int | None = None
    first_error_at: str | None = None  # timestamp of its first error record


def log_sizes(log_dir: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in log_dir.glob("rank-*.log")} if log_dir.is_dir() else {}


def read_rank_logs(log_dir: Path, since: dict[Path, int]) -> list[RankLog]:
    """What each rank wrote to its log after ``since`` (file sizes before the launch), in rank order."""
    out = []
    for path in sorted(log_dir.glob("rank-*.log"), key=_rank_of) if log_dir.is_dir() else []:
        with open(path, "rb") as f:
            f.seek(since.get(path, 0))
            text = f.read().decode("utf-8", errors="replace")
        if text.strip():
            out.append(parse_rank_log(_rank_of(path), path, text))
    return out


def parse_rank_log(rank: int, path: Path, text: str) -> RankLog:
    """Split a log into records; keep every record that carries a traceback, wherever it is in the file."""
    rl = RankLog(rank, path)
    records: list[list[str]] = []
    for line in text.splitlines():
        if RECORD_START.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    for rec in records:
        body = "\n".join(rec)
        m = EXIT_RECORD.search(rec[0])
        if m:
            rl.exit_status = int(m.group(2))
        is_error = bool(_LEVEL_ERROR.match(rec[0]))
        if TRACEBACK_HEAD in body:
            rl.tracebacks.append(body)
        elif is_error:
            rl.errors.append(body)
        if (is_error or TRACEBACK_HEAD in body) and rl.first_error_at is None:
            rl.first_error_at = rec[0][:23]
    return rl


def _rank_of(path: Path) -> int:
    try:
        return int(path.stem.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def failure_report(ranks: list[RankLog], log_dir: Path, nproc: int, rc: int) -> str:
    lines = [f"baton: the distributed run failed (torchrun exit status {rc}); what each rank logged in {log_dir}:"]
    if not ranks:
        lines.append("  no rank wrote to its log in this launch: the failure came before training started "
                     "(see torchrun's output above)")
        return "\n".join(lines)
    failed = [r for r in ranks if r.first_error_at]
    first = min(failed, key=lambda r: r.first_error_at or "").rank if failed else None
    for r in ranks:
        status = (f"exit status {r.exit_status}" if r.exit_status is not None
                  else "no exit record (killed before it could write one)")
        mark = "  <- first to fail" if r.rank == first else ""
        lines.append(f"--- rank {r.rank}: {status}; {r.path}{mark}")
        for block in r.errors + r.tracebacks:
            lines.append(block)
        if not (r.errors or r.tracebacks):
            lines.append("(no error or traceback in this rank's log)")
    if len(ranks) < nproc:
        lines.append(f"--- {nproc - len(ranks)} of the {nproc} local ranks wrote nothing to {log_dir}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- launch


def launch(spec: LaunchSpec, train_args: list[str], log_dir: Path, run_name: str = "baton",
           output: TextIO | None = None, signals: tuple[int, ...] = ()) -> int:
    """Run torchrun to completion; return 0 when every rank ended cleanly, else a failure status.

    With ``output``, torchrun's and the ranks' stdout and stderr are copied into it as they come (a
    notebook cell's stream: the kernel's own file descriptors lead nowhere a user sees); without, the
    ranks write to this process's terminal directly.
    """
    spec.check()
    cmd = torchrun_command(spec, train_args, run_name, signals)
    log.info("launching: %s", " ".join(cmd))
    before = log_sizes(log_dir)
    # A session of its own: signals reach torchrun once, from here, not also from the terminal.
    pipe: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if output is not None else {}
    proc = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, LAUNCHED: "1"}, **pipe)
    copier = None
    if output is not None:
        copier = threading.Thread(target=_copy_output, args=(proc.stdout, output), name="baton-rank-output",
                                  daemon=True)
        copier.start()
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        sent = passed_on(signum)
        log.warning("baton: %s received; passed to torchrun%s: every rank checkpoints at the next step boundary",
                    signal.Signals(signum).name, "" if sent == signum else f" as {signal.Signals(sent).name}")
        try:
            proc.send_signal(sent)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (*FORWARDED, *(s for s in signals if s not in FORWARDED))}
    try:
        rc = proc.wait()
        if copier is not None:
            copier.join()  # everything the ranks wrote is shown before the outcome
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    ranks = read_rank_logs(log_dir, before)
    statuses = [r.exit_status for r in ranks]
    if rc == 0:
        return 0
    if received and len(ranks) >= spec.nproc and all(s == 0 for s in statuses):
        # torchrun reports a signal it received as a failure even when every rank checkpointed and exited 0.
        log.info("baton: stopped on %s: all %d local ranks checkpointed and exited cleanly",
                 signal.Signals(received[0]).name, len(ranks))
        return 0
    errors = user_errors(ranks) if rc == USER_ERROR else []
    if errors:
        report = "\n".join([f"baton: the ranks stopped on a user error; their logs: "
                             f"{', '.join(str(r.path) for r in ranks)}", *errors])
        print(report, file=sys.stderr if output is None else output, flush=True)
        return USER_ERROR
    print(failure_report(ranks, log_dir, spec.nproc, rc), file=sys.stderr if output is None else output, flush=True)
    return rc if rc > 0 else 1


def user_errors(ranks: list[RankLog]) -> list[str]:
    """Each different ``baton: error: ...`` the ranks logged, once, in rank order."""
    out: list[str] = []
    for r in ranks:
        for record in r.errors:
            at = record.find("baton: error: ")
            if at >= 0 and record[at:].rstrip() not in out:
                out.append(record[at:].rstrip())
    return out


def _copy_output(pipe: IO[bytes], output: TextIO) -> None:
    # Chunks, not lines: a progress bar redraws its line with carriage returns and no newline.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(pipe.fileno(), 65536):
        output.write(decoder.decode(chunk))
        output.flush()
    pipe.close()
