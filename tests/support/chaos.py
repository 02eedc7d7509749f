"""The chaos harness: train, SIGKILL at random moments in every phase, resume, and check the invariants.

Used by tests/reliability/test_chaos.py (a bounded run) and benchmarks/chaos_long.py (200 kills).

A kill is aimed at a phase of the session (``baton.faults.POINTS``): the process is started with that
point's window widened by a pause, the harness waits until the trace says the point was reached, then
kills after a random delay drawn from the pause plus a little more, so the kill lands at the boundary or
inside the operation that follows. "random" kills wait a random time from process start instead (start-up,
resume, steps, whatever is running). Every kill is a real SIGKILL of a real process.

After every kill, before resuming, the harness checks with its own reader of the store (files on disk, or
boto3 against the S3 server), not through baton:

1. the pointer parses and names a complete checkpoint: every file it lists is in the store with that size
   and sha256, state.json holds the same step, the safetensors files load;
2. once a pointer existed it never disappears nor goes back (so a resume cannot start from step 0);
3. the checkpoint the pointer names is present (the latest verified checkpoint is never deleted);
4. the steps trained beyond the resume point (lost work, redone on resume) are at most one cadence. The
   resume point is the pointer's step, or a newer checkpoint the killed session saved on this machine's
   disk that continues the pointer (its parent names the pointer's step and weights): the next session
   finishes that push before it resumes;
5. the next session resumes at exactly the resume point, and the metrics history it keeps is contiguous;
6. killed sessions do not pile up checkpoints on the local disk (one pulled copy, nothing older than the
   pointer in the local checkpoint folder).

When the run completes, its final checkpoint (weights and optimizer moments) and its metrics must equal an
uninterrupted run's exactly.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_safetensors

# The named phases a kill must hit (issue: inside a step, while writing a checkpoint, while uploading,
# while verifying, while writing the pointer, while pruning) and the finer points around them.
PHASES = ("step", "save", "upload", "verify", "pointer", "prune")
AIMED = ("step", "save", "save.file", "upload", "verify", "pointer", "pointer.readback", "prune", "prune.delete")


# ------------------------------------------------------------------------------------------ store views


class LocalView:
    def __init__(self, root: Path):
        self.root = Path(root)

    def read(self, key: str) -> bytes | None:
        p = self.root / key
        return p.read_bytes() if p.is_file() else None

    def keys(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())


class S3View:
    def __init__(self, endpoint: str, bucket: str, prefix: str = "", key: str | None = None, secret: str | None = None):
        import boto3
        from botocore.config import Config

        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                                   aws_secret_access_key=secret, config=Config(s3={"addressing_style": "path"}))
        self.bucket, self.prefix = bucket, prefix.strip("/")

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._k(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None

    def keys(self, prefix: str) -> list[str]:
        out, token = [], None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": self._k(prefix)}
            if token:
                kw["ContinuationToken"] = token
            r = self.client.list_objects_v2(**kw)
            cut = len(self.prefix) + 1 if self.prefix else 0
            out += [o["Key"][cut:] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return sorted(out)
            token = r["NextContinuationToken"]


# ------------------------------------------------------------------------------------------ the harness


@dataclass
class Kill:
    target: str
    hit: str  # the phase the kill landed in ("<point>" inside its window, "<point>+" just after it)
    delay: float
    pointer_before: int | None
    pointer_after: int | None
    reached: int  # last step recorded by the killed process
    status: int


@dataclass
class Report:
    kills: list[Kill] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    rounds_completed: int = 0
    legs: int = 0

    def hits(self) -> set[str]:
        return {k.hit for k in self.kills}


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by the kill: the next session rewrites the file from the checkpoint
    return rows


def trace_lines(path: Path) -> list[list[str]]:
    if not path.is_file():
        return []
    return [line.split() for line in path.read_text().splitlines() if len(line.split()) >= 2]


class Chaos:
    """One store, one config; ``round()`` trains a run to completion through ``kills`` kills."""

    def __init__(self, zygote, config: Path, store_view, work: Path, run_dir_root: Path, cadence: int,
                 bound_cadences: int, rng: random.Random, overrides: list[str] = (), pause: float = 0.25,
                 random_window: tuple[float, float] = (0.2, 2.0), log: Callable[[str], None] = lambda s: None):
        self.z, self.config, self.view, self.work = zygote, config, store_view, work
        self.runs = run_dir_root
        self.cadence, self.bound = cadence, bound_cadences * cadence
        self.rng, self.overrides, self.pause, self.random_window = rng, list(overrides), pause, random_window
        self.log = log
        self.report = Report()
        self.leftover: list[str] = []  # targets a completed round did not reach: the next round aims them first

    # ---- the store, read independently
    def pointer(self, run: str) -> dict[str, Any] | None:
        raw = self.view.read(f"{run}/latest.json")
        return None if raw is None else json.loads(raw)

    def check_pointer(self, run: str, where: str) -> dict[str, Any] | None:
        """Invariants 1 and 3: the pointer names a complete checkpoint whose bytes match. Returns it."""
        v = self.report.violations
        try:
            p = self.pointer(run)
        except json.JSONDecodeError as e:
            v.append(f"{where}: pointer is not valid JSON ({e})")
            return None
        if p is None:
            return None
        files = p.get("files") or {}
        for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
            if name not in files:
                v.append(f"{where}: pointer step {p.get('step')} lists no {name}")
        blobs = {}
        for name, info in files.items():
            data = self.view.read(f"{run}/{p['path']}/{name}")
            if data is None:
                v.append(f"{where}: pointer step {p['step']} names {p['path']}/{name}, which is not in the store")
                continue
            if len(data) != info["size"] or sha256(data) != info["sha256"]:
                v.append(f"{where}: {p['path']}/{name} differs from the pointer's size/sha256")
            blobs[name] = data
        if "state.json" in blobs:
            st = json.loads(blobs["state.json"])
            if st.get("step") != p["step"]:
                v.append(f"{where}: state.json says step {st.get('step')}, pointer says {p['step']}")
        for name in ("model.safetensors", "optimizer.safetensors"):
            if name in blobs:
                try:
                    load_safetensors(blobs[name])
                except Exception as e:  # noqa: BLE001 - any failure to parse is a violation
                    v.append(f"{where}: {p['path']}/{name} does not load ({e})")
        return p

    def resume_point(self, run: str, pointer: dict[str, Any] | None) -> int | None:
        """Where the next session must resume: the pointer's step, or the newest checkpoint on this machine's
        disk that continues the pointer's checkpoint (the next session finishes its push). Before any pointer,
        a first checkpoint continues the run when the store's ledger holds the session that saved it."""
        best = pointer["step"] if pointer else None
        parent = {"step": pointer["step"], "model_sha256": pointer["files"]["model.safetensors"]["sha256"]} \
            if pointer else None
        folder = self.runs / run / "ckpt"
        for d in folder.glob("step-*") if folder.is_dir() else []:
            n = d.name[len("step-"):]
            if not n.isdigit() or int(n) <= (best or 0):
                continue
            try:
                st = json.loads((d / "state.json").read_text())
            except (OSError, ValueError):
                continue
            known = pointer is not None or self.view.read(f"{run}/ledger/{st.get('session')}.json") is not None
            if st.get("parent") == parent and known:
                best = int(n)
        return best

    # ---- one process
    def _argv(self, run: str) -> list[str]:
        argv = ["train", "-c", str(self.config), "--no-progress", "--set", f"run.name={run}"]
        for o in self.overrides:
            argv += ["--set", o]
        return argv

    def leg(self, run: str, target: str | None, n: int) -> tuple[Any, str | None, float]:
        """Start a session; kill it as ``target`` says (None: let it end). Returns (result, hit, delay)."""
        trace = self.work / f"{run}-leg{n:03d}.trace"
        env = {"BATON_FAULT_TRACE": str(trace)}
        if target not in (None, "random", "step"):
            env["BATON_FAULT_PAUSE"] = f"{target}={self.pause}"
        child = self.z.spawn(self._argv(run), self.work / "out", env=env)
        self.report.legs += 1
        hit, delay = None, 0.0
        if target is None:
            return child.wait(600), None, 0.0
        if target == "random":
            delay = self.rng.uniform(*self.random_window)
            end = time.monotonic() + delay
            while time.monotonic() < end and child.alive():
                time.sleep(0.01)
            if child.alive():
                child.kill()
                hit = self._main_phase(trace)
        else:
            # Aimed: at the k-th occurrence for steps, else the first time the point is reached.
            want = self.rng.randint(1, 3) if target == "step" else 1
            seen_at = None
            while child.alive():
                if sum(1 for ln in trace_lines(trace) if self._aimed(target, ln)) >= want:
                    seen_at = time.monotonic()
                    break
                time.sleep(0.003)
            if seen_at is not None:
                window = 0.01 if target == "step" else self.pause
                delay = self.rng.uniform(0, window * 1.2)
                time.sleep(max(0.0, seen_at + delay - time.monotonic()))
                if child.alive():
                    child.kill()
                    if target == "step":
                        hit = self._main_phase(trace)
                    else:  # inside the widened window, or just after it: in the operation that follows
                        hit = target if delay < self.pause else f"{target}+"
        res = child.wait(600)
        if hit is not None and res.returncode == 0:
            # The session ended on its own between the liveness check and the signal (a zombie ignores
            # SIGKILL): that leg was not a kill, and the status says so.
            hit = None
        return res, hit, delay

    def _aimed(self, target: str, line: list[str]) -> bool:
        """Whether a trace line is the point aimed at. A step is aimed at when it does not end at a checkpoint
        boundary, so that the kill, a few milliseconds later, still lands in a step and not in the save (the
        point names the steps done before it: step N ends at boundary N + 1)."""
        if line[0] != target:
            return False
        return target != "step" or self.cadence < 2 or not line[1].isdigit() or (int(line[1]) + 1) % self.cadence != 0

    @staticmethod
    def _main_phase(trace: Path) -> str:
        """The last point the training thread passed before the kill ("startup" before the first step)."""
        main = [ln[0] for ln in trace_lines(trace) if ln[-1] == "MainThread"]
        return main[-1] if main else "startup"

    # ---- a whole run
    def round(self, run: str, kills: int, targets: list[str]) -> int | None:
        """Train ``run`` to completion with up to ``kills`` kills. Returns the final pointer's step or None."""
        v = self.report.violations
        highest: int | None = None  # the highest pointer step seen: it may never go back or vanish
        queue, self.leftover = self.leftover + list(targets), []
        done_kills, n = 0, 0
        while True:
            n += 1
            before = self.check_pointer(run, f"{run} before leg {n}")
            if before is not None and before.get("complete"):
                break
            start = self.resume_point(run, before)
            target = None
            if done_kills < kills:
                if not queue:
                    queue = list(targets)
                target = queue.pop(0)
            res, hit, delay = self.leg(run, target, n)
            after = self.check_pointer(run, f"{run} after leg {n} ({target or 'no kill'})")
            step_before = before["step"] if before else None
            step_after = after["step"] if after else None
            if highest is not None and (step_after is None or step_after < highest):
                v.append(f"{run} leg {n}: the pointer went from step {highest} to {step_after}")
            if step_after is not None:
                highest = max(highest or 0, step_after)
            self._check_resume(run, n, res.stderr, start)
            self._check_local(run, n, step_after)
            metrics = read_metrics(self.runs / run / "metrics.jsonl")
            reached = metrics[-1]["step"] if metrics else 0
            steps = [r["step"] for r in metrics]
            if steps and steps != list(range(1, len(steps) + 1)):
                v.append(f"{run} leg {n}: metrics history is not contiguous: {steps[:3]}…{steps[-3:]}")
            if hit is not None:
                done_kills += 1
                if res.returncode != -9:
                    v.append(f"{run} leg {n}: expected death by SIGKILL, got status {res.returncode}")
                resume_at = self.resume_point(run, after)
                lost = reached - (resume_at or 0)
                if lost > self.bound:
                    v.append(f"{run} leg {n}: killed at step {reached} with the pointer at {step_after} and the "
                             f"resume point at {resume_at}: {lost} steps to redo, more than {self.bound}")
                self.report.kills.append(Kill(target, hit, round(delay, 3), step_before, step_after, reached,
                                              res.returncode))
                self.log(f"kill {len(self.report.kills):3d} {run} target={target:16s} hit={hit:18s} "
                         f"pointer {step_before}->{step_after} reached {reached}")
            else:
                if target is not None and target != "random":
                    queue.append(target)  # the point was not reached before the session ended: aim again
                if res.returncode != 0:
                    v.append(f"{run} leg {n}: exited {res.returncode} without a kill:\n{res.stderr[-2000:]}")
                    return None
            if n > kills * 4 + 50:
                v.append(f"{run}: no completion after {n} sessions")
                return None
        self.leftover = queue
        self.report.rounds_completed += 1
        return before["step"]

    def _check_local(self, run: str, n: int, pointer_step: int | None) -> None:
        """Invariant 6: killed sessions do not pile up checkpoints on the local disk."""
        def steps(sub: str) -> list[int]:
            d = self.runs / run / sub
            return [int(re.match(r"step-(\d+)", p.name).group(1)) for p in d.glob("step-*")] if d.is_dir() else []

        pulled, local = steps("resume"), steps("ckpt")
        if len(pulled) > 1:
            self.report.violations.append(f"{run} leg {n}: {len(pulled)} pulled checkpoints kept locally: {pulled}")
        stale = [s for s in local if pointer_step is not None and s < pointer_step]
        if stale:
            self.report.violations.append(f"{run} leg {n}: local checkpoints {stale} older than the pointer "
                                          f"({pointer_step}) were left on disk")

    def _check_resume(self, run: str, n: int, stderr: str, start: int | None) -> None:
        v = self.report.violations
        fresh = re.search(r"starting run .* at step 0", stderr)
        resumed = re.search(r"resumed at step (\d+)", stderr)
        if start is not None and fresh:
            v.append(f"{run} leg {n}: started at step 0 although the pointer named a checkpoint")
        if resumed and int(resumed.group(1)) != start:
            v.append(f"{run} leg {n}: resumed at step {resumed.group(1)}, expected {start}")
        if "Traceback" in stderr:
            v.append(f"{run} leg {n}: a traceback:\n{stderr[-2000:]}")


