"""The boundary battery: every kind of input a person can get wrong, on every command, ends in one
`baton: error:` line naming the problem and the fix, exit status 2, no traceback, no usage block, and the
store byte-for-byte as it was.

Cases run the real ``baton.cli.main`` in this process (what the terminal shows is captured); a handful
run the real command in a fresh interpreter to prove nothing else reaches the terminal. A genuine bug is
the other outcome: exit 1, one line naming the log file that holds the traceback.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_bad_input import TRAIN, Ctx, _pointer, _rewrite_ckpt_file, _state, _truncate

from support.boundary import assert_input_error, run_in_process, tree_hash

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def crash_logs(tmp_path, monkeypatch):
    """A bug's log file goes under the test's folder, not the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class B(Ctx):
    """The case context: the base run, a scratch folder, and the exported model."""

    exported: Path

    def file(self, name: str, data: bytes | str = "x") -> str:
        p = self.tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    def folder(self, name: str, with_file: bool = False) -> str:
        p = self.tmp / name
        p.mkdir(parents=True, exist_ok=True)
        if with_file:
            (p / "something.txt").write_text("kept")
        return str(p)

    @property
    def store_dir(self) -> Path:
        return self.base / "store"

    def model(self, damage: Callable[[Path], None]) -> str:
        """A damaged copy of the exported model folder."""
        d = self.tmp / "model"
        shutil.copytree(self.exported, d)
        damage(d)
        return str(d)

    def source(self, kind: str, name: str, data: bytes) -> list[str]:
        """A config preparing a fresh data folder from one source file holding ``data``."""
        f = self.file(name, data)
        text = (self.base / "cfg.toml").read_text()
        start = text.index("[[data.sources]]")
        end = text.index("[optim]")
        cfg = self.toml(text[:start] + f'[[data.sources]]\nkind = "{kind}"\npath = "{f}"\n\n' + text[end:])
        return ["prepare", "-c", cfg, "--no-progress", "--set", f"data.dir={self.tmp / 'prepared'}"]

    def bench(self, data: bytes | str | None = None, path: str | None = None) -> list[str]:
        return ["plan", "--rate-from", path or self.file("bench.json", data or b""), "--steps", "100",
                "--tokens-per-step", "1000", "--session-hours", "2"]


def _cfg(c: B) -> list[str]:
    return ["-c", c.cfg]


FLOAT_KEYS = ["optim.lr", "optim.beta1", "optim.beta2", "optim.eps", "optim.weight_decay", "optim.grad_clip",
              "optim.muon_lr", "optim.muon_momentum", "optim.muon_weight_decay",
              "optim.decay_start", "model.rope_theta", "model.init_std", "model.norm_eps", "store.retry_seconds",
              "store.request_timeout", "budget.session_hours", "budget.margin_minutes", "budget.ckpt_minutes",
              "budget.ckpt_seconds", "budget.startup_minutes", "budget.heartbeat_minutes", "budget.bill_factor",
              "budget.quota_hours", "budget.quota_period_days", "budget.cap_hours"]
PARQUET_MAGIC = b"PAR1"
JSONL = "".join(json.dumps({"text": f"document {i}: {i * 7919 % 10007} {i ** 3}"}) + "\n" for i in range(3000)).encode()


