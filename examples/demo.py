"""`make demo`: one small run told as the relay baton is for, in six headed blocks.

Every block runs the real `baton` commands in processes of their own and shows their output as a user sees
it. The run is configs/demo.toml: demo/remote/ plays the store and the published dataset, demo/machine/ the
disk of the machine a session runs on.

1. the data: prepared once and published to the remote folder;
2. the plan: `baton plan` and `baton simulate` against a small made-up quota;
3. session 1 is stopped halfway by SIGTERM (what a spot VM's preemption or a platform's quota end sends):
   it checkpoints at the next step boundary, verifies the checkpoint in the store and exits 0;
4. the machine's disk is deleted, and session 2, on the empty machine, pulls the data and the checkpoint and
   finishes; the ledger and the checkpoint's per-step metrics prove that no step was lost or repeated;
5. `baton status`, `baton ledger` and `baton report`;
6. the held-out loss and bits per byte beside a model that learned nothing, and a sample.

    python examples/demo.py [--config configs/demo.toml] [--set KEY=VALUE ...]

`--set` reaches every command (the test suite shortens the run with it). The demo starts from nothing: it
deletes the folders the config names under the store, the dataset and the machine before it begins. It
exits 0 when every check held, 1 when one did not (the line says which), and 2 for a command that failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import baton
from baton.checkpoint.pointer import read_pointer
from baton.planning.ledger import read_ledger
from baton.store import open_store
from baton.store.base import Store

# What the plan and the simulation assume: sessions of 90 s on a platform that grants 0.1 GPU-hours a day,
# and a rate near what two CPU cores measure for the demo's model (before the first session there is no
# measured rate; afterwards `baton plan` takes the ledger's).
PLAN = ["--rate", "8000", "--session-hours", "90s", "--margin", "15s", "--startup", "10s",
        "--quota-hours", "0.1", "--quota-period-days", "1"]
SIMULATE = ["--runs", "500", "--interrupt-rate", "20", "--seed", "0"]
SAMPLE = ["--prompt", "def ", "--max-new-tokens", "96", "--seed", "0"]
# Session 1 is stopped once its metrics show this fraction of the horizon done.
STOP_FRACTION = 0.5
POLL_S = 0.02


class DemoFailed(Exception):
    """A check of the demo did not hold: exit 1 with the reason."""


def header(number: int, title: str, what: str) -> None:
    print(f"\n{'=' * 100}\n {number}/6  {title}\n{'=' * 100}", flush=True)
    print(what, flush=True)


def show(args: list[str]) -> None:
    print(f"\n$ baton {shlex.join(args)}", flush=True)


def start(args: list[str]) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """`baton ARGS` in a process of its own, its output (stdout and stderr) copied here line by line."""
    show(args)
    # Without the libraries' download and loading bars, which say nothing here. OpenMP's waiting threads sleep
    # rather than spin (unless the user set the policy): on two cores shared with anything else, a spinning
    # thread takes the core its partner needs (measured beside other work: 2.5 s a step instead of 0.25).
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "TQDM_DISABLE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "baton.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []

    def copy() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            print("    " + line.rstrip("\n"), flush=True)

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    return proc, lines, reader


def finish(proc: subprocess.Popen[str], reader: threading.Thread, args: list[str]) -> None:
    rc = proc.wait()
    reader.join()
    if rc != 0:
        print(f"demo: `baton {' '.join(args)}` exited {rc}", file=sys.stderr)
        raise SystemExit(2)


def cli(*args: str) -> str:
    proc, lines, reader = start(list(args))
    finish(proc, reader, list(args))
    return "".join(lines)


def last_step(metrics: Path) -> int:
    """The newest step in the session's metrics.jsonl (written after every step), 0 before the first."""
    try:
        rows = metrics.read_text().splitlines()
    except FileNotFoundError:
        return 0
    for row in reversed(rows):
        try:
            return int(json.loads(row)["step"])
        except (ValueError, KeyError):  # the line being written
            continue
    return 0


