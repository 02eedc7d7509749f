"""The Python API: the same run as the CLI, bit for bit; the same one-line errors; the declared Python floor."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import baton
from support.helpers import assert_tensors_equal, read_metrics, store_checkpoint_tensors

ROOT = Path(__file__).resolve().parent.parent


def test_the_api_trains_the_same_weights_as_the_cli(make_config, baton_cli, tmp_path):
    cfg_path = make_config()
    baton_cli("train", "-c", str(cfg_path), "--set", "run.name=cli", "--set", "train.steps=8", "--no-progress",
              check=True)

    cfg = baton.load_config(cfg_path, {"run.name": "api", "train.steps": 8})
    summary = baton.train(cfg, progress=False)
    assert summary["steps_done"] == 8 and summary["resumed_from_step"] is None

    store = tmp_path / "store"
    model_cli, optim_cli, p_cli = store_checkpoint_tensors(store, "cli")
    model_api, optim_api, p_api = store_checkpoint_tensors(store, "api")
    assert p_cli["step"] == p_api["step"] == 8 and p_cli["complete"] and p_api["complete"]
    assert_tensors_equal(model_cli, model_api)
    assert_tensors_equal(optim_cli, optim_api)
    trace = [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(tmp_path / "runs" / "cli")]
    assert trace == [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(tmp_path / "runs" / "api")]
    assert p_cli["val_loss"] == p_api["val_loss"] == summary["val_loss"]

    st = baton.status(cfg)
    assert st["pointer_step"] == 8 and st["complete"] and all(c["verified"] for c in st["checkpoints"])
    out = baton.export(cfg, tmp_path / "exported")
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    p = baton.plan(cfg, rate=1000, session_hours="1h")
    assert p["sources"]["start_step"] == "the store's pointer" and "sessions" in p["text"]
    record = baton.eval(cfg)
    assert record["step"] == 8 and abs(record["heldout"]["loss"] - summary["val_loss"]) < 1e-4
    published = baton.publish(baton.load_config(cfg_path, {"run.name": "api", "train.steps": 8,
                                                           "publish.url": str(tmp_path / "pub")}))
    assert published["step"] == 8 and (tmp_path / "pub" / "README.md").is_file()


def test_api_errors_are_the_clis_one_line_messages(make_config, baton_cli):
    cfg_path = make_config()
    cases = [
        (lambda: baton.load_config(cfg_path, {"train.stepz": 3}), ["--set", "train.stepz=3"]),
        (lambda: baton.train(baton.load_config(cfg_path), stop_after_steps=0), ["--stop-after-steps", "0"]),
        (lambda: baton.train(baton.load_config(cfg_path), session_hours="soon"), ["--session-hours", "soon"]),
        (lambda: baton.train(baton.load_config(cfg_path), nproc=3), ["--nproc", "3"]),
    ]
    for call, flags in cases:
        with pytest.raises(baton.BatonError) as e:
            call()
        p = baton_cli("train", "-c", str(cfg_path), *flags)
        assert p.returncode == 2
        assert p.stderr.strip().splitlines()[-1] == f"baton: error: {e.value}"
        assert e.value._render_traceback_() == [f"baton: error: {e.value}"]  # what a notebook cell shows


def test_the_api_says_a_wrong_kind_of_argument_in_one_line(make_config):
    """A path where a Config belongs, a whole-step count that is not whole, one override given as a string."""
    cfg_path = make_config()
    cfg = baton.load_config(cfg_path)
    for call, message in [
        (lambda: baton.train(str(cfg_path)), "baton.train: cfg must be the Config that baton.load_config(path) "
                                             "returns, got str"),
        (lambda: baton.prepare(cfg_path), "baton.prepare: cfg must be the Config"),
        (lambda: baton.status(None), "baton.status: cfg must be the Config"),
        (lambda: baton.train(cfg, stop_after_steps=2.5), "baton.train: stop_after_steps must be int or None, got float "
                                                         "2.5"),
        (lambda: baton.train(cfg, stop_after_steps=0), "--stop-after-steps must be a positive step number, got 0"),
        (lambda: baton.train(cfg, nproc="2"), "baton.train: nproc must be int, got str '2'"),
        (lambda: baton.load_config(cfg_path, {"train.steps": object()}), "overrides: train.steps: object <object"),
        (lambda: baton.load_config(cfg_path, {"data.seq_len": {16}}), "overrides: data.seq_len: set {16} is not a "
                                                                     "config value"),
    ]:
        with pytest.raises(baton.BatonError) as e:
            call()
        assert str(e.value).startswith(message), str(e.value)
        assert "\n" not in str(e.value)
    assert baton.load_config(cfg_path, "optim.lr=0.01").optim.lr == 0.01  # not ten one-letter overrides
    # The CLI's boundary holds for the API too: folders apart, and those it writes on a disk that takes a write.
    nested = baton.load_config(cfg_path, {"store.url": str(cfg.data.dir) + "/store"})
    with pytest.raises(baton.BatonError, match="the store's folder .* lies inside the data folder"):
        baton.train(nested)
    with pytest.raises(baton.BatonError, match=r"the run folder /proc/baton-nope/test \(run.local_dir\) cannot be "):
        baton.train(baton.load_config(cfg_path, {"run.local_dir": "/proc/baton-nope"}))
    with pytest.raises(baton.BatonError, match=r"the data folder /proc/baton-nope \(data.dir\) cannot be written"):
        baton.prepare(baton.load_config(cfg_path, {"data.dir": "/proc/baton-nope"}))
    assert not (cfg_path.parent / "runs").exists(), "refused before any work"


def test_import_baton_does_not_import_torch():
    code = "import sys, baton; baton.load_config(None); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_api_names_stay_functions_after_every_submodule_is_imported():
    import importlib
    import pkgutil

    from baton import api

    modules = [m.name for m in pkgutil.walk_packages(baton.__path__, "baton.")]
    top = {name.split(".")[1] for name in modules}
    assert not top & set(baton.__all__), "a submodule would shadow an API name"
    for name in modules:
        if not name.endswith("__main__"):
            importlib.import_module(name)
    for name in ("load_config", "prepare", "publish_data", "train", "status", "plan", "export", "eval", "publish"):
        assert getattr(baton, name) is getattr(api, name)


def test_vermin_finds_nothing_newer_than_the_declared_python_floor():
    """pyproject's requires-python is >= 3.10: the package and the examples must not need anything newer."""
    vermin = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    assert vermin, "vermin is in the test extra"
    p = subprocess.run([vermin, "--no-tips", "--violations", "-t=3.10-", "baton", "examples"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    minimum = next(line for line in p.stdout.splitlines() if line.startswith("Minimum required versions:"))
    assert tuple(int(x) for x in minimum.split(":")[1].strip().split(".")) <= (3, 10), minimum


def test_a_session_run_from_python_leaves_the_process_as_it_found_it(make_config):
    """A notebook goes on after baton.train returns: its torch threads, deterministic algorithms, random
    generators, exception hooks and huggingface_hub's bars are its own again, and the run's log file is closed."""
    import logging
    import os
    import sys
    import threading

    import torch
    from huggingface_hub.utils import are_progress_bars_disabled

    import baton
    from baton.config import load_config

    cfg = load_config(make_config(), ["train.steps=2", "train.threads=1", "train.deterministic=true"])
    own_threads = torch.get_num_threads()
    torch.set_num_threads(3)  # the user's, other than the run's 1
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"), sys.excepthook, threading.excepthook,
              are_progress_bars_disabled())
    try:
        baton.train(cfg, progress=False)
        after = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                 os.environ.get("CUBLAS_WORKSPACE_CONFIG"), sys.excepthook, threading.excepthook,
                 are_progress_bars_disabled())
    finally:
        torch.set_num_threads(own_threads)
    assert after == before and after[0] == 3
    assert torch.equal(torch.rand(3), expected)  # the user's seeded draws, as if baton had not run
    assert not [h for h in logging.getLogger("baton").handlers if getattr(h, "_baton_file", False)]
