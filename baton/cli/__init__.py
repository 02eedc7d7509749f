"""`baton`: one command, one subcommand per job. User errors exit 2 with one line, never a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .. import __version__
from ..errors import BatonError
from ..guard import check_environment, count, escaped, finite_float, without_credentials

log = logging.getLogger("baton")


class UsageError(BatonError):
    """A command line argparse refused: reported in the one-line form, not as a usage block."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: the same one line as every other input error
        # An argument echoed back may hold a line break; the error stays one line.
        flat = message.replace("\n", "\\n")
        raise UsageError(f"{flat} (see `{self.prog} --help`)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line; a flag no parser knows is named with the help of the command it was given to (argparse
    would point at `baton --help`, which lists commands, not their flags)."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        flat = ' '.join(unknown).replace("\n", "\\n")
        raise UsageError(f"unrecognized arguments: {flat} (see `baton {args.command} --help`)")
    return args


def _config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="TOML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=3e-4 (repeatable)")


def _step_arg(p: argparse.ArgumentParser) -> None:
    """--step of the commands that read any verified checkpoint in the store (export, eval, publish)."""
    p.add_argument("--step", type=count(1), default=None, metavar="N",
                   help="the verified checkpoint at step N in the store (default: the pointer's)")


def build_parser() -> argparse.ArgumentParser:
    from .plan import add_plan_parsers, branch_arg

    parser = _Parser(prog="baton", description="Pretrain small Llama models across interruptible "
                                     "sessions; the baton is the last verified checkpoint in the store.")
    parser.add_argument("--version", action="version", version=f"baton {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare", help="tokenize the configured sources into shards and a manifest")
    _config_args(p)
    p.add_argument("--force", action="store_true", help="prepare again even when the folder matches the config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--publish", action="store_true", help="then publish the prepared folder to data.url, verified")

    p = sub.add_parser("publish-data", help="push the prepared data folder (data.dir) to data.url, verified; a "
                       "rerun uploads only what the store does not hold yet")
    _config_args(p)

    p = sub.add_parser("train", help="resume from the store and train to the next stop boundary")
    _config_args(p)
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                   help="auto: continue from the store's pointer, or start at step 0 when there is none; "
                        "never: start fresh (refused when the store already holds the run); PATH: a local "
                        "checkpoint folder")
    p.add_argument("--stop-after-steps", type=int, default=None, metavar="N",
                   help="end this session at step N (checkpoint included)")
    p.add_argument("--verify", choices=("sample", "full"), default=None,
                   help="read-back after each push: sample (start, end and a random window of every file) or "
                        "full (every byte); shorthand for --set store.verify=...")
    from ..session.drift import allow_change_keys  # the keys the drift check allows: its help is theirs

    p.add_argument("--allow-change", action="append", default=[], metavar="KEY",
                   help=f"resume although KEY differs from the checkpoint, on purpose (repeatable; "
                        f"{allow_change_keys()})")
    p.add_argument("--micro-batch", default=None, metavar="N|auto",
                   help="samples per forward/backward (same as --set train.micro_batch=...); auto: on a GPU, the "
                        "largest that fits, probed at start, with the global batch kept by accumulation")
    p.add_argument("--session-hours", default=None, metavar="H",
                   help="time budget: stop at the last step boundary that leaves time for the final checkpoint "
                        "within H hours of this command starting (9h, 90m, 2.5); default budget.session_hours")
    p.add_argument("--deadline", default=None, metavar="TIME",
                   help="time budget as an instant (ISO 8601, e.g. 2026-09-26T18:00Z); the earlier of the two wins")
    p.add_argument("--session-start", type=finite_float(), default=None, help=argparse.SUPPRESS)  # set by the launcher
    p.add_argument("--take-over", action="store_true",
                   help="take the run over from a session that still holds its lease (that session is fenced: it stops "
                        "at its next write); see docs/concurrency.md")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="processes on this machine, one per GPU (launches torchrun when N > 1 or with --nnodes)")
    g = p.add_argument_group("multi-node (passed to torchrun; see docs/distributed.md)")
    g.add_argument("--nnodes", default="1", metavar="N|MIN:MAX|slurm",
                   help="number of nodes (default 1); slurm: one task per node of an srun step, meeting at the "
                        "step's first host (port 29400 + job id mod 1000, or --rdzv-endpoint's) under the job id "
                        "(docs/slurm.md)")
    g.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="c10d rendezvous endpoint, the same on every node")
    g.add_argument("--rdzv-id", default=None, metavar="ID", help="job id shared by all nodes (default: run name)")
    g.add_argument("--rdzv-backend", default="c10d", metavar="NAME", help="rendezvous backend (default c10d)")
    g.add_argument("--master-addr", default=None, metavar="HOST",
                   help="static rendezvous instead: the address of node 0 (needs --node-rank)")
    g.add_argument("--master-port", type=count(1, 65535), default=None, metavar="PORT", help="static rendezvous port")
    g.add_argument("--node-rank", type=count(0), default=None, metavar="R", help="this node's rank (static rendezvous)")
    g.add_argument("--shutdown-timeout", type=count(1), default=300, metavar="S",
                   help="seconds the ranks get to checkpoint after a stop signal before torchrun kills them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("anneal", help="a cooldown branch from a verified plateau checkpoint of a wsd run: the "
                       "decay over more tokens, ending in an export; rerun to continue it")
    _config_args(p)
    # Required, said by the command in its own words (a number flag's parse error names the flag alone).
    p.add_argument("--step", type=count(1), default=None, metavar="N",
                   help="the main run's verified checkpoint to branch from (on the plateau: after the warmup, not "
                        "past the decay start); required")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tokens", default=None, metavar="T",
                   help="the cooldown's length in tokens (50M, 5e7), rounded down to whole steps")
    g.add_argument("--fraction", type=finite_float(0.0, lo_open=True), default=None, metavar="F",
                   help="the cooldown's length as a share of the tokens seen at --step (0.2 for 20 %%)")
    p.add_argument("--stop-after-steps", type=count(1), default=None, metavar="N",
                   help="end this session at step N (checkpoint included)")
    p.add_argument("--session-hours", default=None, metavar="H",
                   help="time budget, as for train (9h, 90m, 2.5); default budget.session_hours")
    p.add_argument("--deadline", default=None, metavar="TIME", help="time budget as an instant (ISO 8601)")
    p.add_argument("--take-over", action="store_true",
                   help="take the branch over from a session that still holds its lease (docs/concurrency.md)")
    p.add_argument("--nproc", type=count(1), default=1, metavar="N", help="processes on this machine, one per GPU")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("export", help="write the model as a Hugging Face folder")
    _config_args(p)
    branch_arg(p)
    p.add_argument("--out", required=True, help="output folder (new or empty; never inside the store, the run or "
                   "the data folder)")
    p.add_argument("--force", action="store_true", help="write into --out although it already holds files")
    p.add_argument("--from", dest="source", default="store",
                   help="'store' (the run's latest verified checkpoint) or a local checkpoint folder")
    _step_arg(p)

    p = sub.add_parser("eval", help="score a verified checkpoint: held-out loss and bits per byte, eval files, "
                       "lm-eval tasks; written to <run>/eval/<step>.json in the store")
    _config_args(p)
    branch_arg(p)
    _step_arg(p)
    p.add_argument("--tasks", default=None, metavar="A,B", help="lm-evaluation-harness tasks (default: eval.tasks; "
                   "'' for none)")
    p.add_argument("--files", nargs="*", default=None, metavar="FILE", help="text or JSONL files to score "
                   "(default: eval.files)")

    p = sub.add_parser("publish", help="publish a verified checkpoint as a Hugging Face model repository with a "
                       "model card at publish.url")
    _config_args(p)
    branch_arg(p)
    _step_arg(p)
    p.add_argument("--revision", default=None, metavar="NAME", help="publish to this revision (a branch on the "
                   "Hub, a folder elsewhere) instead of the main one, e.g. step-1000 (a cooldown branch's default: "
                   "its name)")

    p = sub.add_parser("sample", help="generate text from an exported model folder")
    p.add_argument("--from", dest="source", required=True, help="an exported model folder (baton export, or "
                   "<run dir>/final)")
    p.add_argument("--prompt", default="def ", help="text to continue")
    p.add_argument("--max-new-tokens", type=count(1), default=64)
    p.add_argument("--temperature", type=finite_float(0.0), default=0.8, help="0 for greedy decoding")
    p.add_argument("--seed", type=count(0, 2**63 - 1), default=0)

    p = sub.add_parser("verify-data", help="rehash every shard and check the manifest")
    _config_args(p, required=False)
    p.add_argument("--dir", help="data folder: a local path or a store URL (file://, s3://, hf://); "
                   "default: data.url of the config when set, else data.dir")
    p.add_argument("--workers", type=count(0), default=0, help="files hashed at once (default: 2 per core, at most 16)")

    p = sub.add_parser("data-info", help="tokens, windows, horizon and margin for the config")
    _config_args(p)
    p.add_argument("--collisions", choices=("auto", "on", "off"), default="auto",
                   help="count validation windows whose first 64 tokens match a training window's "
                        "(auto: when the shards are under 2 GiB)")

    add_plan_parsers(sub, _config_args)
    from .simulate import add_simulate_parser

    add_simulate_parser(sub, _config_args)

    p = sub.add_parser("preflight", help="prove every property on this machine, cheaply, and write a report")
    _config_args(p)
    p.add_argument("--out", required=True, help="folder for report.md, preflight.json and plots")
    p.add_argument("--stages", default=None, help="comma-separated subset of construct,data,storage,throughput,"
                   "resume,stop_probe (default: all, in that order)")
    p.add_argument("--scale", default="tiny", choices=("tiny", "real"),
                   help="tiny: a small stand-in model proves the pipeline; real: the configured shape")
    p.add_argument("--store", default=None, help="store URL for the scratch runs (default: store.url)")
    p.add_argument("--leg-steps", type=int, default=None, help="steps per resume leg (default 4 tiny, 2 real)")
    p.add_argument("--session-hours", type=finite_float(0.0, lo_open=True), default=12.0,
                   help="session length for the plan")
    p.add_argument("--keep-work", action="store_true", help="keep the scratch run folders")
    p.add_argument("--force", action="store_true", help="write into --out although it already holds files")
    p.add_argument("--resume-set", dest="resume_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a change planned between sessions, applied to every resumed leg: proves the resume "
                        "still reads the same data (or shows that it is refused)")

    p = sub.add_parser("report", help="write report.md and plots of the run so far, from the store alone")
    _config_args(p)
    branch_arg(p)
    p.add_argument("--out", default=None, help="output folder (default: <run dir>/report)")

    p = sub.add_parser("config", help="print the resolved config as JSON, or the reference table")
    _config_args(p, required=False)
    p.add_argument("--reference", action="store_true", help="print every key with its default and meaning")
    return parser