def interrupted_session(args: list[str], metrics: Path, stop_step: int, total: int) -> None:
    proc, _, reader = start(args)
    while proc.poll() is None and last_step(metrics) < stop_step:
        time.sleep(POLL_S)
    if proc.poll() is not None:
        finish(proc, reader, args)
        raise DemoFailed(f"session 1 ended before step {stop_step} of {total}, before it could be interrupted")
    at = last_step(metrics)
    print(f"\n$ kill -TERM {proc.pid}    # at step {at} of {total}: the signal a preemption or a quota end sends",
          flush=True)
    proc.send_signal(signal.SIGTERM)
    finish(proc, reader, args)
    print(f"\nsession 1 exited 0 after the signal (step {at} was done when it arrived)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", "-c", default="configs/demo.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    opts = parser.parse_args(argv)
    try:
        return demo(opts.config, [a for kv in opts.set for a in ("--set", kv)])
    except DemoFailed as e:
        print(f"\ndemo: FAILED: {e}", file=sys.stderr)
        return 1


def demo(config: str, sets: list[str]) -> int:
    began = time.monotonic()
    cpu_began = os.times()
    cfg = baton.load_config(config, sets[1::2])
    c = ["-c", config, *sets]
    run, total = cfg.run.name, cfg.train.steps
    machine = [Path(cfg.run.local_dir), Path(cfg.data.dir)]
    run_dir = machine[0] / run
    # The demo deletes these folders first: each must be a local folder of its own, never a real store and
    # never the working folder or one above it.
    fresh = [Path(cfg.store.url) / run, Path(cfg.data.url), *machine]
    here = Path.cwd().resolve()
    unsafe = [f"{key}={url!r}" for f, url, key in zip(fresh, (cfg.store.url, cfg.data.url, cfg.run.local_dir, cfg.data.dir),
                                              ("store.url", "data.url", "run.local_dir", "data.dir"))
              if not url or "://" in url or f.resolve() in (here, *here.parents)]
    if unsafe:
        print(f"demo: {', '.join(unsafe)}: the demo deletes this folder first, so it must be a local folder, "
              "not the working folder or one above it", file=sys.stderr)
        return 2
    for folder in fresh:
        shutil.rmtree(folder, ignore_errors=True)  # the demo starts from nothing

    header(1, "the data: prepared once, published beside the store",
           f"The sources are tokenized into shards with a manifest in {cfg.data.dir}, then published to "
           f"{cfg.data.url}, where every later machine pulls them from.")
    cli("prepare", *c, "--publish", "--no-progress")

    header(2, "the plan: sessions, finish and GPU-hours against a quota",
           f"Before any GPU-hour is spent: {total} steps split into sessions of a 90 s platform limit on a "
           "quota of 0.1 GPU-hours a day, then the same relay with sessions cut at random (20 an hour).")
    cli("plan", *c, *PLAN)
    cli("simulate", *c, *PLAN, *SIMULATE)

    stop_step = max(1, int(total * STOP_FRACTION))
    header(3, "session 1: interrupted halfway",
           f"Training starts from nothing. Once step {stop_step} is done the session gets SIGTERM, as from a "
           "preemption or the end of a quota: it finishes the step, pushes a checkpoint, verifies it in the "
           "store, rolls the pointer and exits 0.")
    interrupted_session(["train", *c, "--no-progress"], run_dir / "metrics.jsonl", stop_step, total)
    store = open_store(cfg.store.url)
    pointer = read_pointer(store, run)
    if pointer is None:
        raise DemoFailed("session 1 left no pointer in the store")
    print(f"the store's pointer {run}/latest.json: step {pointer.step}, {pointer.path}, verified", flush=True)

    header(4, "session 2: a new, empty machine resumes from the store",
           f"The machine's disk ({', '.join(map(str, machine))}) is deleted. The same command pulls the dataset "
           "and the checkpoint the pointer names, checks both, and trains to the horizon.")
    print(f"\n$ rm -rf {' '.join(map(str, machine))}", flush=True)
    for folder in machine:
        shutil.rmtree(folder)
    cli("train", *c, "--no-progress")
    print("\n" + relay_proof(store, run, total), flush=True)

    header(5, "what the store knows: status, ledger, report",
           "Anyone with the config can ask the store, from any machine: where the run is, every session's "
           "billed hours, and a report with plots built from the store alone.")
    cli("status", *c)
    cli("ledger", *c)
    out = cli("report", *c)
    report = Path(out.split("report: ", 1)[1].split(" (", 1)[0]) if "report: " in out else None
    if report is not None:
        plots = sorted(p.name for p in report.parent.glob("*.png"))
        print(f"plots in {report.parent}/: {', '.join(plots)}", flush=True)

    header(6, "the model: held-out score and a sample",
           "The final checkpoint scored on held-out windows, beside a model that learned nothing, then a "
           "sample from the exported Hugging Face folder.")
    cli("eval", *c)
    heldout = json.loads(store.read_text(f"{run}/eval/{total}.json") or "{}")["heldout"]
    uniform = math.log2(cfg.model.vocab_size) * heldout["tokens"] / heldout["bytes"]
    print(f"\nbits per byte on {heldout['bytes']:,} held-out bytes: {heldout['bits_per_byte']:.2f} after {total} "
          f"steps; a model that learned nothing (every one of {cfg.model.vocab_size} tokens equally likely) "
          f"scores {uniform:.2f}", flush=True)
    cli("sample", "--from", str(run_dir / "final"), *SAMPLE)

    cpu = os.times()
    cpu_s = (cpu.children_user + cpu.children_system + cpu.user + cpu.system
             - cpu_began.children_user - cpu_began.children_system - cpu_began.user - cpu_began.system)
    print(f"\ndemo done in {time.monotonic() - began:.0f} s ({cpu_s:.0f} s of CPU). Ask the store again at "
          f"any time: baton status -c {config}", flush=True)
    return 0


def relay_proof(store: Store, run: str, total: int) -> str:
    """With baton's own readers, from the ledger and the final checkpoint's per-step metrics: two sessions, the second resumed at the
    first's last verified checkpoint, every step trained exactly once. DemoFailed when any of it does not
    hold."""
    records, problems = read_ledger(store, run)
    sessions = [r for r in records if r.kind is None]
    if problems or len(sessions) != 2:
        raise DemoFailed(f"the ledger holds {len(sessions)} training sessions, not 2 ({problems})")
    first, second = sessions
    verified = max(first.verified_steps(), default=None)
    if verified is None or first.steps_to != verified or second.steps_from != verified or second.steps_to != total:
        raise DemoFailed(f"the sessions do not join: session 1 {first.steps_from} -> {first.steps_to} (last "
                         f"verified checkpoint {verified}), session 2 {second.steps_from} -> {second.steps_to}")
    pointer = read_pointer(store, run)
    if pointer is None:
        raise DemoFailed("the store holds no pointer after session 2")
    rows = (store.read_text(f"{run}/{pointer.path}/metrics.jsonl") or "").splitlines()
    steps = [json.loads(r)["step"] for r in rows if r.strip()]
    if steps != list(range(1, total + 1)):
        missing = sorted(set(range(1, total + 1)) - set(steps))
        repeated = sorted({s for s in steps if steps.count(s) > 1})
        raise DemoFailed(f"the final checkpoint's metrics miss steps {missing[:10]} and repeat {repeated[:10]}")
    return (f"ledger: session 1 ({first.session}) trained steps {first.steps_from} -> {first.steps_to}, ended "
            f"'{first.outcome}', last verified checkpoint: step {verified}\n"
            f"        session 2 ({second.session}) resumed at step {second.steps_from} and trained "
            f"{second.steps_from} -> {second.steps_to}, ended '{second.outcome}'\n"
            f"the final checkpoint's per-step metrics: {len(steps)} rows, steps 1 to {total} each exactly once "
            f"(no step lost, none repeated)")


if __name__ == "__main__":
    raise SystemExit(main())
