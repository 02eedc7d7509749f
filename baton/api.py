"""The Python API: what ``baton prepare | train | status | plan | export`` do, as functions for a notebook
or a script. The CLI is a thin layer over the same functions.

Every problem a user can fix is raised as a ``baton.BatonError`` subclass carrying the same one-line
message the CLI prints; in a notebook it shows as that one line, not as a traceback.

    import baton
    cfg = baton.load_config("configs/tiny.toml", {"train.steps": 200})
    baton.prepare(cfg)
    summary = baton.train(cfg, session_hours=12, nproc=2)
    baton.status(cfg)["pointer_step"]
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import faults
from .errors import BatonError, ConfigError

if TYPE_CHECKING:
    from .config import Config
    from .runtime.launch import LaunchSpec


class LaunchFailed(BatonError):
    """A multi-process run ended badly; every rank's error is shown above it and in the rank logs."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _console() -> int:
    """Show baton's log lines on stderr (in a notebook: the cell), as the CLI does; returns this rank."""
    from .runtime import logs

    rank = int(os.environ.get("RANK", 0))
    logs.setup(rank)
    return rank


def _kinds(tp: Any) -> str:
    """A type hint in words, for the line that says what an argument takes."""
    import typing

    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_kinds(a) for a in args)
    if args:  # Iterable[str], Mapping[str, Any]
        return "a mapping of str keys" if len(args) == 2 else f"a list of {_kinds(args[0])}"
    if tp is type(None):
        return "None"
    if getattr(tp, "__name__", "") == "Config":
        return "the Config that baton.load_config(path) returns"
    return getattr(tp, "__name__", str(tp))


_REFUSED = object()


def _taken(tp: Any, value: Any) -> Any:
    """``value`` as an argument of type ``tp`` takes it, or _REFUSED. A str (or a Path) where a collection
    of them is expected is one item, never its letters."""
    import typing
    from collections.abc import Iterable, Mapping

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for member in args:
            if (got := _taken(member, value)) is not _REFUSED:
                return got
        return _REFUSED
    if origin is not None and issubclass(origin, Mapping):
        return value if isinstance(value, Mapping) and all(isinstance(k, str) for k in value) else _REFUSED
    if origin is not None and issubclass(origin, Iterable):
        items = [value] if isinstance(value, (str, os.PathLike)) else value
        if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
            return _REFUSED
        items = list(items)
        return items if all(_taken(args[0], v) is not _REFUSED for v in items) else _REFUSED
    if tp is type(None):
        return value if value is None else _REFUSED
    if isinstance(value, bool) and tp is not bool:  # True is an int to Python, never a count or a path to baton
        return _REFUSED
    if tp is float:
        return value if isinstance(value, (int, float)) else _REFUSED
    return value if isinstance(value, tp) else _REFUSED


def checked(fn: Any) -> Any:
    """The API function ``fn`` with its arguments checked against its own annotations before it runs: a
    wrong type is one ConfigError naming the argument and what it takes; a Config is checked as the CLI
    checks it (every field's type and value, even one changed in place, and the store's, run's and data's
    folders)."""
    import functools
    import inspect

    sig = inspect.signature(fn)
    hints: dict[str, Any] = {}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not hints:  # resolved at the first call: the annotations name classes imported only then
            import typing

            from .config import Config
            from .runtime.launch import LaunchSpec

            hints.update(typing.get_type_hints(fn, {**fn.__globals__, "Config": Config, "LaunchSpec": LaunchSpec}))
        from .guard import check_environment

        check_environment()
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ConfigError(f"baton.{fn.__name__}: {e}") from None
        for name, value in bound.arguments.items():
            if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD or name not in hints:
                continue
            got = _taken(hints[name], value)
            if got is _REFUSED:
                from .guard import shown

                raise ConfigError(f"baton.{fn.__name__}: {name} must be {_kinds(hints[name])}, got "
                                  f"{type(value).__name__} {shown(repr(value), 80)}")
            bound.arguments[name] = got
            if type(got).__name__ == "Config" and hints[name] is not Any:
                from .guard import check_layout

                got.validate()  # every field's type and value again, as a file's are: it may have been changed in place
                check_layout(got)
        return fn(*bound.args, **bound.kwargs)

    return call


