"""Bad input: every case gets one line naming the problem and the fix, exit status 2, and no traceback.

The table covers configs, command-line flags, the data folder (manifest, shards, tokenizer) and the store
(pointer and checkpoint files), each damaged the way it happens: truncated by a full disk or a cut copy,
edited by hand, swapped for another run's. Each case runs the real `baton` command in its own process.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from baton.hashing import sha256_file


@dataclass
class Ctx:
    base: Path  # a run with a verified checkpoint at step 2: config, data, store
    tmp: Path

    @property
    def cfg(self) -> str:
        return str(self.base / "cfg.toml")

    def toml(self, text: str) -> str:
        p = self.tmp / "case.toml"
        p.write_text(text)
        return str(p)

    def edit_toml(self, old: str, new: str) -> str:
        text = (self.base / "cfg.toml").read_text()
        assert old in text, old
        return self.toml(text.replace(old, new, 1))

    def data(self, damage: Callable[[Path], None]) -> list[str]:
        """A damaged copy of the prepared data; returns the --set that points the run at it."""
        d = self.tmp / "data"
        shutil.copytree(self.base / "corpus", d)
        damage(d)
        return ["--set", f"data.dir={d}"]

    def store(self, damage: Callable[[Path], None]) -> list[str]:
        """A damaged copy of the store (run 'test', pointer at step 2); returns the --set for it."""
        s = self.tmp / "store"
        shutil.copytree(self.base / "store", s)
        damage(s / "test")
        return ["--set", f"store.url={s}"]


def _pointer(run: Path) -> dict:
    return json.loads((run / "latest.json").read_text())


def _set_pointer(run_dir: Path, **changes) -> None:
    p = _pointer(run_dir)
    p.update(changes)
    (run_dir / "latest.json").write_text(json.dumps(p))


def _rewrite_ckpt_file(run: Path, name: str, data: bytes) -> None:
    """Replace a checkpoint file and update the pointer to match, as a careless hand edit would."""
    p = _pointer(run)
    f = run / p["path"] / name
    f.write_bytes(data)
    p["files"][name] = {"size": len(data), "sha256": sha256_file(f)}
    (run / "latest.json").write_text(json.dumps(p))


def _edit(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _state(run: Path) -> dict:
    return json.loads((run / _pointer(run)["path"] / "state.json").read_text())


def _shard(d: Path) -> Path:
    return sorted(d.glob("*.bin"))[0]


def _pickle_folder(tmp: Path) -> str:
    """A model folder whose weights are a pickle file, as older tools wrote them."""
    d = tmp / "bin-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # a pickle stream: must never be opened
    return str(d)


TRAIN = ["train", "--no-progress"]

# (id, argv builder, text the error must contain: the problem, then the fix)
CASES: list[tuple[str, Callable[[Ctx], list[str]], tuple[str, ...]]] = [
    # ---- configs
    ("config-missing", lambda c: ["config", "-c", str(c.tmp / "nope.toml")],
     ("nope.toml not found", "pass --config with an existing TOML file")),
    ("config-not-toml", lambda c: ["config", "-c", c.toml("[model\nn_layers = 2\n")],
     ("is not valid TOML", "line 1")),
    ("config-unknown-key", lambda c: ["config", "-c", c.edit_toml("n_layers = 2", "layers = 2")],
     ("unknown key 'model.layers'", "valid keys in [model]:")),
    ("config-wrong-type", lambda c: ["config", "-c", c.edit_toml("steps = 20", 'steps = "twenty"')],
     ("train.steps must be int, got str 'twenty'",)),
    ("config-heads-divide", lambda c: ["config", "-c", c.edit_toml("n_heads = 4", "n_heads = 6")],
     ("model.hidden=64 is not divisible by model.n_heads=6", "pick n_heads among the divisors of hidden")),
    ("config-gqa", lambda c: ["config", "-c", c.edit_toml("n_kv_heads = 2", "n_kv_heads = 3")],
     ("model.n_heads=4 is not divisible by model.n_kv_heads=3", "GQA needs n_kv_heads to divide n_heads")),
    ("config-seq-len", lambda c: ["config", "-c", c.edit_toml("seq_len = 32", "seq_len = 128")],
     ("data.seq_len=128 exceeds model.max_seq_len=64", "raise max_seq_len")),
    ("config-precision", lambda c: ["config", "-c", c.edit_toml('precision = "fp32"', 'precision = "fp8"')],
     ("train.precision='fp8' is not one of fp32, bf16, fp16",)),
    ("config-two-horizons", lambda c: ["config", "-c", c.edit_toml("steps = 20", "steps = 20\ntarget_tokens = 1000")],
     ("set exactly one of train.steps and train.target_tokens", "set train.steps = 0 to use target_tokens")),
    ("config-no-horizon", lambda c: ["config", "-c", c.cfg, "--set", "train.steps=0"],
     ("the run has no horizon: train.steps and train.target_tokens are both 0", "set train.steps to the optimizer "
      "steps to train, or train.target_tokens to the tokens")),
    ("config-run-name", lambda c: ["config", "-c", c.edit_toml('name = "test"', 'name = "../escape"')],
     ("run.name='../escape' must be a plain name without '/'",)),
    ("config-store-scheme", lambda c: [*TRAIN, "-c", c.cfg, "--set", "store.url=ftp://host/x"],
     ("store.url ftp:// is not supported", "use a path, file://, s3:// or hf://")),
    ("config-store-credentials", lambda c: [*TRAIN, "-c", c.cfg, "--set", "store.url=s3://AKIDX:sekrit@bucket/p"],
     ("store.url must not carry credentials", "AWS_ACCESS_KEY_ID")),
    ("config-optim-name", lambda c: [*TRAIN, "-c", c.cfg, "--set", "optim.name=sgd"],
     ("optim.name='sgd' is not one of adamw, muon",)),
    ("config-muon-lr-0", lambda c: [*TRAIN, "-c", c.cfg, "--set", "optim.name=muon", "--set", "optim.muon_lr=0"],
     ("optim.muon_lr must be > 0, got 0.0",)),
    ("config-muon-lr-nan", lambda c: [*TRAIN, "-c", c.cfg, "--set", "optim.name=muon", "--set", "optim.muon_lr=nan"],
     ("optim.muon_lr must be a finite number, got nan",)),
    ("config-muon-fsdp", lambda c: [*TRAIN, "-c", c.cfg, "--set", "optim.name=muon", "--set", "train.parallel=fsdp"],
     ("optim.name='muon' does not work with train.parallel='fsdp'", "use train.parallel='ddp' with muon, or "
      "optim.name='adamw'")),
    # ---- flags
    ("flag-set-no-equals", lambda c: ["config", "-c", c.cfg, "--set", "optim.lr"],
     ("--set 'optim.lr' is not KEY=VALUE", "example: --set optim.lr=3e-4")),
    ("flag-set-unknown", lambda c: ["config", "-c", c.cfg, "--set", "optim.learning_rate=1e-3"],
     ("no such key 'learning_rate' in optim", "valid: beta1")),
    ("flag-set-without-config", lambda c: ["config", "--set", "optim.learning_rate=1e-3"],
     ("no such key 'learning_rate' in optim", "valid: beta1")),
    ("flag-set-type", lambda c: ["config", "-c", c.cfg, "--set", "train.steps=many"],
     ("train.steps must be int, got str 'many'",)),
    ("flag-stop-after", lambda c: [*TRAIN, "-c", c.cfg, "--stop-after-steps", "0"],
     ("--stop-after-steps must be a positive step number, got 0",)),
    ("flag-stop-after-int", lambda c: [*TRAIN, "-c", c.cfg, "--stop-after-steps", "x"],
     ("argument --stop-after-steps: invalid int value: 'x'",)),
    ("flag-nproc", lambda c: [*TRAIN, "-c", c.cfg, "--nproc", "0"], ("--nproc must be a whole number >= 1, got 0",)),
    ("flag-resume-path", lambda c: [*TRAIN, "-c", c.cfg, "--resume", str(c.tmp / "nowhere")],
     ("nowhere: no such checkpoint folder", "use auto, never or a folder")),
    ("flag-resume-never", lambda c: [*TRAIN, "-c", c.cfg, "--resume", "never"],
     ("already holds run 'test' at step 2", "use --resume auto to continue it, or set a new run.name")),
    ("flag-allow-change", lambda c: [*TRAIN, "-c", c.cfg, "--allow-change", "model.hidden"],
     ("model.hidden cannot change on resume", "allowable: model.rope_theta")),
    ("flag-command", lambda c: ["trian", "-c", c.cfg], ("invalid choice: 'trian'", "choose from")),
    ("flag-verify-data", lambda c: ["verify-data"], ("verify-data needs --dir or --config",)),
    # ---- data folder
    ("data-missing", lambda c: [*TRAIN, "-c", c.cfg, "--set", f"data.dir={c.tmp / 'none'}"],
     ("does not exist", "run `baton prepare --config ...` first")),
    ("manifest-not-json", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: (d / "manifest.json").write_text("{"))],
     ("manifest.json is not valid JSON", "rerun `baton prepare`")),
    ("manifest-truncated", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: _truncate(d / "manifest.json"))],
     ("manifest.json is not valid JSON", "rerun `baton prepare`")),
    ("manifest-incomplete", lambda c: [*TRAIN, "-c", c.cfg, *c.data(
        lambda d: (d / "manifest.json").write_text(json.dumps({"format": "baton-data-v1", "shards": []})))],
     ("lacks", "rerun `baton prepare`")),
    ("shard-truncated", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: _truncate(_shard(d), 0.7))],
     ("truncated or padded", "rerun `baton prepare`")),
    ("shard-header-cut", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: _truncate(_shard(d), 0.0001))],
     ("shorter than its header", "rerun `baton prepare`")),
    ("shard-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: _shard(d).unlink())],
     ("is missing", "rerun `baton prepare`")),
    ("tokenizer-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.data(lambda d: (d / "tokenizer.json").unlink())],
     ("tokenizer.json is missing", "rerun `baton prepare`")),
    ("tokenizer-replaced", lambda c: [*TRAIN, "-c", c.cfg, *c.data(
        lambda d: _edit(d / "tokenizer.json", "<|endoftext|>", "<s>"))],
     ("the tokenizer was replaced after the data was prepared", "rerun `baton prepare --force`")),
    ("prepare-tokenizer-missing", lambda c: ["prepare", "-c", c.cfg, "--no-progress", "--force",
                                             "--set", f"data.dir={c.tmp / 'new'}",
                                             "--set", f"data.tokenizer={c.tmp / 'no-tokenizer.json'}"],
     ("no-tokenizer.json",)),
    # ---- the store: pointer
    ("pointer-not-json", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: (r / "latest.json").write_text("{\"run"))],
     ("latest.json", "is not valid JSON", "restore")),
    ("pointer-truncated", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _truncate(r / "latest.json"))],
     ("latest.json", "is not valid JSON", "restore")),
    ("pointer-not-object", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: (r / "latest.json").write_text("[]"))],
     ("is not a JSON object", "restore")),
    ("pointer-incomplete", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: (r / "latest.json").write_text(json.dumps({"run": "test", "step": 2})))],
     ("lacks path, files, cursor", "restore")),
    ("pointer-other-run", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _set_pointer(r, run="other"))],
     ("belongs to run 'other', not 'test'", "restore")),
    ("pointer-bad-step", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _set_pointer(r, step=-3))],
     ("has an invalid step -3", "restore")),
    ("pointer-escapes", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: _set_pointer(r, path="ckpt/../../other/ckpt/step-2"))],
     ("outside the run's ckpt/ prefix", "restore")),
    ("pointer-absolute", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _set_pointer(r, path="/etc"))],
     ("outside the run's ckpt/ prefix", "restore")),
    ("pointer-file-name", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: _set_pointer(r, files={**_pointer(r)["files"], "../../x": {"size": 1, "sha256": "0" * 64}}))],
     ("malformed file entry '../../x'", "restore")),
    # ---- the store: checkpoint files
    ("ckpt-file-missing", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: (r / _pointer(r)["path"] / "optimizer.safetensors").unlink())],
     ("optimizer.safetensors, but it could not be downloaded", "not found",
      "restore it from a copy of the store")),
    ("ckpt-file-damaged", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: _truncate(r / _pointer(r)["path"] / "model.safetensors"))],
     ("the store's copy is damaged", "restore")),
    ("state-not-json", lambda c: [*TRAIN, "-c", c.cfg, *c.store(
        lambda r: _rewrite_ckpt_file(r, "state.json", b"{\"step\": 2,"))],
     ("state.json is not valid JSON", "resume from an earlier checkpoint")),
    ("state-no-cursor", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _rewrite_ckpt_file(
        r, "state.json", json.dumps({k: v for k, v in _state(r).items() if k != "cursor"}).encode()))],
     ("state.json lacks 'cursor'", "resume from an earlier checkpoint")),
    ("weights-truncated", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _rewrite_ckpt_file(
        r, "model.safetensors", (r / _pointer(r)["path"] / "model.safetensors").read_bytes()[:5000]))],
     ("model.safetensors could not be loaded", "resume from an earlier checkpoint")),
    ("moments-truncated", lambda c: [*TRAIN, "-c", c.cfg, *c.store(lambda r: _rewrite_ckpt_file(
        r, "optimizer.safetensors", (r / _pointer(r)["path"] / "optimizer.safetensors").read_bytes()[:5000]))],
     ("optimizer.safetensors could not be loaded", "resume from an earlier checkpoint")),
    # ---- other commands
    ("sample-from-nothing", lambda c: ["sample", "--from", str(c.tmp / "nothing")],
     ("does not exist", "run `baton export` first")),
    ("sample-pickle-weights", lambda c: ["sample", "--from", _pickle_folder(c.tmp)],
     ("holds no model.safetensors", "never from pickle (.bin) files", "export the model with `baton export`")),
    ("export-from-nothing", lambda c: ["export", "-c", c.cfg, "--out", str(c.tmp / "o"), "--from", str(c.tmp / "x")],
     ("no such checkpoint folder", "use 'store' or a folder")),
]


def test_the_table_has_thirty_cases():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_line(case, base, zygote, tmp_path):
    name, build, expect = case
    argv = build(Ctx(base, tmp_path))
    r = zygote.run(argv, tmp_path / "out", timeout=120)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr[-3000:]
    for part in expect:
        assert part in errors[0], f"{part!r} not in: {errors[0]}"
    # A failed resume never touches the run's store.
    assert _pointer(base / "store" / "test")["step"] == 2


def test_a_pointer_to_a_gone_checkpoint_folder_names_it(base, zygote, tmp_path):
    """The pointer names ckpt/step-2 and the store no longer holds that folder: the refusal says which."""
    argv = [*TRAIN, "-c", str(base / "cfg.toml"),
            *Ctx(base, tmp_path).store(lambda r: shutil.rmtree(r / _pointer(r)["path"]))]
    r = zygote.run(argv, tmp_path / "out", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "the checkpoint folder test/ckpt/step-2" in errors[0], errors


def test_a_truncated_exported_model_names_the_file(exported, zygote, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(exported, folder)
    _truncate(folder / "model.safetensors")
    r = zygote.run(["sample", "--from", str(folder)], tmp_path / "out", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(folder / "model.safetensors") in errors[0], errors