def _cut(data: bytes) -> bytes:
    return data[: len(data) // 2]

# (id, argv builder, parts of the error line: the problem, then the fix)
CASES: list[tuple[str, Callable[[B], list[str]], tuple[str, ...]]] = [
    # ---- argparse's own errors, in the one-line form
    ("args-none", lambda c: [], ("the following arguments are required: COMMAND", "see `baton --help`")),
    ("args-command", lambda c: ["tarin"], ("invalid choice: 'tarin'", "choose from")),
    ("args-unknown-flag", lambda c: ["config", "--bogus"], ("unrecognized arguments: --bogus",
                                                            "see `baton config --help`")),
    ("args-unknown-train-flag", lambda c: ["train", *_cfg(c), "--stop-afterr-steps", "5"],
     ("unrecognized arguments: --stop-afterr-steps 5", "see `baton train --help`")),
    ("args-train-no-config", lambda c: ["train"], ("required: --config", "see `baton train --help`")),
    ("args-export-no-out", lambda c: ["export", *_cfg(c)], ("required: --out",)),
    ("args-sample-no-from", lambda c: ["sample"], ("required: --from",)),
    ("args-verify-choice", lambda c: [*TRAIN, *_cfg(c), "--verify", "most"], ("argument --verify: invalid choice",)),
    ("args-scale-choice", lambda c: ["preflight", *_cfg(c), "--out", "x", "--scale", "huge"],
     ("argument --scale: invalid choice",)),
    ("args-collisions", lambda c: ["data-info", *_cfg(c), "--collisions", "maybe"], ("invalid choice: 'maybe'",)),
    ("args-flag-no-value", lambda c: [*TRAIN, *_cfg(c), "--nproc"], ("argument --nproc: expected one argument",)),
    ("args-nproc-text", lambda c: [*TRAIN, *_cfg(c), "--nproc", "two"], ("invalid int value: 'two'",)),
    # ---- number flags
    ("flag-master-port-0", lambda c: [*TRAIN, *_cfg(c), "--master-port", "0"], ("--master-port", "between 1 and 65535")),
    ("flag-master-port-big", lambda c: [*TRAIN, *_cfg(c), "--master-port", "70000"], ("between 1 and 65535",)),
    ("flag-node-rank", lambda c: [*TRAIN, *_cfg(c), "--node-rank", "-1"], ("--node-rank: must be >= 0",)),
    ("flag-shutdown-timeout", lambda c: [*TRAIN, *_cfg(c), "--shutdown-timeout", "0"], ("--shutdown-timeout",)),
    ("flag-session-start-nan", lambda c: [*TRAIN, *_cfg(c), "--session-start", "nan"], ("not a finite number",)),
    ("flag-train-hours-nan", lambda c: [*TRAIN, *_cfg(c), "--session-hours", "nan"], ("must be a finite number",)),
    ("flag-train-hours-inf", lambda c: [*TRAIN, *_cfg(c), "--session-hours", "inf"], ("must be a finite number",)),
    ("flag-train-hours-neg", lambda c: [*TRAIN, *_cfg(c), "--session-hours", "-2"], (">= 0",)),
    ("flag-train-hours-word", lambda c: [*TRAIN, *_cfg(c), "--session-hours", "soon"], ("is not a duration",)),
    ("flag-deadline", lambda c: [*TRAIN, *_cfg(c), "--deadline", "tomorrow"], ("is not an ISO 8601 time",)),
    ("flag-micro-batch-0", lambda c: [*TRAIN, *_cfg(c), "--micro-batch", "0"], ("train.micro_batch must be > 0",)),
    ("flag-micro-batch-word", lambda c: [*TRAIN, *_cfg(c), "--micro-batch", "lots"], ("neither a number nor",)),
    ("flag-sample-tokens-0", lambda c: ["sample", "--from", str(c.exported), "--max-new-tokens", "0"],
     ("--max-new-tokens: must be >= 1, got 0",)),
    ("flag-sample-tokens-neg", lambda c: ["sample", "--from", str(c.exported), "--max-new-tokens", "-3"],
     ("must be >= 1, got -3",)),
    ("flag-sample-temp-neg", lambda c: ["sample", "--from", str(c.exported), "--temperature", "-0.5"],
     ("--temperature: must be >= 0",)),
    ("flag-sample-temp-tiny", lambda c: ["sample", "--from", str(c.exported), "--temperature", "1e-300"],
     ("--temperature 1e-300 is too small to sample with", "use 0 for greedy decoding")),
    ("flag-sample-temp-nan", lambda c: ["sample", "--from", str(c.exported), "--temperature", "nan"],
     ("not a finite number",)),
    ("flag-sample-temp-inf", lambda c: ["sample", "--from", str(c.exported), "--temperature", "inf"],
     ("not a finite number",)),
    ("flag-sample-temp-word", lambda c: ["sample", "--from", str(c.exported), "--temperature", "hot"],
     ("invalid number: 'hot'",)),
    ("flag-sample-seed-neg", lambda c: ["sample", "--from", str(c.exported), "--seed", "-1"], ("--seed",)),
    ("flag-sample-seed-huge", lambda c: ["sample", "--from", str(c.exported), "--seed", str(2**70)], ("--seed",)),
    ("flag-workers", lambda c: ["verify-data", "--dir", str(c.base / "corpus"), "--workers", "-1"],
     ("--workers: must be >= 0",)),
    ("flag-preflight-hours-0", lambda c: ["preflight", *_cfg(c), "--out", "x", "--session-hours", "0"],
     ("--session-hours: must be > 0",)),
    ("flag-preflight-hours-nan", lambda c: ["preflight", *_cfg(c), "--out", "x", "--session-hours", "nan"],
     ("not a finite number",)),
    ("flag-leg-steps", lambda c: ["preflight", *_cfg(c), "--out", str(c.tmp / "pf"), "--leg-steps", "0"],
     ("--leg-steps must be >= 1",)),
    ("flag-bench-ranks", lambda c: ["bench", *_cfg(c), "--ranks", "0"], ("--ranks: must be >= 1",)),
    ("flag-bench-steps", lambda c: ["bench", *_cfg(c), "--steps", "0"], ("--steps: must be >= 1",)),
    ("flag-bench-warmup", lambda c: ["bench", *_cfg(c), "--warmup", "-1"], ("--warmup: must be >= 0",)),
    ("flag-plan-start-step", lambda c: ["plan", "--start-step", "-4"], ("--start-step: must be >= 0",)),
    ("flag-plan-ckpt-every", lambda c: ["plan", "--ckpt-every", "-1"], ("--ckpt-every: must be >= 0",)),
    ("flag-plan-bill-nan", lambda c: ["plan", "--bill-factor", "nan"], ("not a finite number",)),
    ("flag-plan-period-0", lambda c: ["plan", "--quota-period-days", "0"], ("--quota-period-days: must be >= 0.000694444, got 0",)),
    ("flag-plan-seq-len", lambda c: ["plan", "--seq-len", "0"], ("--seq-len: must be >= 1",)),
    ("flag-plan-rate-nan", lambda c: ["plan", "--steps", "10", "--tokens-per-step", "5", "--rate", "nan"],
     ("--rate", "must be a finite number")),
    ("flag-plan-rate-inf", lambda c: ["plan", "--steps", "10", "--tokens-per-step", "5", "--rate", "inf"],
     ("--rate", "must be a finite number")),
    ("flag-plan-steps-nan", lambda c: ["plan", "--tokens-per-step", "5", "--steps", "nan"], ("--steps", "must be a finite number")),
    ("flag-plan-target-inf", lambda c: ["plan", "--target-tokens", "inf", "--tokens-per-step", "5"],
     ("--target-tokens", "must be a finite number")),
    ("flag-plan-hours-nan", lambda c: ["plan", "--steps", "10", "--tokens-per-step", "5", "--rate", "9",
                                       "--session-hours", "nan"], ("--session-hours", "must be a finite number")),
    ("flag-plan-ckpt-seconds-nan", lambda c: ["plan", "--ckpt-seconds", "nan"], ("--ckpt-seconds", "not a finite")),
    ("flag-plan-ckpt-seconds-word", lambda c: ["plan", "--ckpt-seconds", "slow"], ("invalid number: 'slow'",)),
    ("flag-ledger-run-escape", lambda c: ["ledger", *_cfg(c), "--run", "../other"], ("--run='../other'",)),
    ("flag-ledger-run-nul", lambda c: ["ledger", *_cfg(c), "--run", "a\x00b"], ("must be a plain name",)),
    ("flag-plan-margin", lambda c: ["plan", "--steps", "10", "--tokens-per-step", "5", "--rate", "9",
                                    "--session-hours", "2", "--margin", "150%"], ("between 0% and 100%",)),
    # ---- config values: non-finite floats, counts that make no sense, run names
    *[(f"config-{key}-{v}", (lambda k, v: lambda c: ["config", *_cfg(c), "--set", f"{k}={v}"])(key, v),
       (f"{key} must be a finite number",))
      for key, v in [(k, "nan") for k in FLOAT_KEYS] + [("optim.lr", "inf"), ("optim.lr", "-inf"),
                                                         ("store.retry_seconds", "inf")]],
    ("config-weight-nan", lambda c: ["config", "-c", c.toml((c.base / "cfg.toml").read_text().replace(
        'kind = "stdlib"', 'kind = "stdlib"\nweight = nan'))], ("data.sources[0].weight must be a finite number",)),
    *[(f"range-{kv}", (lambda kv: lambda c: ["config", *_cfg(c), "--set", kv])(kv), (want,)) for kv, want in [
        ("optim.beta1=1", "optim.beta1 must be in [0, 1), got 1.0"), ("optim.beta2=-0.1", "optim.beta2 must be in"),
        ("optim.eps=0", "optim.eps must be > 0"), ("optim.weight_decay=-1", "optim.weight_decay must be >= 0"),
        ("model.rope_theta=0", "model.rope_theta must be > 0"), ("model.norm_eps=-1e-5", "model.norm_eps must be > 0"),
        ("model.init_std=0", "model.init_std must be > 0"), ("optim.muon_lr=-0.02", "optim.muon_lr must be > 0"),
        ("optim.muon_momentum=1", "optim.muon_momentum must be in [0, 1), got 1.0"),
        ("optim.muon_ns_steps=0", "optim.muon_ns_steps must be in [1, 99], got 0"),
        ("optim.muon_ns_steps=100", "optim.muon_ns_steps must be in [1, 99], got 100"),
        ("optim.muon_adjust_lr=sqrt", "optim.muon_adjust_lr='sqrt' is not one of original, match_rms_adamw, "
                                      "spectral_unclamped"),
        ("optim.muon_weight_decay=-1", "optim.muon_weight_decay must be >= 0")]],
    ("config-source-max-bytes", lambda c: ["config", "-c", c.toml((c.base / "cfg.toml").read_text().replace(
        "max_bytes = 400000", "max_bytes = -1"))], ("data.sources[0].max_bytes must be >= 0, got -1",)),
    ("config-layers-0", lambda c: ["config", *_cfg(c), "--set", "model.n_layers=0"], ("model.n_layers must be > 0",)),
    ("config-keep-last-0", lambda c: ["config", *_cfg(c), "--set", "store.keep_last=0"], ("store.keep_last must be > 0",)),
    ("config-log-every-0", lambda c: ["config", *_cfg(c), "--set", "train.log_every=0"], ("train.log_every must be > 0",)),
    ("config-retries-neg", lambda c: ["config", *_cfg(c), "--set", "store.retries=-1"], ("store.retries must be in [1, 100], got -1",)),
    ("name-nul", lambda c: ["config", "-c", c.edit_toml('name = "test"', 'name = "te\\u0000st"')],
     ("run.name=", "must be a plain name")),
    ("name-long", lambda c: ["config", *_cfg(c), "--set", "run.name=" + "r" * 300], ("1-100 letters, digits",)),
    ("name-space", lambda c: ["config", *_cfg(c), "--set", 'run.name="my run"'], ("run.name='my run'",)),
    ("name-dot", lambda c: ["config", *_cfg(c), "--set", "run.name=.hidden"], ("starting with a letter or digit",)),
    ("name-dash", lambda c: ["config", *_cfg(c), "--set", "run.name=-rf"], ("starting with a letter or digit",)),
    ("name-empty", lambda c: ["config", *_cfg(c), "--set", 'run.name=""'], ("run.name=''",)),
    ("name-accent", lambda c: ["config", *_cfg(c), "--set", 'run.name="café"'], ("run.name='café'",)),
    ("name-backslash", lambda c: ["config", *_cfg(c), "--set", 'run.name="a\\\\b"'], ("must be a plain name",)),
    ("config-not-utf8", lambda c: ["config", "-c", c.file("latin1.toml", "[run]\nname = \"caf\xe9\"\n".encode("latin-1"))],
     ("latin1.toml could not be read", "save it as UTF-8 TOML text")),
    ("config-binary", lambda c: ["config", "-c", c.file("bin.toml", bytes(range(256)) * 4)], ("bin.toml",)),
    ("config-nul-bytes", lambda c: ["config", "-c", c.file("nul.toml", b"[run]\x00\x00\n")], ("is not valid TOML",)),
    ("config-folder", lambda c: ["config", "-c", c.folder("cfgdir")], ("is a folder, not a file",)),
    # ---- paths of the wrong kind
    ("kind-data-dir-file", lambda c: [*TRAIN, *_cfg(c), "--set", f"data.dir={c.file('d')}"],
     ("the data folder", "is a file, not a folder", "set data.dir to a folder")),
    ("kind-prepare-data-file", lambda c: ["prepare", *_cfg(c), "--set", f"data.dir={c.file('d')}"],
     ("is a file, not a folder",)),
    ("kind-local-dir-file", lambda c: [*TRAIN, *_cfg(c), "--set", f"run.local_dir={c.file('runs')}"],
     ("the run folder", "is a file, not a folder")),
    ("kind-run-dir-file", lambda c: [*TRAIN, *_cfg(c), "--set", f"run.local_dir={c.folder('r')}",
                                     "--set", f"run.name={Path(c.file('r/test')).name}"], ("is a file, not a folder",)),
    ("kind-store-file-train", lambda c: [*TRAIN, *_cfg(c), "--set", f"store.url={c.file('s')}"],
     ("the store's folder", "is a file, not a folder", "set store.url to a folder")),
    ("kind-store-file-ledger", lambda c: ["ledger", *_cfg(c), "--set", f"store.url={c.file('s')}"],
     ("is a file, not a folder",)),
    ("kind-store-file-status", lambda c: ["status", *_cfg(c), "--set", f"store.url={c.file('s')}"],
     ("is a file, not a folder",)),
    ("kind-store-fileurl-ledger", lambda c: ["ledger", *_cfg(c), "--set", f"store.url=file://{c.file('s')}"],
     ("is a file, not a folder",)),
    ("kind-export-out-file", lambda c: ["export", *_cfg(c), "--out", c.file("o")], ("--out", "is a file, not a folder")),
    ("kind-export-out-full", lambda c: ["export", *_cfg(c), "--out", c.folder("o", with_file=True)],
     ("already holds files", "pass --force")),
    ("kind-export-out-under-file", lambda c: ["export", *_cfg(c), "--out", c.file("o") + "/sub"], ("is a file",)),
    ("kind-preflight-out-file", lambda c: ["preflight", *_cfg(c), "--out", c.file("o")], ("is a file, not a folder",)),
    ("kind-preflight-out-full", lambda c: ["preflight", *_cfg(c), "--out", c.folder("o", with_file=True)],
     ("already holds files",)),
    ("kind-sample-from-file", lambda c: ["sample", "--from", c.file("m")], ("--from", "is a file, not a folder")),
    ("kind-sample-from-missing", lambda c: ["sample", "--from", str(c.tmp / "none")],
     ("does not exist", "run `baton export` first")),
    ("kind-verify-dir-file", lambda c: ["verify-data", "--dir", c.file("d")], ("d",)),
    ("kind-resume-file", lambda c: [*TRAIN, *_cfg(c), "--resume", c.file("ck")], ("no such checkpoint folder",)),
    ("kind-export-from-file", lambda c: ["export", *_cfg(c), "--out", str(c.tmp / "o"), "--from", c.file("ck")],
     ("no such checkpoint folder",)),
    ("kind-export-from-other-folder", lambda c: ["export", *_cfg(c), "--out", str(c.tmp / "o"), "--from",
                                                 c.folder("ck", with_file=True)],
     ("holds no state.json: not a baton checkpoint folder (give a checkpoint folder",)),
    ("kind-data-info-file", lambda c: ["data-info", *_cfg(c), "--set", f"data.dir={c.file('d')}"],
     ("is a file, not a folder",)),
    # ---- --rate-from files
    ("rate-from-missing", lambda c: c.bench(path=str(c.tmp / "none.json")), ("--rate-from", "not found")),
    ("rate-from-folder", lambda c: c.bench(path=c.folder("b")), ("is a folder, not a file",)),
    ("rate-from-not-json", lambda c: c.bench("{cells"), ("bench file", "could not be read", "rerun `baton bench`")),
    ("rate-from-no-cells", lambda c: c.bench("{}"), ("bench file", "could not be read")),
    ("rate-from-list", lambda c: c.bench("[1, 2]"), ("bench file", "could not be read")),
    ("rate-from-binary", lambda c: c.bench(b"\xff\xfe\x00\x81"), ("bench file", "could not be read")),
    ("rate-from-bad-cell", lambda c: c.bench('{"cells": [42]}'), ("bench file",)),
    ("rate-from-no-rate", lambda c: c.bench('{"cells": []}'), ("has no cell that ran within its cap",)),
    # ---- outputs in the wrong place (never into the store; not into the run's or data's folder)
    ("place-export-in-store-ckpt", lambda c: ["export", *_cfg(c), "--out",
                                              str(next((c.store_dir / "test" / "ckpt").iterdir()))],
     ("is inside the store's folder", "only the checkpoint cycle writes there")),
    ("place-export-store-root", lambda c: ["export", *_cfg(c), "--out", str(c.store_dir)], ("the store's folder",)),
    ("place-export-in-store-new", lambda c: ["export", *_cfg(c), "--out", str(c.store_dir / "export")],
     ("the store's folder",)),
    ("place-export-in-run", lambda c: ["export", *_cfg(c), "--out", str(c.base / "runs" / "test" / "mine")],
     ("is inside the run folder",)),
    ("place-export-in-data", lambda c: ["export", *_cfg(c), "--out", str(c.base / "corpus" / "model")],
     ("is inside the data folder",)),
    ("place-export-force-store", lambda c: ["export", *_cfg(c), "--force", "--out", str(c.store_dir / "test")],
     ("the store's folder",)),
    ("place-preflight-in-store", lambda c: ["preflight", *_cfg(c), "--out", str(c.store_dir / "pf")],
     ("the store's folder",)),
    ("place-bench-in-store", lambda c: ["bench", *_cfg(c), "--out", str(c.store_dir / "bench")],
     ("the store's folder",)),
    ("place-bench-in-data", lambda c: ["bench", *_cfg(c), "--out", str(c.base / "corpus" / "bench")],
     ("the data folder",)),
    ("place-data-in-store", lambda c: [*TRAIN, *_cfg(c), "--set", f"data.dir={c.store_dir / 'data'}"],
     ("the data folder", "lies inside the store's folder")),
    ("place-prepare-in-store", lambda c: ["prepare", *_cfg(c), "--set", f"data.dir={c.store_dir / 'data'}"],
     ("lies inside the store's folder",)),
    ("place-runs-in-store", lambda c: [*TRAIN, *_cfg(c), "--set", f"run.local_dir={c.store_dir}"],
     ("the run folder", "the store's folder")),
    ("place-store-in-data", lambda c: [*TRAIN, *_cfg(c), "--set", f"store.url={c.base / 'corpus' / 'store'}"],
     ("lies inside the data folder",)),
    ("place-store-is-data", lambda c: ["ledger", *_cfg(c), "--set", f"store.url={c.base / 'corpus'}"],
     ("the data folder",)),
    ("place-store-via-symlink", lambda c: ["export", *_cfg(c), "--out",
                                           str(_symlink(c.tmp / "link", c.store_dir) / "test" / "x")],
     ("the store's folder",)),
    # ---- data sources that their libraries cannot read
    ("source-gz-not-gzip", lambda c: c.source("jsonl", "a.jsonl.gz", b'{"text": "plain, not gzip"}\n'),
     ("data source gzip file", "a.jsonl.gz could not be read", "rerun `baton prepare`")),
    ("source-gz-cut", lambda c: c.source("jsonl", "a.jsonl.gz", _cut(gzip.compress(JSONL))),
     ("a.jsonl.gz could not be read",)),
    ("source-text-gz-cut", lambda c: c.source("text", "a.txt.gz", _cut(gzip.compress(JSONL))),
     ("a.txt.gz could not be read",)),
    ("source-parquet-not", lambda c: c.source("parquet", "a.parquet", b"name,text\n1,hello\n"),
     ("Parquet file", "a.parquet could not be read")),
    ("source-parquet-magic-only", lambda c: c.source("parquet", "a.parquet", PARQUET_MAGIC + b"\0" * 64 + PARQUET_MAGIC),
     ("a.parquet could not be read",)),
    ("source-jsonl-binary", lambda c: c.source("jsonl", "a.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00"),
     ("a.jsonl", "fix or remove the line")),
    ("source-dataset-not", lambda c: ["prepare", "-c", c.toml((c.base / "cfg.toml").read_text().replace(
        'kind = "stdlib"', f'kind = "hf_dataset"\npath = "{c.folder("ds", with_file=True)}"')), "--no-progress",
                                      "--set", f"data.dir={c.tmp / 'prepared'}"], ("ds",)),
    ("tokenizer-not-json", lambda c: ["prepare", *_cfg(c), "--no-progress", "--set", f"data.dir={c.tmp / 'p'}",
                                      "--set", f"data.tokenizer={c.file('tok.json', '{not json')}"],
     ("tokenizer", "tok.json could not be read", "give a tokenizer.json")),
    ("tokenizer-binary", lambda c: ["prepare", *_cfg(c), "--no-progress", "--set", f"data.tokenizer={c.file('t.json', bytes(range(256)))}",
                                    "--set", f"data.dir={c.tmp / 'p'}"], ("t.json could not be read",)),
    ("tokenizer-folder-empty", lambda c: ["prepare", *_cfg(c), "--no-progress", "--set", f"data.dir={c.tmp / 'p'}",
                                          "--set", f"data.tokenizer={c.folder('tokdir')}"], ("not found",)),
    # ---- exported model folders that transformers cannot read
    ("model-config-not-json", lambda c: ["sample", "--from", c.model(lambda d: (d / "config.json").write_text("{"))],
     ("exported model folder", "could not be read", "export the model again")),
    ("model-config-binary", lambda c: ["sample", "--from", c.model(
        lambda d: (d / "config.json").write_bytes(bytes(range(256))))], ("exported model folder",)),
    ("model-config-no-type", lambda c: ["sample", "--from", c.model(lambda d: (d / "config.json").write_text("{}"))],
     ("exported model folder",)),
    ("model-weights-cut", lambda c: ["sample", "--from", c.model(lambda d: _truncate(d / "model.safetensors"))],
     ("exported model folder", "could not be read")),
    ("model-weights-garbage", lambda c: ["sample", "--from", c.model(
        lambda d: (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{nope}  "))],
     ("exported model folder",)),
    ("model-weights-missing", lambda c: ["sample", "--from", c.model(lambda d: (d / "model.safetensors").unlink())],
     ("holds no model.safetensors",)),
    ("model-tokenizer-missing", lambda c: ["sample", "--from", c.model(_no_tokenizer)], ("exported model folder",)),
    ("model-tokenizer-not-json", lambda c: ["sample", "--from", c.model(
        lambda d: (d / "tokenizer.json").write_text("[1,"))], ("exported model folder",)),
    ("export-data-tokenizer-missing", lambda c: ["export", *_cfg(c), "--out", str(c.tmp / "o"), *c.data(
        lambda d: (d / "tokenizer.json").unlink())], ("tokenizer.json",)),
    ("manifest-shards-text", lambda c: [*TRAIN, *_cfg(c), *c.data(lambda d: _edit_manifest(d, shards="x"))],
     ("manifest.json is malformed: shards is not a list of shard records", "rerun `baton prepare`")),
    ("manifest-tokenizer-text", lambda c: ["data-info", *_cfg(c), *c.data(lambda d: _edit_manifest(d, tokenizer="x"))],
     ("manifest.json is malformed: tokenizer is not a record",)),
    ("manifest-total-text", lambda c: ["verify-data", *_cfg(c), *c.data(lambda d: _edit_manifest(d, total_tokens="9"))],
     ("manifest.json in", "is malformed: total_tokens is not a count")),
    ("store-s3-port-word", lambda c: [*TRAIN, *_cfg(c), "--set", "store.url=s3://b/p?endpoint=http://127.0.0.1:abc"],
     ("store.url's endpoint http://127.0.0.1:abc is not a valid URL", "check its brackets and its port")),
    # /proc takes no new folder, even from root (for whom every permission bit says yes)
    ("unwritable-run", lambda c: [*TRAIN, *_cfg(c), "--set", "run.local_dir=/proc/baton-nope"],
     ("the run folder /proc/baton-nope/test (run.local_dir) cannot be written", "making a folder in /proc failed")),
    ("unwritable-store", lambda c: [*TRAIN, *_cfg(c), "--set", "store.url=/proc/baton-nope"],
     ("the store's folder /proc/baton-nope (store.url) cannot be written", "set store.url to a folder on a writable")),
    ("unwritable-prepare", lambda c: ["prepare", *_cfg(c), "--set", "data.dir=/proc/baton-nope"],
     ("the data folder /proc/baton-nope (data.dir) cannot be written",)),
    ("unwritable-export", lambda c: ["export", *_cfg(c), "--out", "/proc/baton-nope"],
     ("--out /proc/baton-nope cannot be written",)),
    ("store-s3-checksum-word", lambda c: [*TRAIN, *_cfg(c), "--set", "store.url=s3://b/p?endpoint=http://h:1&checksum=maybe"],
     ("store.url checksum='maybe': use checksum=off",)),
    ("store-s3-bucket-name", lambda c: [*TRAIN, *_cfg(c), "--set", "store.url=s3://my_bucket!/p?endpoint=http://h:1"],
     ("bucket 'my_bucket!', not a valid bucket name",)),
]


# A checkpoint edited by hand with its pointer updated to match: the sha256 checks pass, the values do not.
EDITED: list[tuple[str, Callable[[B], list[str]], tuple[str, ...]]] = [
    ("state-cursor-text", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, cursor="x"))],
     ("state.json is malformed: cursor is not a table", "resume from an earlier checkpoint")),
    ("state-stats-text", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, stats="x"))],
     ("state.json is malformed: stats is not a table",)),
    ("state-step-text", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, step="2"))],
     ("state.json is malformed: step is not a count",)),
    ("state-rng-cut", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(
        r, rng={**_state(r)["rng"], "ranks": [{**_state(r)["rng"]["ranks"][0], "torch": "AAAA"}]}))],
     ("the RNG state in the checkpoint's state.json cannot be restored", "resume from an earlier checkpoint")),
    ("weights-half", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "model.safetensors", lambda k, t: t.half()))], ("model.safetensors does not fit this model", "is F16")),
    ("weights-shape", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "model.safetensors", lambda k, t: t[:3]))], ("model.safetensors does not fit this model",)),
    ("moments-shape", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: t[:3] if k.endswith("exp_avg") else t))],
     ("optimizer state", "but the parameter is", "resume from an earlier checkpoint")),
    ("moments-slot-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: None if k.endswith("q_proj.weight::exp_avg") else t))],
     ("optimizer state is incomplete",)),
    ("moments-param-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: None if ".layers.1." in k else t))],
     ("optimizer state is incomplete (nothing for parameter",)),
    # A state.json of another step (edited, or swapped in from another folder): it would resume elsewhere in the
    # data and the schedule, and push its next checkpoint as verified.
    ("state-step-ahead", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, step=_state(r)["step"] + 2))],
     ("state.json says step", "but its checkpoint is step", "resume from an earlier checkpoint")),
    ("state-total-negative", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, total_steps=-5))],
     ("state.json is malformed: total_steps is not a count",)),
    ("state-stats-window", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(
        r, stats={**_state(r)["stats"], "spike_window": ["x", None]}))],
     ("state.json is malformed: stats holds counters of the wrong type",)),
    ("state-stats-skips", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(
        r, stats={**_state(r)["stats"], "nonfinite_skips": "abc"}))],
     ("state.json is malformed: stats holds counters of the wrong type",)),
    ("state-scaler-partial", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, scaler={"scale": 1.0}))],
     ("state.json is malformed: scaler is not a GradScaler's state",)),
    ("state-scaler-nan", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_state(r, scaler={
        "scale": float("nan"), "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
        "_growth_tracker": 0}))],
     ("state.json is malformed: scaler is not a GradScaler's state",)),
    # The optimizer's moments lost, or its update count or values damaged: a resume would silently differ.
    ("moments-all-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: None))],
     ("optimizer state is empty, but the checkpoint made", "(its moments are lost)")),
    ("moments-step-negative", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: t * 0 - 5 if k.endswith("::step") else t))],
     ("::step' is -5, not a count of updates from 0 to",)),
    ("moments-step-shape", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: t.repeat(3) if k.endswith("::step") else t))],
     ("::step' is torch.float32 (3,), not a count of updates",)),
    ("moments-nan", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "optimizer.safetensors", lambda k, t: t * float("nan") if k.endswith("v_proj.weight::exp_avg_sq") else t))],
     ("holds NaN or infinite values", "resume from an earlier checkpoint")),
    ("weights-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "model.safetensors", lambda k, t: None if k.endswith("layers.1.mlp.up_proj.weight") else t))],
     ("does not fit this model (missing ['model.layers.1.mlp.up_proj.weight']", "it holds other tensors than the "
      "model it was saved from", "resume from an earlier checkpoint")),
    ("weights-nan", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _edit_tensors(
        r, "model.safetensors", lambda k, t: t * float("inf") if k.endswith("layers.0.mlp.up_proj.weight") else t))],
     ("model.safetensors holds NaN or infinite values in 'model.layers.0.mlp.up_proj.weight'",)),
]


