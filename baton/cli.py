"""`baton`: one command, one subcommand per job. User errors exit 2 with one line, never a traceback."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from . import __version__
from .errors import BatonError

log = logging.getLogger("baton")


def _config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="TOML config file (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=3e-4 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Pretrain small Llama models across interruptible "
                                     "sessions; the baton is the last verified checkpoint in the store.")
    parser.add_argument("--version", action="version", version=f"baton {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare", help="tokenize the configured sources into shards and a manifest")
    _config_args(p)
    p.add_argument("--force", action="store_true", help="prepare again even when the folder matches the config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("train", help="resume from the store and train to the next stop boundary")
    _config_args(p)
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                   help="auto: continue from the store's pointer, or start at step 0 when there is none; "
                        "never: start fresh (refused when the store already holds the run); PATH: a local "
                        "checkpoint folder")
    p.add_argument("--stop-after-steps", type=int, default=None, metavar="N",
                   help="end this session at step N (checkpoint included)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="processes on this machine (launches torchrun when N > 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("export", help="write the model as a Hugging Face folder")
    _config_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--from", dest="source", default="store",
                   help="'store' (the run's latest verified checkpoint) or a local checkpoint folder")

    p = sub.add_parser("sample", help="generate text from an exported model folder")
    p.add_argument("--from", dest="source", required=True, help="an exported model folder (baton export, or "
                   "<run dir>/final)")
    p.add_argument("--prompt", default="def ", help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("verify-data", help="rehash every shard and check the manifest")
    _config_args(p, required=False)
    p.add_argument("--dir", help="data folder (default: data.dir of the config)")

    p = sub.add_parser("data-info", help="tokens, windows, horizon and margin for the config")
    _config_args(p)

    p = sub.add_parser("config", help="print the resolved config as JSON, or the reference table")
    _config_args(p, required=False)
    p.add_argument("--reference", action="store_true", help="print every key with its default and meaning")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from . import logs

    logs.setup(int(os.environ.get("RANK", 0)))
    try:
        return COMMANDS[args.command](args)
    except BatonError as e:
        print(f"baton: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("baton: interrupted", file=sys.stderr)
        return 130


def _load(args):
    from .config import load_config

    return load_config(args.config, args.overrides)


def cmd_prepare(args) -> int:
    from .data.prepare import prepare

    cfg = _load(args)
    m = prepare(cfg, force=args.force, progress=not args.no_progress)
    print(f"prepared {cfg.data.dir}: {m['total_tokens']:,} tokens in {m['n_shards']} shards, "
          f"vocab {m['tokenizer']['vocab_size']}, fingerprint {m['fingerprint']}")
    return 0


def cmd_train(args) -> int:
    cfg = _load(args)
    if args.stop_after_steps is not None and args.stop_after_steps <= 0:
        raise BatonError(f"--stop-after-steps must be a positive step number, got {args.stop_after_steps}")
    if args.nproc < 1:
        raise BatonError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc > 1 and "RANK" not in os.environ:
        return _launch_torchrun(args)
    from .train import run

    summary = run(cfg, resume=args.resume, stop_after=args.stop_after_steps, progress=not args.no_progress)
    if summary.get("val_loss") is not None and int(os.environ.get("RANK", 0)) == 0:
        print(f"final validation: loss {summary['val_loss']:.4f}, perplexity {summary['val_ppl']:.2f}")
    return 0


def _launch_torchrun(args) -> int:
    """Re-run this command under torchrun with the training *module* (never the interpreter as a script)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), "-m", "baton.train",
           "--config", args.config]
    for o in args.overrides:
        cmd += ["--set", o]
    cmd += ["--resume", args.resume]
    if args.stop_after_steps is not None:
        cmd += ["--stop-after-steps", str(args.stop_after_steps)]
    if args.no_progress:
        cmd.append("--no-progress")
    return subprocess.call(cmd)


def cmd_export(args) -> int:
    from .export import export_run

    out = export_run(_load(args), args.source, Path(args.out))
    print(f"exported to {out}")
    return 0


def cmd_sample(args) -> int:
    from .export import generate

    print(generate(Path(args.source), args.prompt, args.max_new_tokens, args.temperature, args.seed))
    return 0


def cmd_verify_data(args) -> int:
    from .data.manifest import verify_manifest

    if args.dir:
        folder = args.dir
    elif args.config:
        folder = _load(args).data.dir
    else:
        raise BatonError("verify-data needs --dir or --config")
    report = verify_manifest(folder)
    for problem in report.problems:
        print(f"MISMATCH {problem}")
    print(report.summary())
    return 0 if report.ok else 1


def cmd_data_info(args) -> int:
    from .data.reader import WindowDataset

    cfg = _load(args)
    ds = WindowDataset(cfg.data.dir, cfg.data.seq_len, cfg.data.shuffle_seed, cfg.data.val_windows)
    horizon = cfg.total_steps * cfg.tokens_per_step
    train_tokens = ds.n_train * cfg.data.seq_len
    print(f"{ds.stream.total:,} tokens -> {ds.n_windows:,} windows of {cfg.data.seq_len} "
          f"({ds.n_train:,} train, {ds.n_val:,} validation)")
    print(f"horizon {cfg.total_steps:,} steps x {cfg.tokens_per_step:,} tokens = {horizon:,} tokens "
          f"({horizon / train_tokens:.3f} epochs; margin {(train_tokens - horizon) / horizon:+.1%})")
    print(f"fingerprint {ds.fingerprint}, permutation {ds.permutation_fingerprint}")
    return 0


def cmd_config(args) -> int:
    from .config import Config, config_json, reference_table

    if args.reference:
        print("| key | type | default | meaning |\n|---|---|---|---|")
        for key, tp, default, meaning in reference_table():
            print(f"| `{key}` | {tp} | `{default}` | {meaning} |")
        return 0
    cfg = _load(args) if args.config else Config()
    print(config_json(cfg))
    return 0


COMMANDS = {
    "prepare": cmd_prepare,
    "train": cmd_train,
    "export": cmd_export,
    "sample": cmd_sample,
    "verify-data": cmd_verify_data,
    "data-info": cmd_data_info,
    "config": cmd_config,
}


if __name__ == "__main__":
    sys.exit(main())