# What torchrun tells each rank, as whole numbers.
TORCHRUN_VARIABLES = {"RANK": "a rank number", "LOCAL_RANK": "a rank number", "GROUP_RANK": "a rank number",
                      "WORLD_SIZE": "a process count", "LOCAL_WORLD_SIZE": "a process count"}


def launch_problem(env: Mapping[str, str]) -> str | None:
    """What makes torchrun's variables (each a number by now) describe no process group this one can join: a
    rank past the world, an empty world, no rendezvous address. Joining would wait out the whole distributed
    timeout (ten minutes) and end as a library's error."""
    n = {k: int(env[k]) for k in TORCHRUN_VARIABLES if k in env}
    if "WORLD_SIZE" in n and n["WORLD_SIZE"] < 1:
        return f"WORLD_SIZE={n['WORLD_SIZE']}: a process group has at least one process"
    if "RANK" in n and "WORLD_SIZE" in n and n["RANK"] >= n["WORLD_SIZE"]:
        return f"RANK={n['RANK']} is not a rank of WORLD_SIZE={n['WORLD_SIZE']} (0 to {n['WORLD_SIZE'] - 1})"
    if "LOCAL_RANK" in n and "LOCAL_WORLD_SIZE" in n and n["LOCAL_RANK"] >= n["LOCAL_WORLD_SIZE"]:
        return (f"LOCAL_RANK={n['LOCAL_RANK']} is not a rank of LOCAL_WORLD_SIZE={n['LOCAL_WORLD_SIZE']} "
                f"(0 to {n['LOCAL_WORLD_SIZE'] - 1})")
    if "RANK" in n and "WORLD_SIZE" in n and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        return (f"RANK={n['RANK']} and WORLD_SIZE={n['WORLD_SIZE']} are set, but MASTER_ADDR and MASTER_PORT, where "
                "the ranks meet, are not")
    return None