@pytest.mark.parametrize("case", EDITED, ids=[c[0] for c in EDITED])
def test_an_edited_checkpoint_is_refused_in_one_line_and_kept(case, base, tmp_path, capsys):
    """Refused before any step, and the checkpoint and pointer stay as they are (the ledger records the
    failed session, as for every session)."""
    argv = case[1](B(base, tmp_path))
    run = tmp_path / "store" / "test"
    before = (tree_hash(run / "ckpt"), (run / "latest.json").read_bytes())
    assert_input_error(run_in_process(argv, capsys), *case[2])
    assert (tree_hash(run / "ckpt"), (run / "latest.json").read_bytes()) == before


def _edit_manifest(data: Path, **values) -> None:
    m = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**m, **values}))


def _edit_state(run: Path, **values) -> None:
    _rewrite_ckpt_file(run, "state.json", json.dumps({**_state(run), **values}).encode())


def _edit_tensors(run: Path, name: str, change: Callable) -> None:
    """Each tensor of a checkpoint file through ``change(key, tensor)`` (None drops it)."""
    from safetensors.torch import load_file, save_file

    path = run / _pointer(run)["path"] / name
    changed = {k: change(k, t) for k, t in load_file(str(path)).items()}
    save_file({k: t.contiguous() for k, t in changed.items() if t is not None}, str(path))
    _rewrite_ckpt_file(run, name, path.read_bytes())