@checked
def load_config(path: str | Path | None = None,
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> Config:
    """Read a TOML config (or start from the defaults when ``path`` is None) and apply overrides.

    ``overrides`` is a mapping ``{"optim.lr": 3e-4, "store.url": "hf://me/run"}`` or the CLI's
    ``["optim.lr=3e-4", ...]`` strings. Raises ``ConfigError`` listing every problem at once.
    """
    from .config import load_config as load

    if isinstance(overrides, Mapping):
        # A JSON literal is a TOML literal for the value types a config holds (strings, numbers, booleans,
        # lists of them), so a Python value arrives typed exactly, never re-guessed from its text.
        items, wrong = [], []
        for key, value in overrides.items():
            try:
                items.append(f"{key}={json.dumps(value)}")
            except (TypeError, ValueError):  # not a JSON value: an object, a set, a list that holds itself
                wrong.append(f"{key}: {type(value).__name__} {value!r}")
        if wrong:
            raise ConfigError(f"overrides: {'; '.join(wrong)} is not a config value (use a string, number, boolean "
                              "or a list of them)")
    else:
        items = list(overrides or ())
    return load(path, items)


@checked
def prepare(cfg: Config, *, force: bool = False, progress: bool = True, publish: bool = False) -> dict[str, Any]:
    """Tokenize the configured sources into ``data.dir``; returns the manifest. Reuses a matching folder.

    ``publish`` then pushes the prepared dataset to ``data.url``, verified (see :func:`publish_data`).
    """
    from .data.prepare import prepare as run_prepare
    from .guard import check_layout

    check_layout(cfg, ("data.dir", "data.url") if publish else ("data.dir",))  # the folders it writes take a write

    _console()
    if publish:
        from .data.remote import data_store

        data_store(cfg)  # no data.url: said before hours of preparing, not after
    m = run_prepare(cfg, force=force, progress=progress)
    print(f"prepared {cfg.data.dir}: {m['total_tokens']:,} tokens in {m['n_shards']} shards, "
          f"vocab {m['tokenizer']['vocab_size']}, fingerprint {m['fingerprint']}")
    if publish:
        publish_data(cfg)
    return m


@checked
def publish_data(cfg: Config) -> str:
    """Push the prepared ``data.dir`` to ``data.url``, every file verified, the manifest last; returns the summary line.

    A rerun after a kill uploads only what the store does not already hold verified.
    """
    from .data.publish import publish
    from .guard import check_layout

    check_layout(cfg, ("data.url",))
    _console()
    line = publish(cfg).line()
    print(line)
    return line


def _check_hub_writes(cfg: Config) -> None:
    """A token that may only read a Hub store or publish target is refused now, not at the first checkpoint
    push or at the horizon's publish hours later (one whoami request each; no verdict, no refusal)."""
    from .store import RetryPolicy
    from .store.hub import HubStore

    for key, url in (("store.url", cfg.store.url), ("publish.url", cfg.publish.url)):
        if url.startswith("hf://"):
            HubStore.from_url(url, RetryPolicy.from_config(cfg.store), key=key).check_write_access()


@checked
def train(cfg: Config, *, resume: str = "auto", stop_after_steps: int | None = None,
          session_hours: float | str | None = None, deadline: str | None = None, nproc: int = 1,
          allow_change: Iterable[str] = (), progress: bool = True, launch: LaunchSpec | None = None,
          session_start: float | None = None, stream_output: bool = True, take_over: bool = False,
          _own_process: bool = False) -> dict[str, Any]:
    """Resume from the store and train to the next stop boundary; returns the session's summary.

    ``session_hours`` (9, "9h", "90m") or ``deadline`` (ISO 8601) set the time budget, counted from this
    process's start (in a notebook: the kernel's, close to the platform's session start) unless
    ``session_start`` (epoch seconds) says otherwise. ``nproc > 1`` (or a multi-node ``launch``) runs the
    ranks under torchrun, as ``baton train --nproc``; with ``stream_output`` their output is copied into
    this process's stdout, which in a notebook is the cell. A stop signal (SIGTERM, the notebook's
    interrupt) checkpoints at the next step boundary and returns normally.

    One session trains a run at a time (docs/concurrency.md): while another holds the run's lease this raises
    LeaseHeld naming it; ``take_over=True`` takes the run from it (that session is fenced). A session whose lease
    is taken over while it trains raises Fenced.
    """
    from .runtime.launch import LaunchSpec
    from .session.clock import session_clock

    rank = _console()
    from .guard import check_layout

    check_layout(cfg, ("store.url", "run.local_dir", "publish.url"))  # the folders it writes take a write
    if stop_after_steps is not None and stop_after_steps <= 0:
        raise BatonError(f"--stop-after-steps must be a positive step number, got {stop_after_steps!r}")
    spec = launch or LaunchSpec(nproc=nproc)
    if type(spec.nproc) is not int or spec.nproc < 1:
        raise BatonError(f"--nproc must be a whole number >= 1, got {spec.nproc!r}")
    from .tracking import check_installed

    check_installed(cfg.log.backends)  # one line before any launch, not one per rank after it
    from .guard import resume_folder

    resume_folder(resume)  # said before the session starts: a session that starts writes its ledger record
    if cfg.publish.url and (cfg.eval.files or cfg.eval.tasks):
        from .evaluate.run import Plan

        Plan(cfg)  # the horizon's publish evaluates these: a missing file or unknown task is said now, not then
    if rank == 0:
        _check_hub_writes(cfg)
    from .session.drift import validate_allowed

    allowed = tuple(sorted(validate_allowed(list(allow_change))))
    started, stop_at = session_clock(cfg, session_start, session_hours, deadline)
    from .runtime.dist import under_torchrun

    launched = under_torchrun()  # a rank of a launch: torchrun set RANK and WORLD_SIZE (RANK alone is a stray one)
    if launched and (spec.nproc > 1 or spec.multi_node):
        raise BatonError("--nproc or a multi-node launch given inside a launched rank (RANK and WORLD_SIZE are set): "
                         "one launcher starts the ranks; unset RANK and WORLD_SIZE, or drop --nproc")
    if not launched and (spec.nproc > 1 or spec.multi_node):
        summary = _launched(cfg, spec, rank_args(cfg, resume, stop_after_steps, started, stop_at, allowed, progress,
                                                 take_over), stream_output)
        _requeue(summary)
        return summary
    from .runtime.process import Restored
    from .session.clock import HeldSignals

    # A stop signal before the session listens (the imports below) is handed to it; one after it closed finds the
    # work done: neither ends the process at once. Called from Python, what the session set for the whole process
    # (threads, determinism, seeded generators, hooks, its log file) is put back when it returns.
    with HeldSignals(), (nullcontext() if _own_process else Restored()):
        from .loop import run
        from .runtime import dist, logs

        # This rank's log file from the start, so a failure before training still lands in it.
        logs.setup(rank, cfg.run_dir / "logs")
        faults.point("session.start")
        summary = run(cfg, resume=resume, stop_after=stop_after_steps, progress=progress, deadline=stop_at,
                      started=started, allow_change=allowed, take_over=take_over)
        faults.point("session.closed")
        dist.shutdown()  # a clean exit leaves no process group behind (NCCL warns, and may hang, otherwise)
        at_horizon = summary.get("steps_done") == summary.get("total_steps")  # not a periodic validation
        if at_horizon and summary.get("val_loss") is not None and rank == 0:
            print(f"final validation: loss {summary['val_loss']:.4f}, perplexity {summary['val_ppl']:.2f}")
        if not launched:  # a rank of a launch leaves it to its launcher
            _requeue(summary)
    return summary


def _requeue(summary: dict[str, Any]) -> None:
    """The SLURM job's requeue that rank 0 decided (``session.finish.requeue_plan``), by the process SLURM
    started for the task that holds rank 0, after every rank is done: the requeue ends the job at once."""
    if not summary.get("requeue"):
        return
    from .runtime import slurm

    job, ran = slurm.current_job(query=False), summary.get("slurm") or {}
    if job is None or (job.job_id, job.proc_id) != (ran.get("job_id"), ran.get("proc_id")):
        return  # another task of the step (another node) holds rank 0: it requeues
    slurm.requeue(job)


def rank_args(cfg: Config, resume: str, stop_after_steps: int | None, started: float, stop_at: float | None,
              allow_change: tuple[str, ...], progress: bool, take_over: bool = False) -> list[str]:
    """The ``baton train`` flags of every rank: the resolved config as a file, and the launcher's clock as
    absolute instants, so every rank stops by the launcher's clock rather than its own later start."""
    from .config import config_json

    path = cfg.run_dir / "launch" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(config_json(cfg), encoding="utf-8")
    tmp.replace(path)
    out = ["--config", str(path), "--resume", resume, "--session-start", repr(started)]
    if stop_after_steps is not None:
        out += ["--stop-after-steps", str(stop_after_steps)]
    if stop_at is not None:
        out += ["--deadline", datetime.fromtimestamp(stop_at, timezone.utc).isoformat()]
    for key in allow_change:
        out += ["--allow-change", key]
    if not progress:
        out.append("--no-progress")
    if take_over:
        out.append("--take-over")
    return out


def _launched(cfg: Config, spec: LaunchSpec, args: list[str], stream_output: bool) -> dict[str, Any]:
    from .runtime.launch import check_devices, check_geometry, launch

    spec.check()
    check_devices(spec, cfg.train.device)  # first: a GPU count is the plainer fix than a batch geometry
    check_geometry(spec, cfg.train.global_batch, cfg.train.micro_batch)
    summary_path = cfg.run_dir / "run_summary.json"
    before = summary_path.stat().st_mtime if summary_path.exists() else None
    t0 = time.time()
    from .runtime.slurm import warning_signal

    rc = launch(spec, args, cfg.run_dir / "logs", cfg.run.name, output=sys.stdout if stream_output else None,
                signals=(warning_signal(cfg.train.slurm_signal),))
    if rc:
        raise LaunchFailed(f"the {spec.nproc}-process run failed (exit status {rc}); each rank's error is shown "
                           f"above and in {cfg.run_dir / 'logs'}", rc)
    if summary_path.exists() and summary_path.stat().st_mtime != before and summary_path.stat().st_mtime >= t0 - 1:
        return json.loads(summary_path.read_text(encoding="utf-8"))
    # Rank 0 writes no summary when there was nothing to train (the run is complete): say what the store holds.
    s = status(cfg)
    return {"complete": s["complete"], "steps_done": s["pointer_step"], "total_steps": s["total_steps"]}


@checked
def anneal(cfg: Config, step: int, *, tokens: int | str | None = None, fraction: float | None = None,
           stop_after_steps: int | None = None, session_hours: float | str | None = None, deadline: str | None = None,
           nproc: int = 1, progress: bool = True, stream_output: bool = True, take_over: bool = False,
           _own_process: bool = False) -> dict[str, Any]:
    """`baton anneal`: a cooldown branch of ``cfg``'s run (wsd schedule) from its verified plateau checkpoint at
    ``step``, over ``tokens`` more tokens ("50M", 5e7) or ``fraction`` of the tokens seen at ``step``: the config's
    decay shape from the peak learning rate, the data continuing where the main run's would, ending in an export
    (and a publish at a revision named for the branch when publish.url is set). Trained under
    ``<run>/branches/anneal-<step>-<tokens>/`` as a run of its own: the same resume, checkpoints, verification
    and lease as ``train``, whose arguments the rest are; run it again to continue it. The main run is only read.
    Every check is made before anything is written (``AnnealError``); returns the session's summary."""
    from .planning.plan import parse_count
    from .session.branch import plan_anneal

    _console()
    if type(step) is not int or step < 1:  # bool is an int to Python, never a step to baton
        raise BatonError(f"anneal: step must be a verified checkpoint's step (a whole number >= 1), got {step!r}")
    count = parse_count(tokens, "--tokens") if tokens is not None else None
    plan = plan_anneal(cfg, step, count, fraction)
    if stop_after_steps is not None and stop_after_steps <= step:
        raise BatonError(f"--stop-after-steps {stop_after_steps} is not after the branch point (step {step}): the "
                         f"branch trains steps {step + 1} to {plan.config.total_steps}")
    where = "continuing it" if plan.pointer is not None else "starting it"
    print(f"cooldown branch {plan.name}: from step {plan.step:,} of run {cfg.run.name!r}, {plan.steps:,} steps of "
          f"{cfg.tokens_per_step:,} tokens ({plan.tokens:,} tokens) to step {plan.config.total_steps:,}; {where} under "
          f"{plan.config.run.name}/ in {cfg.store.url}", flush=True)
    summary = train(plan.config, stop_after_steps=stop_after_steps, session_hours=session_hours, deadline=deadline,
                    nproc=nproc, progress=progress, stream_output=stream_output, take_over=take_over,
                    _own_process=_own_process)
    return {**summary, "branch": plan.name}


@checked
def branch(cfg: Config, name: str) -> Config:
    """The config of the cooldown branch ``name`` (``anneal-<step>-<tokens>``, as ``status(cfg)["branches"]`` lists
    them) of ``cfg``'s run: what ``status``, ``export``, ``eval`` and ``publish`` are given to act on the branch."""
    from .session.branch import branch_config

    return branch_config(cfg, name)


@checked
def status(cfg: Config) -> dict[str, Any]:
    """What the store holds for the run: pointer, verified checkpoints, tokens, measured rate, ETA, ledger."""
    from .views.status import status as run_status

    _console()
    return run_status(cfg)


def _options(name: str, add_options: Any, options: dict[str, Any]) -> Any:
    """``options`` (a command's flags, with underscores) parsed as that command's flags are."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"baton.{name}", add_help=False)
    add_options(parser)  # the command's flags, with their defaults and their own parsers
    args = parser.parse_args([])
    actions = {a.dest: a for a in parser._actions if a.dest != "tripwire"}
    unknown = sorted(set(options) - set(actions))
    if unknown:
        raise BatonError(f"{name}: no option {', '.join(unknown)} (valid: {', '.join(sorted(actions))})")
    for key, value in options.items():
        action = actions[key]
        if isinstance(action, argparse._StoreTrueAction):
            setattr(args, key, bool(value))
            continue
        kind = action.type  # the flag's own parser (checked numbers); durations and counts stay text
        try:
            setattr(args, key, None if value is None else kind(str(value)) if callable(kind) else str(value))
        except argparse.ArgumentTypeError as e:
            raise BatonError(f"{name}: {key}={value!r}: {e}") from None
    return args


@checked
def plan(cfg: Config | None = None, **options: Any) -> dict[str, Any]:
    """Sessions, calendar and GPU-hours for the run, as ``baton plan --json`` (without tripwires).

    ``options`` are ``baton plan``'s flags with underscores: ``rate="7.7k"``, ``session_hours=12``,
    ``target_tokens="1B"``, ``quota_hours=30``, ... The result's ``"text"`` is the table the CLI prints.
    """
    from .planning.plan import plan as make_plan
    from .views.plan import format_plan, plan_input, plan_options

    _console()
    inp, sources, _ = plan_input(_options("plan", plan_options, options), cfg)
    p = make_plan(inp)
    return p.to_dict() | {"sources": sources, "text": format_plan(p, sources)}


@checked
def simulate(cfg: Config | None = None, **options: Any) -> dict[str, Any]:
    """The relay on a simulated clock, as ``baton simulate --json``: P10/P50/P90 of the finish date, billed
    GPU-hours, sessions and steps lost, and the chances of the deadline and the cap.

    ``options`` are ``baton simulate``'s flags with underscores: the plan's (``rate="7.7k"``,
    ``session_hours=12``, ...) and ``runs``, ``seed``, ``interrupt_rate`` (per hour), ``trace`` ("ledger" or a
    file of session lifetimes), ``outage_rate``, ``outage_minutes``, ``curve``. The result's ``"text"`` is the
    table the CLI prints.
    """
    from dataclasses import replace

    from .planning.simulate import cadence_curve, curve_minutes
    from .planning.simulate import simulate as run_simulation
    from .views.simulate import format_sim, sim_input, sim_options

    _console()
    args = _options("simulate", sim_options, options)
    si, sources = sim_input(args, cfg)
    r = run_simulation(si)
    curve = cadence_curve(replace(si, runs=min(si.runs, 500)), curve_minutes(si)) if args.curve else None
    return r.to_dict() | {"sources": sources, "curve": curve, "text": format_sim(r, sources, curve)}


@checked
def export(cfg: Config, out: str | Path, source: str = "store", step: int | None = None, *,
           force: bool = False) -> Path:
    """Write the run's latest verified checkpoint (the verified one at ``step``, or the local checkpoint
    folder ``source``) as a Hugging Face model folder; returns it.

    ``out`` must be new or empty (``force`` writes into it anyway) and never inside the store, the run
    folder or the data folder.
    """
    from .guard import output_dir
    from .model.export import export_run

    _console()
    path = export_run(cfg, source, output_dir(out, "--out", cfg, force), step)
    print(f"exported to {path}")
    return path


@checked
def eval(cfg: Config, step: int | None = None, *, files: Iterable[str | Path] | None = None,  # noqa: A001 - `baton eval`
         tasks: Iterable[str] | None = None) -> dict[str, Any]:
    """`baton eval`: score the verified checkpoint at ``step`` (None: the pointer's) on the run's held-out
    windows, ``files`` and lm-eval ``tasks`` (None: the config's eval.files / eval.tasks); the record is written
    to ``<run>/eval/<step>.json`` in the store and returned."""
    from .evaluate.run import run_eval

    _console()
    record, _ = run_eval(cfg, step, None if files is None else [os.fspath(f) for f in files],
                         None if tasks is None else list(tasks))
    return record.to_json()


@checked
def publish(cfg: Config, step: int | None = None, *, revision: str | None = None) -> dict[str, Any]:
    """`baton publish`: the verified checkpoint at ``step`` (None: the pointer's) with its model card at
    ``publish.url``, at ``revision`` (a branch of a Hub repository, a folder elsewhere) when given; returns
    the target, the step, the verified files and the card's key."""
    from .release.publish import publish as publish_step

    _console()
    return publish_step(cfg, step, revision)