def final_state(view, run: str) -> tuple[dict, dict, dict]:
    """(model tensors, optimizer tensors, pointer) of the run's final checkpoint, read from the store."""
    p = json.loads(view.read(f"{run}/latest.json"))
    model = load_safetensors(view.read(f"{run}/{p['path']}/model.safetensors"))
    optim = load_safetensors(view.read(f"{run}/{p['path']}/optimizer.safetensors"))
    return model, optim, p


def compare_runs(view_a, run_a: str, runs_a: Path, view_b, run_b: str, runs_b: Path) -> list[str]:
    """Differences between two completed runs: weights, moments, metrics, validation loss (exact)."""
    import torch

    out = []
    ma, oa, pa = final_state(view_a, run_a)
    mb, ob, pb = final_state(view_b, run_b)
    if not (pa.get("complete") and pb.get("complete")) or pa["step"] != pb["step"]:
        out.append(f"{run_b}: pointer step {pb['step']} complete={pb.get('complete')}, reference {pa['step']}")
    for what, a, b in (("weights", ma, mb), ("optimizer", oa, ob)):
        if a.keys() != b.keys():
            out.append(f"{run_b}: {what} tensor names differ")
            continue
        bad = [k for k in a if not torch.equal(a[k], b[k])]
        if bad:
            out.append(f"{run_b}: {what} differ from the uninterrupted run in {len(bad)} tensors, e.g. {bad[0]}")
    keys = ("step", "loss", "grad_norm", "samples_consumed")
    ta = [tuple(r.get(k) for k in keys) for r in read_metrics(runs_a / run_a / "metrics.jsonl")]
    tb = [tuple(r.get(k) for k in keys) for r in read_metrics(runs_b / run_b / "metrics.jsonl")]
    if ta != tb:
        first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        out.append(f"{run_b}: metrics differ from the uninterrupted run from row {first} "
                   f"({ta[first] if first < len(ta) else None} vs {tb[first] if first < len(tb) else None})")
    if pa.get("val_loss") != pb.get("val_loss"):
        out.append(f"{run_b}: val_loss {pb.get('val_loss')} vs {pa.get('val_loss')}")
    return out