def _symlink(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link


def _no_tokenizer(d: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (d / name).unlink(missing_ok=True)


def test_the_battery_has_over_a_hundred_cases():
    assert len(CASES) >= 100, len(CASES)
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_store_untouched(case, base, exported, tmp_path, capsys):
    name, build, expect = case
    before = tree_hash(base / "store")
    c = B(base, tmp_path)
    c.exported = exported
    argv = build(c)
    own = tree_hash(tmp_path / "store")  # a case's own copy of the store, as its damage left it
    o = run_in_process(argv, capsys)
    assert_input_error(o, *expect)
    assert tree_hash(base / "store") == before
    assert tree_hash(tmp_path / "store") == own


@pytest.mark.parametrize("name, value, what", [
    ("RANK", "abc", "a rank number"), ("LOCAL_RANK", "-1", "a rank number"), ("WORLD_SIZE", "2.0", "a process count"),
    ("LOCAL_WORLD_SIZE", "x", "a process count"),
])
def test_a_torchrun_variable_that_is_not_a_number_is_one_line(name, value, what, monkeypatch, base, capsys):
    monkeypatch.setenv(name, value)
    assert_input_error(run_in_process(["status", *_cfg(B(base, base))], capsys),
                       f"the environment variable {name}={value!r} is not {what}", "unset it")


@pytest.mark.parametrize("endpoint, expect", [
    ("http://user:sekrit-pw@127.0.0.1:1", "the Hub endpoint (HF_ENDPOINT) must not carry credentials; set HF_TOKEN"),
    ("localhost:8080", "the Hub endpoint (HF_ENDPOINT) 'localhost:8080' is not an http(s) URL"),
])
def test_a_hub_endpoint_with_credentials_or_no_scheme_is_refused(endpoint, expect, monkeypatch, base, tmp_path, capsys):
    """HF_ENDPOINT is named in every line about the store, so a password in it would be printed everywhere."""
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    o = run_in_process([*TRAIN, *_cfg(B(base, tmp_path)), "--set", "store.url=hf://owner/repo"], capsys)
    assert_input_error(o, expect)
    assert "sekrit-pw" not in o.stdout + o.stderr


@pytest.mark.parametrize("variable, endpoint", [
    ("AWS_ENDPOINT_URL", "ftp://AKIAEXAMPLEKEY:wJalrSECRETKEY@minio.internal:9000"),  # a wrong scheme besides
    ("AWS_ENDPOINT_URL_S3", "AKIAEXAMPLEKEY:wJalrSECRETKEY@minio.internal"),  # no scheme: read as one
    ("AWS_ENDPOINT_URL", "https://AKIAEXAMPLEKEY:wJalrSECRETKEY@"),  # no host
])
def test_an_s3_endpoint_with_credentials_is_refused_and_never_shown(variable, endpoint, monkeypatch, base, tmp_path,
                                                                    capsys):
    monkeypatch.setenv(variable, endpoint)
    o = run_in_process([*TRAIN, *_cfg(B(base, tmp_path)), "--set", "store.url=s3://bucket/runs"], capsys)
    assert_input_error(o, "the S3 endpoint must not carry credentials (it holds an '@'; the endpoint is not shown)")
    assert "wJalrSECRETKEY" not in o.stdout + o.stderr
    for folder in (base, tmp_path):  # the run's logs, a crash log: nothing written holds it either
        for f in folder.rglob("*"):
            assert not f.is_file() or b"wJalrSECRETKEY" not in f.read_bytes(), f


def test_a_bug_is_exit_1_with_the_log_path_and_no_traceback_on_the_terminal(monkeypatch, tmp_path, capsys):
    from baton import cli

    def broken(args):
        return {}["a key that a bug forgot"]

    monkeypatch.setitem(cli.COMMANDS, "config", broken)
    o = run_in_process(["config"], capsys)
    assert o.status == 1
    assert "Traceback" not in o.stderr
    lines = o.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("baton: internal error (a bug, not a problem with the input): "
                                                   "KeyError"), o.stderr
    log = Path(lines[0].rsplit("the traceback is in ", 1)[1])
    assert log.is_file() and log.is_relative_to(tmp_path / "cache")
    text = log.read_text()
    assert "Traceback (most recent call last):" in text and "in broken" in text and "EXIT rank=0 status=1" in text


def _terminal(args: list[str], tmp_path: Path, code: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "baton.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, expect", [
    (["trian"], "baton: error: argument COMMAND: invalid choice: 'trian'"),
    (["config", "--set", "optim.lr=nan"], "baton: error: invalid config: optim.lr must be a finite number, got nan"),
    (["ledger", "-c", "cfg.toml"], "is a file, not a folder (set store.url to a folder)"),
], ids=["argparse", "nan", "store-is-a-file"])
def test_in_a_real_terminal_one_line_and_no_traceback(argv, expect, tmp_path):
    (tmp_path / "store-file").write_text("not a folder")
    (tmp_path / "cfg.toml").write_text('[store]\nurl = "store-file"\n')
    r = _terminal(argv, tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("baton: error: ") and expect in r.stderr, r.stderr


def test_a_bug_in_a_real_terminal(tmp_path):
    r = _terminal([], tmp_path, code="import sys, baton.cli as c; c.COMMANDS['config'] = lambda a: 1 / 0; "
                                     "sys.exit(c.main(['config']))")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "ZeroDivisionError: division by zero; the traceback is in " in r.stderr
    log = Path(r.stderr.strip().rsplit("the traceback is in ", 1)[1])
    assert "Traceback (most recent call last):" in log.read_text()


def _writers() -> dict[str, bool]:
    """Every command with an output flag (and whether it takes --force), from the parser itself."""
    import argparse

    from baton.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {cmd: any(a.dest == "force" for a in p._actions) for cmd, p in sub.choices.items()
            if any(a.dest == "out" for a in p._actions)}


def _store_cfg(c: B, store: Path, url: str | None = None) -> list[str]:
    return [*_cfg(c), "--set", f"store.url={url or store}"]


# Each way a command can be told to write somewhere: an output flag (with --force where it has one), or the
# config's data and run folders; ``s`` is the store's folder, ``into`` a place inside it.
INTO_STORE: list[tuple[str, Callable[[B, Path, Path], list[str]]]] = [
    *[(f"{cmd}-out", (lambda cmd, force: lambda c, s, into: [cmd, *_store_cfg(c, s), "--out", str(into),
                                                             *(["--force"] if force else [])])(cmd, force))
      for cmd, force in _writers().items()],
    ("prepare-data-dir", lambda c, s, into: ["prepare", *_store_cfg(c, s), "--force", "--no-progress",
                                             "--set", f"data.dir={into}"]),
    ("train-local-dir", lambda c, s, into: [*TRAIN, *_store_cfg(c, s), "--set", f"run.local_dir={into}"]),
    ("train-data-dir", lambda c, s, into: [*TRAIN, *_store_cfg(c, s), "--set", f"data.dir={into}"]),
    ("export-via-file-url", lambda c, s, into: ["export", *_store_cfg(c, s, f"file://{s}"), "--out", str(into)]),
    ("publish-url", lambda c, s, into: ["publish", *_store_cfg(c, s), "--set", f"publish.url={into}"]),
    ("publish-data-url", lambda c, s, into: ["publish-data", *_store_cfg(c, s), "--set", f"data.url={into}"]),
]


@pytest.mark.parametrize("where", ["the pointer's checkpoint", "the run prefix", "the store root"])
@pytest.mark.parametrize("case", INTO_STORE, ids=[c[0] for c in INTO_STORE])
def test_no_command_writes_into_the_store(case, where, base, tmp_path, capsys):
    assert set(_writers()) == {"export", "preflight", "bench", "report", "simulate"}  # a new writer is covered by the list above
    store = tmp_path / "store"
    shutil.copytree(base / "store", store)
    pointer = json.loads((store / "test" / "latest.json").read_text())
    into = {"the pointer's checkpoint": store / "test" / pointer["path"], "the run prefix": store / "test",
            "the store root": store}[where]
    before = tree_hash(store)
    o = run_in_process(case[1](B(base, tmp_path), store, into), capsys)
    # data.url at the store's root is refused by the config's own check, which names store.url.
    assert_input_error(o, "store.url" if case[0] == "publish-data-url" else "the store's folder")
    assert tree_hash(store) == before


def test_a_failed_first_push_claims_no_pointer_and_says_what_to_do(zygote, moto, s3_bucket, make_config, tmp_path):
    """The store refuses the very first checkpoint's uploads (403 through a proxy): the error must not speak
    of a previous verified checkpoint, and must say where the local copy is and what to do next."""
    from support.store_servers import Fault, FaultyProxy

    proxy = FaultyProxy(moto.url).start()
    try:
        proxy.add(Fault("status", match=lambda method, path: method == "PUT" and "/ckpt/" in path, status=403))
        cfg = make_config(store=f"s3://{s3_bucket()}/p?endpoint={proxy.url}")
        r = zygote.run([*TRAIN, "-c", str(cfg), "--stop-after-steps", "1", "--set", "store.retries=1"],
                       tmp_path / "out")
    finally:
        proxy.stop()
    assert r.returncode == 2, r.stderr[-3000:]
    line = [x for x in r.stderr.splitlines() if x.startswith("baton: error:")][-1]
    assert "checkpoint at step 1 was not verified" in line
    assert "the store holds no verified checkpoint of this run yet (no pointer was written)" in line
    assert "previous verified" not in line
    assert f"the local copy is kept in {tmp_path / 'runs' / 'test' / 'ckpt'}" in line
    assert "then rerun the same `baton train` command" in line
    assert (tmp_path / "runs" / "test" / "ckpt" / "step-1" / "model.safetensors").is_file()