def main(argv: list[str] | None = None) -> int:
    from ..runtime import logs

    for stream in (sys.stdout, sys.stderr):  # a path's undecodable bytes (surrogates) print escaped, never raise
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")

    for name, what in TORCHRUN_VARIABLES.items():
        # Checked before logging is set up (it needs the rank), in the one line every user error gets; read
        # as numbers later by code paths far from the command line.
        value = os.environ.get(name)
        if value is not None and not (value.isascii() and value.isdigit()):
            print(f"baton: error: the environment variable {name}={value!r} is not {what} (torchrun sets it for "
                  "its ranks; unset it to run one process)", file=sys.stderr)
            return 2
    inconsistent = launch_problem(os.environ)
    if inconsistent:
        print(f"baton: error: {inconsistent} (torchrun sets these for its ranks; unset RANK and WORLD_SIZE to run one "
              "process, or start baton with --nproc)", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", 0))
    logs.setup(rank)
    status = 1
    try:
        check_environment()
        args = parse(argv)
        status = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a reader that has gone is caught below, not in Python's exit
    except BatonError as e:
        # Every rank prints its own error, ranks other than 0 saying which they are; under baton's launcher,
        # which prints each different error once when the ranks are done, only to the log.
        # Escaped here, whatever raised it: a value quoted in a message never reaches the terminal raw (the
        # lines of a config's list of problems stay lines).
        message = escaped(without_credentials(str(e)), keep="\n")
        if not os.environ.get(logs.LAUNCHED):
            print(f"{f'[rank {rank}] ' if rank else ''}baton: error: {message}", file=sys.stderr)
        logs.file_only(logging.ERROR, f"baton: error: {message}")
        status = 2
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        status = 130
    except BrokenPipeError:
        # What reads the output (`| head`, `| true`) has stopped reading: nothing is wrong with the command, and
        # there is nowhere left to say anything. Python's flush of stdout at exit would raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141  # a shell's status for a process ended by SIGPIPE
    except Exception as e:  # a bug or a dead peer: the traceback to a log file, one line naming it to the terminal
        from ..reads import one_line

        path = logs.log_failure(rank, e)
        print(f"{f'[rank {rank}] ' if rank else ''}baton: internal error (a bug, not a problem with the input): "
              f"{type(e).__name__}: {without_credentials(one_line(e))}; the traceback is in {path}", file=sys.stderr)
        status = 1
    logs.exit_record(rank, status)
    return status


def _load(args):
    from ..config import load_config
    from ..guard import check_layout

    cfg = load_config(args.config, args.overrides)
    if getattr(args, "branch", None) is not None:  # --branch NAME: the command acts on that cooldown branch
        from ..session.branch import branch_config

        cfg = branch_config(cfg, args.branch)
    if args.command != "config":  # the store, run and data folders: folders, apart, before any work
        check_layout(cfg)  # (api.train and api.prepare also check that the folders they write take a write)
    return cfg


def cmd_prepare(args) -> int:
    from ..api import prepare

    prepare(_load(args), force=args.force, progress=not args.no_progress, publish=args.publish)
    return 0


def cmd_publish_data(args) -> int:
    from ..api import publish_data

    publish_data(_load(args))
    return 0


def cmd_train(args) -> int:
    if args.micro_batch is not None:  # shorthand for --set train.micro_batch=N|auto, validated with the config
        args.overrides = [*args.overrides, f"train.micro_batch={args.micro_batch}"]
    if args.verify is not None:
        args.overrides = [*args.overrides, f"store.verify={args.verify}"]
    cfg = _load(args)
    from ..api import LaunchFailed, train
    from ..runtime.launch import LaunchSpec

    if args.nnodes == "slurm":
        from ..runtime.slurm import rendezvous

        port = args.rdzv_endpoint.rpartition(":")[2] if args.rdzv_endpoint else None
        if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise BatonError(f"--rdzv-endpoint {args.rdzv_endpoint!r} has no port from 1 to 65535: give HOST:PORT "
                             "(with --nnodes slurm only the port is used)")
        args.nnodes, args.rdzv_endpoint, slurm_id = rendezvous(port=int(port) if port else None)
        args.rdzv_id = args.rdzv_id or slurm_id
    spec = LaunchSpec(nproc=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                      master_port=args.master_port, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                      rdzv_backend=args.rdzv_backend, shutdown_timeout=args.shutdown_timeout)
    try:
        # A terminal shows the ranks' output directly: no copy through this process.
        train(cfg, resume=args.resume, stop_after_steps=args.stop_after_steps, session_hours=args.session_hours,
              deadline=args.deadline, allow_change=args.allow_change, progress=not args.no_progress, launch=spec,
              session_start=args.session_start, stream_output=False, take_over=args.take_over,
              _own_process=True)  # its log file and hooks stay to the end, for the command's own last lines
    except LaunchFailed as e:
        return e.status  # the ranks' errors and the launcher's report are printed already
    return 0


def cmd_anneal(args) -> int:
    if args.step is None:
        raise BatonError("anneal needs --step N: the main run's verified checkpoint to branch from (`baton status` "
                         "lists them)")
    cfg = _load(args)
    from ..api import LaunchFailed, anneal

    try:
        anneal(cfg, args.step, tokens=args.tokens, fraction=args.fraction, stop_after_steps=args.stop_after_steps,
               session_hours=args.session_hours, deadline=args.deadline, nproc=args.nproc,
               progress=not args.no_progress, stream_output=False, take_over=args.take_over, _own_process=True)
    except LaunchFailed as e:
        return e.status
    return 0


def cmd_export(args) -> int:
    from ..api import export

    export(_load(args), args.out, args.source, args.step, force=args.force)
    return 0


def cmd_eval(args) -> int:
    from ..evaluate.run import run_eval

    tasks = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    cfg = _load(args)
    record, key = run_eval(cfg, args.step, args.files, tasks)
    h = record.heldout
    print(f"step {record.step}: held-out loss {h['loss']:.4f}, bits per byte {h['bits_per_byte']:.4f} over "
          f"{h['windows']} windows")
    for name, r in record.files.items():
        print(f"  {name}: loss {r['loss']:.4f}, bits per byte {r['bits_per_byte']:.4f} over {r['tokens']:,} tokens")
    for task, metrics in record.tasks.items():
        print(f"  {task}: " + ", ".join(f"{m} {v:.4f}" for m, v in metrics.items()))
    from ..store import open_store

    print(f"written to {key} in {open_store(cfg.store.url).describe()}")  # a key in the store, not a local path
    return 0


def cmd_publish(args) -> int:
    from ..release.publish import publish

    out = publish(_load(args), args.step, args.revision)
    print(f"published step {out['step']} to {out['target']}: {len(out['files'])} files verified, then {out['card']}")
    return 0


def cmd_sample(args) -> int:
    from ..guard import input_path
    from ..model.export import generate

    folder = input_path(args.source, "--from", "give a folder written by `baton export`, or run `baton export` first",
                        folder=True)
    print(generate(folder, args.prompt, args.max_new_tokens, args.temperature, args.seed))
    return 0


def cmd_verify_data(args) -> int:
    from ..data.verify import verify_data

    if args.dir:
        from ..guard import input_path, local_store_root

        folder = args.dir
        root = local_store_root(folder, "--dir")
        if root is not None:
            input_path(root, "--dir", "give the data folder `baton prepare` wrote", folder=True)
    elif args.config:
        cfg = _load(args)
        folder = cfg.data.url or cfg.data.dir
    else:
        raise BatonError("verify-data needs --dir or --config")
    report = verify_data(str(folder), args.workers)
    for problem in report.problems:
        print(f"MISMATCH {escaped(problem)}")  # names and digests come from a manifest that may be edited
    print(report.summary())
    return 0 if report.ok else 1


def cmd_data_info(args) -> int:
    from ..data.geometry import COLLISION_AUTO_BYTES, COLLISION_K, Geometry, prefix_collisions
    from ..data.reader import WindowDataset

    cfg = _load(args)
    from ..data.pull import ensure_data

    ensure_data(cfg)  # with data.url: the published dataset, pulled and verified here (logged)
    ds = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
    geo = Geometry.of(ds.stream.total, cfg.data.seq_len, ds.n_val, cfg.total_steps, cfg.tokens_per_step)
    for line in geo.lines():
        print(line)
    nbytes = sum(a.nbytes for a in ds.stream.shards)
    if args.collisions == "on" or (args.collisions == "auto" and nbytes <= COLLISION_AUTO_BYTES):
        n = prefix_collisions(ds, COLLISION_K)
        print(f"validation: {n} of {ds.n_val:,} held-out windows share their first {min(COLLISION_K, ds.seq_len)} "
              "tokens with a training window")
    else:
        print("validation: prefix collisions not checked (the shards are large; pass --collisions on)")
    dc = ds.manifest.get("decontamination")
    if dc:
        print(f"decontamination: {dc['dropped_documents']:,} documents ({dc['dropped_tokens']:,} tokens) dropped for "
              f"sharing a {dc['ngram']}-token n-gram with {len(dc['texts'])} evaluation texts")
    print(f"fingerprint {ds.fingerprint}, permutation {ds.permutation_fingerprint}")
    return 0


def cmd_config(args) -> int:
    from ..config import config_json, reference_table

    if args.reference:
        print("| key | type | default | meaning |\n|---|---|---|---|")
        for key, tp, default, meaning in reference_table():
            tp, meaning = tp.replace("|", "\\|"), meaning.replace("|", "\\|")  # a pipe would split the cell
            print(f"| `{key}` | {tp} | `{default}` | {meaning} |")
        return 0
    cfg = _load(args)  # without --config: the defaults, with the --set overrides applied and checked
    print(config_json(cfg))
    return 0


def cmd_bench(args) -> int:
    from .plan import run_bench

    return run_bench(args, _load(args))


def _config_if_given(args):
    """The config of a command that plans with flags alone when there is none. --set then has nothing to change,
    and ignoring it would plan without what it said (a quota, a cap): refused."""
    if args.config:
        return _load(args)
    if args.overrides:
        raise BatonError(f"--set {args.overrides[0]} needs --config: without one, {args.command} takes its inputs from "
                         f"its flags (see `baton {args.command} --help`)")
    return None


def cmd_plan(args) -> int:
    from .plan import run_plan

    return run_plan(args, _config_if_given(args))


def cmd_simulate(args) -> int:
    from .simulate import run_simulate

    return run_simulate(args, _config_if_given(args))


def cmd_ledger(args) -> int:
    from .status import run_ledger

    return run_ledger(args, _load(args))


def cmd_status(args) -> int:
    from .status import run_status

    return run_status(args, _load(args))


def cmd_report(args) -> int:
    from ..guard import output_dir
    from ..report import gather, write_report

    cfg = _load(args)
    # A report is rewritten whole each time; its default place is the run folder, never the store.
    out = output_dir(args.out, "--out", cfg, force=True, own=("the run folder",)) if args.out else cfg.run_dir / "report"
    path = write_report(gather(cfg), out)
    print(f"report: {path} (plots beside it)")
    return 0


def cmd_preflight(args) -> int:
    from ..preflight import parse_stages, run_preflight

    if args.leg_steps is not None and args.leg_steps < 1:
        raise BatonError(f"--leg-steps must be >= 1, got {args.leg_steps}")
    from ..guard import local_store_root, output_dir

    if args.store:
        local_store_root(args.store, "--store")
    cfg = _load(args)
    if args.resume_overrides:  # checked now, not found by the resume legs after the stages before them ran
        from ..config import load_config
        from ..errors import ConfigError

        try:
            load_config(args.config, [*args.overrides, *args.resume_overrides])
        except ConfigError as e:
            raise ConfigError(f"--resume-set: {e}") from None
    out = output_dir(args.out, "--out", cfg, args.force)
    doc = run_preflight(args.config, out, parse_stages(args.stages), args.scale, args.overrides,
                        args.store, args.leg_steps, args.session_hours, args.keep_work, args.resume_overrides)
    for row in doc["scorecard"]:
        print(f"{row['n']:>2}. {row['result']:<10} {row['requirement']}")
        if row["result"] == "fail":  # what failed, where a person looks first
            print(f"    {row['evidence']}")
    stop = doc["stages"]["stop_probe"]["numbers"].get("verdict")
    if stop:
        print(stop)
    from ..preflight.report import proven_line

    print(f"VERDICT {doc['verdict']}  ({proven_line(doc['scorecard'])}; report: {Path(args.out) / 'report.md'})")
    return 0 if doc["verdict"] == "PASS" else 1


COMMANDS = {
    "bench": cmd_bench,
    "plan": cmd_plan,
    "simulate": cmd_simulate,
    "ledger": cmd_ledger,
    "status": cmd_status,
    "report": cmd_report,
    "prepare": cmd_prepare,
    "publish-data": cmd_publish_data,
    "train": cmd_train,
    "anneal": cmd_anneal,
    "export": cmd_export,
    "eval": cmd_eval,
    "publish": cmd_publish,
    "sample": cmd_sample,
    "verify-data": cmd_verify_data,
    "data-info": cmd_data_info,
    "config": cmd_config,
    "preflight": cmd_preflight,
}

